// `strata bench io`: NVMe bandwidth, IOPS and latency of Strata's I/O engine, beside fio.
//
// For every row of the matrix rw x bs x qd it streams --size bytes of each path's test file
// through the engine with qd requests of bs bytes in flight per path (sequential or a random
// permutation of the blocks), and prints GB/s (1e9 bytes/s), IOPS and the p50/p99 latency of one
// request (submit to completion). With --vs-fio it runs fio on the same file with the same
// parameters (direct=1, ioengine=io_uring, one job per path) alternately with Strata (A B A B, at
// least 3 pairs, because this kind of disk drifts between runs: docs/MEASUREMENTS.md) and prints
// the medians and the median of the per-pair ratios. The engine defaults are the ones Strata uses
// for swapping; --request-size, --write-request-size, --coalesce, --huge-pages and --fixed-buffers
// expose the choices of Note [Request size and merging] (offload/uring_engine.cc) so their effect
// can be measured, and --file-state the state of the blocks under the file (Note [Bench file
// state]), given to Strata and fio alike. Strata's buffers are 2 MiB huge pages (as BufferPool's;
// 4 KiB pages for small random writes, Note [Bench buffers]) and fio's are its default malloc'd
// memory, which on a disk like the one of that Note is most of the difference; --fio-option
// passes extra options to every fio job (e.g. --mem=shmhuge, with hugetlb pages reserved in
// /proc/sys/vm/nr_hugepages) to measure fio with huge pages too.
#include <fcntl.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/file_io.h"
#include "core/host_buffer.h"
#include "core/units.h"
#include "offload/file.h"
#include "offload/io_engine.h"
#include "tools/bench_io_runs.h"
#include "tools/commands.h"

