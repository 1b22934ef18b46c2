// The workers of `strata bench io --jobs N` (bench/bench_io.cc): N engines per test file, each
// with its own io_uring ring and thread, optionally pinned to distinct cores near the drive
// (hwloc: the cores of the drive's NUMA node, or of the machine when hwloc cannot place it),
// optionally polling completions (--iopoll).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "offload/io_engine.h"
#include "bench/bench_io_runs.h"
#include "bench/bench_io_workload.h"

namespace strata::bench::bench_io {

// Where each job's engine thread runs: cpus[f * jobs + j] for job j of file f (-1: unpinned).
struct Placement {
  std::vector<int> cpus;
  nlohmann::json report = nlohmann::json::array();  // per job: path, job, cpu, core, near (the drive's locality)
};

// One logical CPU per job on distinct cores, the cores near each file's drive first; with more
// jobs than cores they share cores, and the report says so.
Placement place_jobs(const std::vector<TestFile>& files, unsigned jobs);

// The engines of one row: `jobs` per file, every file registered in each, the buffer registered
// in each. files[i].id is the id in the first engine (untimed passes use that one).
class JobEngines {
 public:
  JobEngines(const offload::IoEngineOptions& options, std::vector<TestFile>& files, unsigned jobs,
             const std::vector<int>& cpus, std::span<std::byte> buffer);
  ~JobEngines();
  JobEngines(const JobEngines&) = delete;
  JobEngines& operator=(const JobEngines&) = delete;

  offload::IoEngine& first() { return *engines_.front(); }
  std::span<const Job> jobs() const { return jobs_; }

 private:
  std::vector<TestFile>& files_;
  std::vector<std::unique_ptr<offload::IoEngine>> engines_;
  std::vector<Job> jobs_;
};

}  // namespace strata::bench::bench_io
