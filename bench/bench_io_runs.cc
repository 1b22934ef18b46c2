// A `strata bench io` row through fio (see bench/bench_io_runs.h).
#include "bench/bench_io_runs.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace strata::tools::bench_io {
FioResult run_fio(const std::vector<TestFile>& files, const Row& row, const FioJob& job) {
  const auto& extra_options = job.extra_options;
  std::vector<std::string> args = {"fio", "--output-format=json", "--group_reporting"};
  for (std::size_t i = 0; i < files.size(); ++i) {
    for (std::size_t k = 0; k < job.parts.size(); ++k) {
      const FioPart& part = job.parts[k];
      args.push_back(fmt::format("--name=strata{}.{}", i, k));
      args.push_back("--filename=" + files[i].path);
      args.push_back(fmt::format("--offset={}", part.offset_bytes));
      args.push_back(fmt::format("--size={}", part.bytes));
      args.push_back(fmt::format("--bs={}", row.bs_bytes));
      args.push_back(fmt::format("--iodepth={}", part.qd));
      args.push_back("--rw=" + part.rw);
      args.push_back("--direct=1");
      args.push_back("--ioengine=io_uring");
      args.push_back("--lat_percentiles=1");
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
                            extra_options.empty() ? "" : " with the --fio-option given"));
  }
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
        const auto& lat = o.at("lat_ns");
        const auto& pct = lat.at("percentile");
        result.latency[op] = {{"p50_us", pct.at("50.000000").get<double>() / 1e3},
                              {"p99_us", pct.at("99.000000").get<double>() / 1e3},
                              {"p99_9_us", pct.at("99.900000").get<double>() / 1e3},
                              {"max_us", lat.at("max").get<double>() / 1e3}};
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

}  // namespace strata::tools::bench_io
