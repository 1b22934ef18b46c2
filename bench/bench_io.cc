// `strata bench io`: NVMe bandwidth, IOPS and latency of Strata's I/O engine, beside fio, and the
// drive's behaviour under sustained, mixed and verified load.
//
// For every row of the matrix rw x bs x qd it keeps qd requests of bs bytes in flight per path
// through the engine (bench/bench_io_workload.h), either for one pass over each path's test file
// of --size (sequential or a random permutation of the blocks) or, with --time, for that long over
// the same working set, with a line per --interval and an optional stop at steady state. It prints
// GB/s (1e9 bytes/s), IOPS, latency percentiles of one request (submit to completion) and the
// process's CPU seconds per GB. randrw draws reads and writes per request (--mix: read percent);
// "read+write" runs readers and writers at once on the two halves of each file, each with its own
// queue depth, as the offload pipeline reads ahead and writes behind, and reports them apart.
// --precondition fills the file sequentially and overwrites it randomly before a write row, so a
// drive is measured out of its fresh state; --verify stamps every block and checks every read
// (Note [Bench verify] in bench/bench_io_verify.h), then reads the whole file back.
//
// With --vs-fio it runs fio on the same file with the same parameters (direct=1,
// ioengine=io_uring, one job per path and group) alternately with Strata (A B A B, at least 3
// pairs, because this kind of disk drifts between runs: docs/MEASUREMENTS.md) and prints the
// medians, the median of the per-pair ratios and fio's latency, CPU and buffers beside Strata's.
// fio gets the row's jobs, CPUs, polling and the same page size of buffer memory (Note [Bench
// equal memory] in bench/bench_io_runs.h). The engine defaults are the ones Strata uses for
// swapping; --request-size, --write-request-size, --coalesce, --huge-pages and --fixed-buffers
// expose the choices of Note [Request size and merging] (offload/uring_engine.cc) so their effect
// can be measured, and --file-state the state of the blocks under the file (Note [Bench file
// state] in bench/bench_io_files.h), given to Strata and fio alike. --jobs, --pin, --iopoll and
// --device scale the run out (bench/bench_io_jobs.h).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/units.h"
#include "offload/io_engine.h"
#include "bench/bench_io_files.h"
#include "bench/bench_io_jobs.h"
#include "bench/bench_io_plan.h"
#include "bench/bench_io_plot.h"
#include "bench/bench_io_replay.h"
#include "bench/bench_io_tune.h"
#include "bench/bench_io_report.h"
#include "bench/bench_io_runs.h"
#include "bench/bench_io_soak.h"
#include "bench/bench_io_verify.h"
#include "bench/bench_io_workload.h"
#include "bench/bench_commands.h"

