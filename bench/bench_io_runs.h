// A row of `strata bench io` (bench/bench_io.cc), its test files, and the row run through fio with
// the same parameters on the same files. Strata's side is bench/bench_io_workload.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "offload/file.h"
#include "offload/io_engine.h"

namespace strata::tools::bench_io {

struct Row {
  std::string rw;
  std::size_t bs_bytes = 0;
  unsigned qd = 0;
};

struct TestFile {
  std::string dir;
  std::string path;
  offload::UniqueFd fd;
  offload::FileId id = -1;
};

// One fio job per file and part: a whole row is one part over the whole file; readers+writers
// rows are two parts at once (fio's own jobs), each on its half with its own queue depth.
struct FioPart {
  std::string rw;  // read, write, randread, randwrite, randrw
  unsigned qd = 1;
  std::uint64_t offset_bytes = 0;
  std::uint64_t bytes = 0;
};

// What fio runs: the parts, the read share of randrw (--rwmixread), a time (0: one pass of each
// part) and extra options from --fio-option.
struct FioJob {
  std::vector<FioPart> parts;
  unsigned read_percent = 100;
  double time_s = 0;
  std::vector<std::string> extra_options;
};

struct FioResult {
  double gbps = 0;         // reads + writes, 1e9 bytes/s
  double cpu_s_per_gb = 0;  // fio's usr + sys CPU over its run, per GB moved
  // Per operation that ran ("read", "write"): p50_us, p99_us, p99_9_us, max_us of fio's total
  // latency (submission to completion, as Strata's figures).
  nlohmann::json latency = nlohmann::json::object();
};

// Runs fio with the row's parameters on the same files.
FioResult run_fio(const std::vector<TestFile>& files, const Row& row, const FioJob& job);

}  // namespace strata::tools::bench_io