namespace strata::tools {
namespace {

using offload::IoOp;
using bench_io::Row;
using bench_io::RunResult;
using bench_io::TestFile;
using bench_io::run_fio;
using bench_io::run_strata;

struct BenchIoArgs {
  std::string dir;
  std::string paths;
  std::string size = "4G";
  std::string bs = "1M";
  std::string qd = "32";
  std::string rw = "read";
  std::string engine = "auto";
  std::string request_size = "auto";
  std::string write_request_size = "auto";
  std::string coalesce = "on";
  std::string huge_pages = "auto";
  std::string fixed_buffers = "on";
  std::string file_state = "written";
  std::vector<std::string> fio_options;
  unsigned batch = 1;
  bool sqpoll = false;
  bool vs_fio = false;
  bool json = false;
  bool keep_file = false;
  int pairs = 3;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool parse_on_off(const std::string& text, const char* flag) {
  if (text == "on" || text == "1" || text == "true") return true;
  if (text == "off" || text == "0" || text == "false") return false;
  throw ConfigError(fmt::format("{} '{}': use on or off", flag, text));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Note [Bench file state]
// What a write costs on this kind of disk depends on the state of the blocks under the file, not
// only on the engine: blocks that were freed and discarded (ext4 mounted with `discard` passes the
// discard to the host, which drops its backing storage) must be allocated again by the host on
// the first write. On the virtio disk of Note [Request size and merging], writes into written
// blocks and into blocks turned back into ext4 unwritten extents over host-allocated storage
// (FALLOC_FL_ZERO_RANGE) ran at the same speed, writes into fresh fallocated blocks after a hole
// punch (host allocation) ~20 % slower (docs/MEASUREMENTS.md, "Bench file state"). A freshly
// preallocated test file therefore handicaps whichever tool writes it first (Strata, in A B A B
// order). --file-state written (the default) writes every test file once in full before the first
// timed run, so Strata and fio both see written blocks; --file-state fallocated punches the file
// back to fresh preallocated blocks before every timed write run of both tools, to measure the
// first-write case fairly. Reads always need written data (reads of unwritten extents return zeros
// without touching the disk).
enum class FileState : std::uint8_t { Written, Fallocated };

FileState parse_file_state(const std::string& text) {
  if (text == "written") return FileState::Written;
  if (text == "fallocated") return FileState::Fallocated;
  throw ConfigError(fmt::format("--file-state '{}': use written or fallocated", text));
}

// Writes every test file once in full (Note [Bench file state]).
void prefill(offload::IoEngine& engine, std::vector<TestFile>& files, std::span<std::byte> buffer,
             std::uint64_t file_bytes) {
  const std::size_t chunk = std::min<std::size_t>(buffer.size(), 64 * MiB);
  for (auto& f : files) {
    for (std::uint64_t off = 0; off < file_bytes; off += chunk) {
      offload::IoRequest r{IoOp::Write, f.id, off, buffer.data(), static_cast<std::size_t>(std::min<std::uint64_t>(chunk, file_bytes - off))};
      engine.run(std::span(&r, 1));
    }
  }
}

// Frees every block of the test files and preallocates fresh ones (Note [Bench file state]).
void reallocate(const std::vector<TestFile>& files, std::uint64_t file_bytes) {
  for (const auto& f : files) {
    const auto len = static_cast<off_t>(file_bytes);
    if (::fallocate(f.fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, len) != 0) {
      throw IoError(fmt::format("--file-state fallocated: cannot punch a hole in {}: {}; use --file-state written",
                                f.path, errno_text(errno)),
                    errno);
    }
    offload::preallocate(f.fd.get(), f.path, file_bytes);
    fsync_file(f.fd.get(), f.path);
  }
}

// The rows of the matrix --rw x --bs x --qd, and the largest block and queue depth among them.
struct Matrix {
  std::vector<Row> rows;
  unsigned max_qd = 0;
  std::size_t max_bs = 0;
};

Matrix parse_matrix(const BenchIoArgs& a, std::uint64_t file_bytes) {
  Matrix m;
  for (const auto& rw : split_list(a.rw)) {
    if (rw != "read" && rw != "write" && rw != "randread" && rw != "randwrite") {
      throw ConfigError(fmt::format("--rw '{}': use read, write, randread or randwrite (comma-separated)", rw));
    }
    for (const auto& bs : split_list(a.bs)) {
      const std::size_t bs_bytes = parse_bytes_or_throw(bs, "--bs");
      if (bs_bytes % 4096 != 0 || bs_bytes == 0 || bs_bytes > file_bytes) {
        throw ConfigError(fmt::format("--bs {}: use a multiple of 4 KiB no larger than each file ({})", bs,
                                      format_bytes(file_bytes)));
      }
      for (const auto& qd : split_list(a.qd)) {
        int q = 0;
        const char* last = qd.data() + qd.size();
        const auto [end, ec] = std::from_chars(qd.data(), last, q);
        if (ec != std::errc() || end != last || q < 1 || q > 1024) {
          throw ConfigError(fmt::format("--qd '{}': use whole numbers 1..1024, comma-separated without spaces", qd));
        }
        m.rows.push_back(Row{rw, bs_bytes, static_cast<unsigned>(q)});
        m.max_qd = std::max(m.max_qd, static_cast<unsigned>(q));
        m.max_bs = std::max(m.max_bs, bs_bytes);
      }
    }
  }
  return m;
}

// The I/O engine's options from the flags (the queue depth is set per row).
offload::IoEngineOptions engine_options(const BenchIoArgs& a) {
  offload::IoEngineOptions eo;
  eo.kind = offload::parse_engine_kind(a.engine, "--engine");
  eo.coalesce = parse_on_off(a.coalesce, "--coalesce") ? offload::Coalesce::On : offload::Coalesce::Off;
  eo.fixed_buffers =
      parse_on_off(a.fixed_buffers, "--fixed-buffers") ? offload::FixedBuffers::On : offload::FixedBuffers::Off;
  eo.sqpoll = a.sqpoll ? offload::SqPoll::On : offload::SqPoll::Off;
  eo.submit_batch = a.batch;
  // "auto": the engine's defaults (Note [Request size and merging]), as Strata swaps with them.
  eo.max_request_bytes = a.request_size == "auto" ? 0 : parse_bytes_or_throw(a.request_size, "--request-size");
  eo.max_write_request_bytes =
      a.write_request_size == "auto" ? 0 : parse_bytes_or_throw(a.write_request_size, "--write-request-size");
  return eo;
}

// One preallocated O_DIRECT test file of file_bytes in each directory, after checking that the
// directory supports O_DIRECT and has the room.
std::vector<TestFile> open_test_files(const std::vector<std::string>& dirs, std::uint64_t file_bytes) {
  std::vector<TestFile> files;
  for (const auto& d : dirs) {
    TestFile f;
    f.dir = offload::check_directory(d, "--dir");
    if (auto why = offload::probe_direct_io(f.dir); !why.empty()) {
      throw ConfigError(fmt::format("{} does not support O_DIRECT ({}); choose a directory on a real drive", f.dir, why));
    }
    const std::uint64_t have = offload::free_bytes(f.dir);
    if (have < file_bytes) {
      throw ConfigError(fmt::format("{} has {} free but the benchmark needs {}; lower --size", f.dir,
                                    format_bytes(have), format_bytes(file_bytes)));
    }
    f.path = offload::path_inside(f.dir, "strata-bench-io.dat");
    f.fd = offload::open_inside(f.dir, "strata-bench-io.dat", offload::Direct::On, offload::Truncate::Keep);
    offload::preallocate(f.fd.get(), f.path, file_bytes);
    files.push_back(std::move(f));
  }
  return files;
}

// Note [Bench buffers]: the I/O buffers are one region on 2 MiB huge pages, as BufferPool's
// (Note [Request size and merging] in offload/uring_engine.cc: a request over a huge page is one
// segment), except for random writes of blocks of 16 KiB or less under --huge-pages auto, which
// use 4 KiB pages: on the disk of that Note those ran faster from 4 KiB pages, while random reads
// of 16 KiB, random writes of 64 KiB and every sequential row (whose requests coalesce across
// pages) ran faster from the huge page (docs/MEASUREMENTS.md, "Bench buffers"). Why small random
// writes prefer 4 KiB pages we do not know: the buffers are registered (fixed), so the kernel
// does not pin pages per request. `huge_pages` in the JSON rows says which backing was asked for
// (THP through madvise; the kernel may decline).
class BenchBuffers {
 public:
  // huge_always: --huge-pages on or off for every row; nullopt for auto.
  BenchBuffers(std::size_t buffer_bytes, std::optional<bool> huge_always)
      : buffer_bytes_(buffer_bytes), huge_always_(huge_always) {}

  bool huge_for(const Row& row) const {
    return huge_always_.value_or(!(row.rw == "randwrite" && row.bs_bytes <= 16 * KiB));
  }

  // The buffer on huge or 4 KiB pages, allocated when a row first needs it.
  std::span<std::byte> get(bool huge) {
    HostBuffer& b = buffers_[huge ? 1 : 0];
    if (b.size_bytes() == 0) {
      HostBufferOptions bo;
      bo.huge_pages = huge ? HugePages::Transparent : HugePages::Off;
      bo.alignment_bytes = huge ? 2 * MiB : 4096;
      b = HostBuffer::allocate(buffer_bytes_, bo);
      std::memset(b.data(), 0x5C, b.size_bytes());  // fault every page in before timing
    }
    return std::span<std::byte>(static_cast<std::byte*>(b.data()), b.size_bytes());
  }

 private:
  std::size_t buffer_bytes_;
  std::optional<bool> huge_always_;
  HostBuffer buffers_[2];  // [0]: 4 KiB pages, [1]: huge pages
};

// What the bench measures the rows with, set up once.
struct BenchSetup {
  const BenchIoArgs& args;
  offload::IoEngineOptions engine_options;
  std::vector<TestFile>& files;
  BenchBuffers& buffers;
  FileState file_state;
  std::uint64_t file_bytes;
};

// One row's timed runs: Strata's and, with --vs-fio, fio's alternating with them.
struct RowRuns {
  std::string engine_name;
  bool huge = false;
  int runs = 0;
  std::vector<double> gbps, fio_gbps, ratios, iops, p50, p99;
};

// Runs one row on a fresh engine. `written`: every test file holds written data (Note [Bench
// file state]); the row prefills the files when it needs that and clears it when a timed write
// pass may have left them partial.
RowRuns run_row(BenchSetup& s, const Row& row, bool& written) {
  const BenchIoArgs& a = s.args;
  std::vector<TestFile>& files = s.files;
  offload::IoEngineOptions o = s.engine_options;
  o.queue_depth = row.qd * static_cast<unsigned>(files.size());
  auto engine = offload::make_io_engine(o);
  for (auto& f : files) f.id = engine->register_file(f.fd.get(), f.path);
  RowRuns r;
  r.huge = s.buffers.huge_for(row);
  const std::span<std::byte> buf = s.buffers.get(r.huge);
  const std::span<std::byte> spans[] = {buf};
  engine->register_buffers(spans);
  const bool write_row = row.rw.find("write") != std::string::npos;
  if (!written && (!write_row || s.file_state == FileState::Written)) {
    prefill(*engine, files, buf, s.file_bytes);
    written = true;
  }
  const auto info = engine->info();
  spdlog::info("engine {} [{}], kernel requests up to {} (reads), {} (writes), buffers on {} pages", info.name,
               info.features, format_bytes(info.max_request_bytes), format_bytes(info.max_write_request_bytes),
               r.huge ? "2 MiB" : "4 KiB");
  r.engine_name = info.name;

  r.runs = a.vs_fio ? a.pairs : 1;
  const bool reallocate_each = write_row && s.file_state == FileState::Fallocated;
  for (int i = 0; i < r.runs; ++i) {
    if (reallocate_each) reallocate(files, s.file_bytes);
    const RunResult rr = run_strata(*engine, files, buf, row, s.file_bytes, 1234u + static_cast<std::uint32_t>(i));
    r.gbps.push_back(rr.gbps);
    r.iops.push_back(rr.iops);
    r.p50.push_back(rr.p50_us);
    r.p99.push_back(rr.p99_us);
    if (a.vs_fio) {
      if (reallocate_each) reallocate(files, s.file_bytes);
      const double f = run_fio(files, row, s.file_bytes, a.fio_options);
      r.fio_gbps.push_back(f);
      r.ratios.push_back(f > 0 ? rr.gbps / f : 0);
      spdlog::debug("{} bs={} qd={} pair {}: strata {:.3f} GB/s, fio {:.3f} GB/s", row.rw, row.bs_bytes, row.qd, i,
                    rr.gbps, f);
    }
  }
  for (auto& f : files) engine->unregister_file(f.id);
  engine.reset();
  if (reallocate_each) written = false;  // a timed write pass may have been partial
  return r;
}

// The table's header (without --json).
void print_header(const BenchIoArgs& a) {
  fmt::print("{:>9} {:>8} {:>4} {:>5} {:>8} {:>9} {:>9} {:>9}{}\n", "rw", "bs", "qd", "paths", "GB/s", "IOPS",
             "p50_us", "p99_us", a.vs_fio ? fmt::format(" {:>9} {:>7}", "fio_GB/s", "ratio") : "");
}

// One row's medians: a JSON object with --json, else a line of the table.
void print_row(const BenchIoArgs& a, const Row& row, std::size_t paths, const RowRuns& r) {
  if (a.json) {
    nlohmann::json j = {{"rw", row.rw},
                        {"bs", row.bs_bytes},
                        {"qd", row.qd},
                        {"paths", paths},
                        {"gbps", median(r.gbps)},
                        {"iops", median(r.iops)},
                        {"p50_us", median(r.p50)},
                        {"p99_us", median(r.p99)},
                        {"engine", r.engine_name},
                        {"huge_pages", r.huge},
                        {"file_state", a.file_state}};
    if (a.vs_fio) {
      j["fio_gbps"] = median(r.fio_gbps);
      j["ratio"] = median(r.ratios);
      j["pairs"] = r.runs;
      j["strata_runs_gbps"] = r.gbps;
      j["fio_runs_gbps"] = r.fio_gbps;
    }
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("{:>9} {:>8} {:>4} {:>5} {:>8.3f} {:>9.0f} {:>9.0f} {:>9.0f}{}\n", row.rw, format_bytes(row.bs_bytes),
               row.qd, paths, median(r.gbps), median(r.iops), median(r.p50), median(r.p99),
               a.vs_fio ? fmt::format(" {:>9.3f} {:>6.2f}x", median(r.fio_gbps), median(r.ratios)) : "");
  }
  std::fflush(stdout);
}

int run_bench_io(const BenchIoArgs& a) {
  std::vector<std::string> dirs = split_list(a.paths);
  if (dirs.empty()) {
    if (a.dir.empty()) throw ConfigError("strata bench io: give --dir DIR (or --paths D1,D2)");
    dirs.push_back(a.dir);
  }
  const std::uint64_t total_bytes = parse_bytes_or_throw(a.size, "--size");
  const std::uint64_t file_bytes = total_bytes / dirs.size() / (4 * MiB) * (4 * MiB);
  const Matrix matrix = parse_matrix(a, file_bytes);
  if (matrix.rows.empty()) throw ConfigError("strata bench io: the matrix is empty (check --rw, --bs, --qd)");
  if (a.vs_fio && a.pairs < 3) throw ConfigError("--pairs: at least 3 alternating pairs are needed for a median");

  const FileState file_state = parse_file_state(a.file_state);
  // --huge-pages: nothing for auto (Note [Bench buffers]), else on or off for every row.
  std::optional<bool> huge_always;
  if (a.huge_pages != "auto") huge_always = parse_on_off(a.huge_pages, "--huge-pages (or auto)");
  const offload::IoEngineOptions eo = engine_options(a);
  std::vector<TestFile> files = open_test_files(dirs, file_bytes);
  BenchBuffers buffers(std::max<std::size_t>(matrix.max_qd * matrix.max_bs * files.size(), 64 * MiB), huge_always);
  BenchSetup setup{a, eo, files, buffers, file_state, file_bytes};

  bool written = false;  // every test file holds written data (Note [Bench file state])
  if (!a.json) print_header(a);
  for (const Row& row : matrix.rows) {
    const RowRuns runs = run_row(setup, row, written);
    print_row(a, row, files.size(), runs);
  }
  if (!a.keep_file) {
    for (auto& f : files) {
      f.fd.reset();
      ::unlink(f.path.c_str());
    }
  }
  return 0;
}

}  // namespace

void register_bench_io(CLI::App& bench, CommandTable& table) {
  auto args = std::make_shared<BenchIoArgs>();
  auto* cmd = bench.add_subcommand("io", "NVMe bandwidth/IOPS/latency of Strata's I/O engine (optionally beside fio)");
  cmd->add_option("--dir", args->dir, "directory for the test file (on the drive to measure)");
  cmd->add_option("--paths", args->paths, "comma-separated directories, one test file and stream each (one per drive)");
  cmd->add_option("--size", args->size, "bytes streamed per run, split over the paths (e.g. 1G, 4G)")->capture_default_str();
  cmd->add_option("--bs", args->bs, "block size per request; a comma list makes a matrix (4K,64K,1M)")->capture_default_str();
  cmd->add_option("--qd", args->qd, "requests in flight per path; comma list (1,8,32)")->capture_default_str();
  cmd->add_option("--rw", args->rw, "read, write, randread, randwrite; comma list")->capture_default_str();
  cmd->add_flag("--vs-fio", args->vs_fio, "alternate with fio on the same file and print the median ratio");
  cmd->add_option("--pairs", args->pairs, "Strata/fio pairs per row with --vs-fio (>= 3)")->capture_default_str();
  cmd->add_flag("--json", args->json, "one JSON object per row");
  cmd->add_option("--engine", args->engine, "auto, uring or threads")->capture_default_str();
  cmd->add_option("--request-size", args->request_size,
                  fmt::format("largest kernel read (auto: the engine default, {})",
                              format_bytes(offload::kDefaultMaxReadRequestBytes)))
      ->capture_default_str();
  cmd->add_option("--write-request-size", args->write_request_size,
                  fmt::format("largest kernel write (auto: the engine default, {} or --request-size if smaller)",
                              format_bytes(offload::kDefaultMaxWriteRequestBytes)))
      ->capture_default_str();
  cmd->add_option("--coalesce", args->coalesce, "merge adjacent requests into one kernel request (on|off)")
      ->capture_default_str();
  cmd->add_option("--huge-pages", args->huge_pages,
                  "back the I/O buffers with 2 MiB huge pages (on|off|auto: on except for random writes of blocks "
                  "<= 16 KiB)")
      ->capture_default_str();
  cmd->add_option("--fixed-buffers", args->fixed_buffers, "register the buffers with io_uring (on|off)")
      ->capture_default_str();
  cmd->add_option("--batch", args->batch, "most requests per io_uring_enter (0: the queue depth)")->capture_default_str();
  cmd->add_option("--file-state", args->file_state,
                  "blocks under the test file at each timed write run, for Strata and fio alike: written (filled once "
                  "before the first row) or fallocated (fresh preallocated blocks before every write run)")
      ->capture_default_str();
  cmd->add_flag("--sqpoll", args->sqpoll, "use a kernel submission-polling thread");
  cmd->add_option("--fio-option", args->fio_options,
                  "extra option for every fio job with --vs-fio, e.g. --fio-option=--mem=shmhuge (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag("--keep-file", args->keep_file, "keep the test file(s) afterwards");
  table[cmd] = [args]() -> int { return run_bench_io(*args); };
}

}  // namespace strata::tools