namespace strata::bench {
namespace bench_io {
namespace {

// What the bench measures the rows with, set up once.
struct BenchSetup {
  const BenchIoArgs& args;
  const BenchPlan& plan;
  std::vector<TestFile>& files;
  BenchBuffers& buffers;
  std::FILE* interval_log = nullptr;
  Placement placement;  // --pin: each job's CPU; empty cpus: unpinned
  IntervalPlot* plot = nullptr;  // --plot: gets every interval
};

double seconds_of(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

// One untimed pass of `groups` over every file (a fill, an overwrite or the final read-back).
WorkloadResult pass(JobEngines& engines, BenchSetup& s, std::span<std::byte> buf, const Row& row,
                    std::vector<Group> groups, std::vector<VerifyMap>* maps) {
  WorkloadSpec spec;
  spec.groups = std::move(groups);
  spec.bs_bytes = row.bs_bytes;
  spec.verify = maps;
  spec.verify_seed = s.plan.seed;
  spec.order_seed = s.plan.seed + 1;
  return run_workload(engines.jobs(), s.files, buf, spec);
}

// Before the timed runs: --verify and --precondition write every block sequentially (stamped
// with --verify), --precondition then overwrites them in random order; otherwise the files are
// filled once when the row needs written data (Note [Bench file state] in bench/bench_io_files.h).
void prepare(JobEngines& engines, BenchSetup& s, std::span<std::byte> buf, const Row& row, unsigned total_qd,
             std::vector<VerifyMap>* maps, bool& written, RowReport& report) {
  const BenchPlan& p = s.plan;
  const std::uint64_t blocks = p.file_bytes / row.bs_bytes;
  if (p.verify || (p.precondition && row_writes(row))) {
    const auto fill = pass(engines, s, buf, row, {Group{0, Pattern::Sequential, total_qd, 0, blocks}}, maps);
    double seconds = fill.seconds;
    if (p.precondition && row_writes(row)) {
      seconds += pass(engines, s, buf, row, {Group{0, Pattern::Random, total_qd, 0, blocks}}, maps).seconds;
      report.extra["precondition_s"] = seconds;
      spdlog::info("precondition: sequential fill and random overwrite of {} per path in {:.1f} s",
                   format_bytes(p.file_bytes), seconds);
    }
    written = true;
  } else if (!written && (!row_writes(row) || p.file_state == FileState::Written)) {
    prefill(engines.first(), s.files, buf, p.file_bytes);
    written = true;
  }
}

// --verify after the timed runs: the test hook's damage, if any, then every block read back.
void verify_at_end(JobEngines& engines, BenchSetup& s, std::span<std::byte> buf, const Row& row,
                   unsigned total_qd, std::vector<VerifyMap>& maps, RowReport& report) {
  const BenchPlan& p = s.plan;
  const std::uint64_t blocks = p.file_bytes / row.bs_bytes;
  if (!p.fault_kind.empty()) {
    const std::uint64_t block = p.fault_block == ~std::uint64_t{0} ? blocks / 2 : p.fault_block;
    inject_fault(s.files[0].fd.get(), s.files[0].path, p.fault_kind, block, row.bs_bytes, maps[0], p.seed);
  }
  const auto back = pass(engines, s, buf, row, {Group{100, Pattern::Sequential, total_qd, 0, blocks}}, &maps);
  report.extra["verified_at_end"] = back.verified_blocks;
}

// --fio-mem, or the --mem of a --fio-option (which fio reads last, so it wins).
std::string fio_mem_mode(const BenchIoArgs& a) {
  std::string mode = a.fio_mem;
  for (const auto& o : a.fio_options) {
    if (o.rfind("--mem=", 0) == 0 || o.rfind("--iomem=", 0) == 0) mode = o.substr(o.find('=') + 1);
  }
  return mode;
}

// With --vs-fio: the memory each side moves the data through (Note [Bench equal memory] in
// bench/bench_io_runs.h). Both hold one buffer of bs per request in flight.
FioMemory choose_memory(const BenchIoArgs& a, const Row& row, const std::vector<Group>& groups, unsigned jobs,
                        RowReport& report) {
  std::size_t hugetlb_bytes = 0;  // fio: one buffer of qd x bs per job, rounded up to 2 MiB pages
  for (const Group& g : groups) hugetlb_bytes += (g.qd * row.bs_bytes + 4 * MiB - 1) / (2 * MiB) * (2 * MiB);
  hugetlb_bytes *= std::size_t{jobs} * report.paths;
  FioMemory mem = choose_fio_memory(fio_mem_mode(a), report.huge, hugetlb_bytes);
  if (!mem.note.empty()) spdlog::warn("--vs-fio {} bs={}: {}", row.rw, format_bytes(row.bs_bytes), mem.note);
  report.huge = mem.strata_huge;
  std::size_t slots = 0;
  for (const Group& g : groups) slots += g.qd;
  report.extra["buffer_bytes"] = slots * row.bs_bytes * jobs * report.paths;
  report.extra["buffer_pages"] = report.huge ? "2 MiB (THP)" : "4 KiB";
  report.extra["fio_mem"] = mem.fio_mem;
  const bool fio_huge = mem.fio_mem == "shmhuge" || mem.fio_mem.rfind("mmaphuge", 0) == 0;
  report.extra["fio_pages"] = fio_huge ? "2 MiB (hugetlb)" : "4 KiB";
  report.extra["equal_memory"] = fio_huge == report.huge;
  if (!mem.note.empty()) report.extra["memory_note"] = mem.note;
  return mem;
}

// fio's jobs for the row: one per group, on the same blocks with the same queue depth, jobs,
// CPUs and memory kind.
FioJob fio_job(const BenchSetup& s, const Row& row, const std::vector<Group>& groups, const FioMemory& mem) {
  const BenchIoArgs& a = s.args;
  const BenchPlan& p = s.plan;
  FioJob job;
  job.read_percent = p.mix;
  job.time_s = seconds_of(p.time);
  job.extra_options = a.fio_options;
  std::vector<std::string> kinds = {row.rw};
  if (groups.size() == 2) kinds = {row.rw.substr(0, row.rw.find('+')), row.rw.substr(row.rw.find('+') + 1)};
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const Group& g = groups[k];
    job.parts.push_back(FioPart{kinds[k], g.qd, g.first_block * row.bs_bytes, g.blocks * row.bs_bytes});
  }
  job.jobs = p.jobs;
  const std::vector<int>& cpus = s.placement.cpus;
  for (std::size_t f = 0; f < s.files.size() && !cpus.empty(); ++f) {
    job.cpus.emplace_back(cpus.begin() + static_cast<std::ptrdiff_t>(f * p.jobs),
                          cpus.begin() + static_cast<std::ptrdiff_t>((f + 1) * p.jobs));
  }
  job.iopoll = a.iopoll;
  job.readonly = p.devices && !a.destructive;
  job.mem = mem.fio_mem;
  return job;
}

// Runs one row on a fresh engine. `written`: every test file holds written data (Note [Bench
// file state]); the row prefills the files when it needs that and clears it when a timed write
// pass may have left them partial.
RowReport run_row(BenchSetup& s, const Row& row, bool& written) {
  const BenchIoArgs& a = s.args;
  const BenchPlan& p = s.plan;
  std::vector<TestFile>& files = s.files;
  const std::vector<Group> groups = row_groups(p, a, row);
  unsigned total_qd = 0;
  for (const Group& g : groups) total_qd += g.qd;
  offload::IoEngineOptions o = p.engine_options;
  o.queue_depth = total_qd;  // per job: one file's groups
  RowReport report;
  report.row = row;
  report.paths = files.size();
  report.histogram = a.histogram;
  report.huge = s.buffers.huge_for(row);
  const FioMemory memory = a.vs_fio ? choose_memory(a, row, groups, p.jobs, report) : FioMemory{};
  const std::span<std::byte> buf = s.buffers.get(report.huge);
  JobEngines job_engines(o, files, p.jobs, s.placement.cpus, buf);
  const auto info = job_engines.first().info();
  spdlog::info("engine {} [{}], kernel requests up to {} (reads), {} (writes), buffers on {} pages", info.name,
               info.features, format_bytes(info.max_request_bytes), format_bytes(info.max_write_request_bytes),
               report.huge ? "2 MiB" : "4 KiB");
  report.engine_name = info.name;
  report.extra["engine_features"] = info.features;
  if (p.jobs > 1) report.extra["jobs"] = p.jobs;
  if (!s.placement.cpus.empty()) report.extra["pinned"] = s.placement.report;
  if (p.devices) report.extra["device"] = true;

  std::vector<VerifyMap> maps;
  if (p.verify) maps.assign(files.size(), VerifyMap(p.file_bytes / row.bs_bytes));
  std::vector<VerifyMap>* verify = p.verify ? &maps : nullptr;
  prepare(job_engines, s, buf, row, total_qd, verify, written, report);

  report.extra["file_state"] = a.file_state;
  if (row.rw == "randrw") report.extra["mix"] = p.mix;
  if (groups.size() == 2) {
    report.extra["read_qd"] = groups[0].qd;
    report.extra["write_qd"] = groups[1].qd;
  }
  if (p.time.count() > 0) report.extra["time_s"] = seconds_of(p.time);
  const nlohmann::json row_keys = {{"rw", row.rw}, {"bs", row.bs_bytes}, {"qd", row.qd}};
  IntervalPrinter printer(a.json, s.interval_log, row_keys);
  if (s.plot != nullptr) s.plot->begin_row(fmt::format("{} {} qd {}", row.rw, size_label(row.bs_bytes), row.qd));

  const int runs = a.vs_fio ? a.pairs : 1;
  const bool reallocate_each = row_writes(row) && p.file_state == FileState::Fallocated;
  for (int i = 0; i < runs; ++i) {
    if (reallocate_each) reallocate(files, p.file_bytes);
    WorkloadSpec spec;
    spec.groups = groups;
    spec.bs_bytes = row.bs_bytes;
    spec.time = p.time;
    spec.ramp = p.ramp;
    spec.interval = p.interval;
    spec.steady = p.steady;
    spec.verify = verify;
    spec.verify_seed = p.seed;
    spec.order_seed = p.seed + 1000u * static_cast<std::uint64_t>(i + 1);
    if (p.interval.count() > 0) {
      spec.on_interval = [&printer, &s](const IntervalReport& rep) {
        printer.print(rep);
        if (s.plot != nullptr) s.plot->add(rep);
      };
    }
    report.runs.push_back(run_workload(job_engines.jobs(), files, buf, spec));
    printer.finish();
    const WorkloadResult& rr = report.runs.back();
    if (p.steady) {
      report.extra["steady"] = {{"reached", rr.steady},
                                {"at_s", rr.steady_at_s},
                                {"bound", p.steady->bound_fraction},
                                {"window_s", seconds_of(p.steady_window)}};
    }
    if (a.vs_fio) {
      if (reallocate_each) reallocate(files, p.file_bytes);
      report.fio.push_back(run_fio(files, row, fio_job(s, row, groups, memory)));
      spdlog::debug("{} bs={} qd={} pair {}: strata {:.3f} GB/s, fio {:.3f} GB/s", row.rw, row.bs_bytes, row.qd, i,
                    rr.gbps(), report.fio.back().gbps);
    }
  }
  if (p.verify) verify_at_end(job_engines, s, buf, row, total_qd, maps, report);
  if (reallocate_each) written = false;  // a timed write pass may have been partial
  return report;
}

// Removes the test files however the run ends, unless --keep-file.
struct TestFilesCleanup {
  std::vector<TestFile>& files;
  bool keep;
  ~TestFilesCleanup() {
    if (keep) return;
    for (auto& f : files) {
      f.fd.reset();
      if (!f.device) ::unlink(f.path.c_str());
    }
  }
};

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// Runs every row of the flags' matrix; `each` sees each row's report as it is done.
void for_each_row(const BenchIoArgs& a, const std::function<void(const RowReport&)>& each,
                  IntervalPlot* plot = nullptr) {
  const BenchPlan plan = make_plan(a);
  std::unique_ptr<std::FILE, FileCloser> interval_log;
  if (!a.interval_log.empty()) {
    interval_log.reset(std::fopen(a.interval_log.c_str(), "w"));
    if (!interval_log) {
      throw ConfigError(fmt::format("--interval-log {}: cannot create it ({}); choose a writable path", a.interval_log,
                                    errno_text(errno)));
    }
  }
  std::vector<TestFile> files =
      plan.devices ? open_test_devices(plan.dirs, plan.file_bytes,
                                       a.destructive ? DeviceAccess::Destructive : DeviceAccess::ReadOnly)
                   : open_test_files(plan.dirs, plan.file_bytes);
  TestFilesCleanup cleanup{files, a.keep_file};
  BenchBuffers buffers(plan.buffer_bytes, plan.huge_always);
  BenchSetup setup{a, plan, files, buffers, interval_log.get(), {}, plot};
  if (plan.pin) {
    setup.placement = place_jobs(files, plan.jobs);
    for (const auto& job : setup.placement.report) {
      spdlog::info("job {} of {}: CPU {} (core {}), drive near {}{}", job["job"].get<unsigned>(),
                   job["path"].get<std::string>(), job["cpu"].get<int>(), job["core"].get<unsigned>(),
                   job["near"].get<std::string>(), job["shared_core"].get<bool>() ? ", core shared: more jobs than cores" : "");
    }
  }

  // Every test file holds written data (Note [Bench file state] in bench/bench_io_files.h); a device holds what it
  // holds.
  bool written = plan.devices;
  for (const Row& row : plan.rows) each(run_row(setup, row, written));
}

}  // namespace

std::vector<RowReport> measure_rows(const BenchIoArgs& a) {
  std::vector<RowReport> out;
  for_each_row(a, [&](const RowReport& r) { out.push_back(r); });
  return out;
}

int run_bench_io(const BenchIoArgs& a) {
  IntervalPlot plot;
  if (!a.plot.empty()) {
    if (a.time.empty() && a.interval.empty()) {
      throw ConfigError(fmt::format("--plot {}: it draws bandwidth and latency over time; add --time (e.g. --time 10s) "
                                    "or --interval, or --tune for the heat maps",
                                    a.plot));
    }
    check_plot_output(a.plot);
  }
  bool header = false;
  for_each_row(
      a,
      [&](const RowReport& r) {
        if (!a.json && !header) print_table_header(a.vs_fio);
        header = true;
        print_row(r, a.json);
      },
      a.plot.empty() ? nullptr : &plot);
  if (!a.plot.empty()) {
    if (plot.empty()) throw Error(fmt::format("--plot {}: no interval completed, so there is nothing to draw", a.plot));
    plot.draw(a.plot);
    if (!a.json) std::printf("plot drawn to %s\n", a.plot.c_str());
  }
  return 0;
}
}  // namespace bench_io

}  // namespace strata::bench
