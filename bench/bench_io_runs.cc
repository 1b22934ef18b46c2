// A `strata bench io` row through fio (see bench/bench_io_runs.h).
#include "bench/bench_io_runs.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"

namespace strata::bench::bench_io {
namespace {

// Free hugetlb memory of the default huge page size (/proc/meminfo).
std::size_t free_hugetlb_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::size_t value = 0, free_pages = 0, page_kib = 0;
  while (in >> key >> value) {
    if (key == "HugePages_Free:") free_pages = value;
    if (key == "Hugepagesize:") page_kib = value;
    in.ignore(256, '\n');
  }
  return free_pages * page_kib * 1024;
}

// fio's {"percentile": {"50.000000": ns, ...}, "max": ns, "mean": ns} in the bench's keys, in us.
nlohmann::json fio_percentiles(const nlohmann::json& lat) {
  const auto& pct = lat.at("percentile");
  return {{"p50_us", pct.at("50.000000").get<double>() / 1e3},
          {"p99_us", pct.at("99.000000").get<double>() / 1e3},
          {"p99_9_us", pct.at("99.900000").get<double>() / 1e3},
          {"max_us", lat.at("max").get<double>() / 1e3},
          {"mean_us", lat.at("mean").get<double>() / 1e3}};
}

}  // namespace

FioMemory choose_fio_memory(const std::string& mode, bool huge, std::size_t hugetlb_bytes) {
  if (mode != "same") return FioMemory{mode, huge, (mode == "shmhuge" || mode.rfind("mmaphuge", 0) == 0) == huge, ""};
  if (!huge) return FioMemory{"malloc", false, true, ""};
  const std::size_t have = free_hugetlb_bytes();
  if (have >= hugetlb_bytes) return FioMemory{"shmhuge", true, true, ""};
  return FioMemory{"malloc", false, true,
                   fmt::format("fio needs {} of hugetlb pages for huge-page buffers and {} are free, so both sides use "
                               "4 KiB pages; reserve them (echo {} > /proc/sys/vm/nr_hugepages) to compare on huge "
                               "pages",
                               format_bytes(hugetlb_bytes), format_bytes(have), hugetlb_bytes / (2 * MiB) + 8)};
}

namespace {

// fio's command line for one row: a job per file and part, as Strata runs them.
std::vector<std::string> fio_command(const std::vector<TestFile>& files, const Row& row, const FioJob& job) {
  const auto& extra_options = job.extra_options;
  std::vector<std::string> args = {"fio", "--output-format=json", "--group_reporting"};
  for (std::size_t i = 0; i < files.size(); ++i) {
    for (std::size_t k = 0; k < job.parts.size(); ++k) {
      const FioPart& part = job.parts[k];
      args.push_back(fmt::format("--name=strata{}.{}", i, k));
      args.push_back("--filename=" + files[i].path);
      // numjobs on consecutive slices of the part, as Strata's jobs (job_share); the last job of
      // an uneven split may be a few blocks short of Strata's.
      const std::uint64_t slice = part.bytes / job.jobs / row.bs_bytes * row.bs_bytes;
      args.push_back(fmt::format("--offset={}", part.offset_bytes));
      args.push_back(fmt::format("--size={}", job.jobs > 1 ? slice : part.bytes));
      if (job.jobs > 1) {
        args.push_back(fmt::format("--numjobs={}", job.jobs));
        args.push_back(fmt::format("--offset_increment={}", slice));
      }
      if (i < job.cpus.size() && !job.cpus[i].empty()) {
        args.push_back(fmt::format("--cpus_allowed={}", fmt::join(job.cpus[i], ",")));
        args.push_back("--cpus_allowed_policy=split");
      }
      if (job.iopoll) args.push_back("--hipri");
      if (job.readonly) args.push_back("--readonly");
      args.push_back("--mem=" + job.mem);
      args.push_back(fmt::format("--bs={}", row.bs_bytes));
      args.push_back(fmt::format("--iodepth={}", part.qd));
      args.push_back("--rw=" + part.rw);
      args.push_back("--direct=1");
      args.push_back("--ioengine=io_uring");
      args.push_back("--lat_percentiles=1");
      args.push_back("--slat_percentiles=1");
      args.push_back("--clat_percentiles=1");
      args.push_back("--percentile_list=50:99:99.9");
      if (part.rw == "randrw") args.push_back(fmt::format("--rwmixread={}", job.read_percent));
      if (job.time_s > 0) {
        args.push_back("--time_based");
        args.push_back(fmt::format("--runtime={}s", job.time_s));
        args.push_back("--norandommap");  // as Strata's timed runs: blocks drawn uniformly
      }
      for (const auto& o : extra_options) args.push_back(o);
    }
  }
  return args;
}

// Runs fio and returns what it printed on stdout; a failed run throws naming the row.
std::string run_fio_process(std::vector<std::string> args, const Row& row, bool extra_options) {
  int pipefd[2];
  STRATA_CHECK_ERRNO(::pipe(pipefd));
  const pid_t pid = ::fork();
  STRATA_CHECK_ERRNO(pid);
  if (pid == 0) {
    ::dup2(pipefd[1], STDOUT_FILENO);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp("fio", argv.data());
    _exit(127);
  }
  ::close(pipefd[1]);
  std::string out;
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::read(pipefd[0], chunk, sizeof chunk);
    if (n > 0) out.append(chunk, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw Error(fmt::format("fio failed (exit {}) for rw={} bs={} qd={}{}; is fio installed and io_uring allowed? "
                            "Run without --vs-fio to skip it",
                            WIFEXITED(status) ? WEXITSTATUS(status) : -1, row.rw, row.bs_bytes, row.qd,
                            !extra_options ? "" : " with the --fio-option given"));
  }
  return out;
}

FioResult parse_fio_json(const std::string& out) {
  // fio may print notes before the JSON document.
  const auto brace = out.find('{');
  if (brace == std::string::npos) throw Error("fio printed no JSON result");
  auto j = nlohmann::json::parse(out.substr(brace));
  FioResult result;
  double bytes_per_s = 0, bytes = 0, cpu_s = 0;
  for (const auto& j1 : j.at("jobs")) {
    double job_bytes = 0;
    for (const char* op : {"read", "write"}) {
      const auto& o = j1.at(op);
      bytes_per_s += o.at("bw_bytes").get<double>();
      job_bytes += o.at("io_bytes").get<double>();
      if (o.at("total_ios").get<double>() > 0 && o.contains("lat_ns") && o.at("lat_ns").contains("percentile")) {
        result.latency[op] = fio_percentiles(o.at("lat_ns"));
        for (const char* part : {"slat", "clat"}) {
          const std::string key = std::string(part) + "_ns";
          if (o.contains(key) && o.at(key).contains("percentile")) result.latency[op][part] = fio_percentiles(o.at(key));
        }
      }
    }
    bytes += job_bytes;
    // usr_cpu and sys_cpu are percent of one CPU over the job's runtime (ms).
    const double runtime_s = j1.at("job_runtime").get<double>() / 1e3;
    cpu_s += (j1.at("usr_cpu").get<double>() + j1.at("sys_cpu").get<double>()) / 100 * runtime_s;
  }
  result.gbps = bytes_per_s / 1e9;
  result.cpu_s_per_gb = bytes > 0 ? cpu_s / (bytes / 1e9) : 0;
  return result;
}

}  // namespace

FioResult run_fio(const std::vector<TestFile>& files, const Row& row, const FioJob& job) {
  return parse_fio_json(run_fio_process(fio_command(files, row, job), row, !job.extra_options.empty()));
}

}  // namespace strata::bench::bench_io
