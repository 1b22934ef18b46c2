// The request generator of `strata bench io` (bench/bench_io.cc): groups of requests, each with its
// own operation mix, access pattern and queue depth, kept in flight against every test file
// through Strata's I/O engine, for one pass over the blocks or for a time. It reports reads and
// writes apart (totals after the ramp and, every interval, what completed in it), stops early at
// steady state when asked, and with a VerifyMap stamps every write and checks every read as they
// complete (Note [Bench verify] in bench/bench_io_verify.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "offload/io_engine.h"
#include "bench/bench_io_runs.h"
#include "bench/bench_io_stats.h"
#include "bench/bench_io_verify.h"

namespace strata::bench::bench_io {

enum class Pattern : std::uint8_t { Sequential, Random };

// Requests of one kind with their own queue depth per file, on blocks
// [first_block, first_block + blocks) of every file.
struct Group {
  unsigned read_percent = 100;  // 100: reads, 0: writes, between: drawn per request
  Pattern pattern = Pattern::Sequential;
  unsigned qd = 1;
  std::uint64_t first_block = 0;
  std::uint64_t blocks = 0;
};

// What completed in one interval of a timed run.
struct IntervalReport {
  int index = 0;
  double end_s = 0;      // since the start of the run (ramp included)
  double seconds = 0;    // the interval's length
  bool ramp = false;     // ended before the ramp did; not in the totals or the steady-state test
  const OpStats& read;
  const OpStats& write;
};

// One worker of --jobs: its own engine (one ring and its thread) serving one test file, on its
// share of every group's blocks of that file; file_ids are every test file's id in that engine.
struct Job {
  offload::IoEngine* engine = nullptr;
  std::size_t file = 0;
  std::vector<offload::FileId> file_ids;
  unsigned share = 0;   // this job's index among the jobs of its file
  unsigned shares = 1;  // jobs per file
};

struct SteadySpec {
  double bound_fraction = 0;
  std::size_t window_intervals = 0;
};

struct WorkloadSpec {
  std::vector<Group> groups;
  std::size_t bs_bytes = 0;
  // 0: one pass, each group touching each of its blocks of every file once (in order, or in a
  // random permutation); otherwise the run lasts ramp + time and blocks are drawn uniformly.
  std::chrono::nanoseconds time{0};
  std::chrono::nanoseconds ramp{0};
  std::chrono::nanoseconds interval{0};  // 0: no interval reports
  std::optional<SteadySpec> steady;      // stop once the interval bandwidth is steady
  std::vector<VerifyMap>* verify = nullptr;  // one per file; null: no headers written or checked
  std::uint64_t verify_seed = 0;  // the run's seed in every block header
  std::uint64_t order_seed = 0;   // random block order and read/write draws
  std::function<void(const IntervalReport&)> on_interval;
};

struct WorkloadResult {
  OpStats read, write;  // completed after the ramp
  double seconds = 0;   // from the end of the ramp to the last completion
  // The same up to the last read's and the last write's completion: in one pass of readers and
  // writers at once, each side's rate is over its own time.
  double read_seconds = 0;
  double write_seconds = 0;
  double cpu_s = 0;     // user + system CPU of the process over the whole run
  std::uint64_t all_bytes = 0;  // ramp included, for cpu_s per GB
  bool steady = false;
  double steady_at_s = 0;
  std::uint64_t verified_blocks = 0;

  double gbps() const { return seconds > 0 ? static_cast<double>(read.bytes + write.bytes) / seconds / 1e9 : 0; }
  double cpu_s_per_gb() const { return all_bytes > 0 ? cpu_s / (static_cast<double>(all_bytes) / 1e9) : 0; }
};

// The buffer holds one slot of bs_bytes per request in flight: jobs x (sum of the groups' qd),
// where `jobs` counts every file's jobs.
std::size_t workload_buffer_bytes(const WorkloadSpec& spec, std::size_t jobs);

// Job `share` of `shares`'s part of a group's blocks: a contiguous slice, so jobs never touch the
// same block (as fio's numjobs with offset_increment).
Group job_share(const Group& g, unsigned share, unsigned shares);

// Runs the workload, every job's share of every group at once; rethrows the first I/O or
// VerifyError after every request has finished.
WorkloadResult run_workload(std::span<const Job> jobs, std::vector<TestFile>& files, std::span<std::byte> buffer,
                            const WorkloadSpec& spec);

// The same with one engine serving every file (files[i].id registered in it), one job per file.
WorkloadResult run_workload(offload::IoEngine& engine, std::vector<TestFile>& files, std::span<std::byte> buffer,
                            const WorkloadSpec& spec);

}  // namespace strata::bench::bench_io
