// `strata bench io`'s flags (bench/bench_io.cc) and what they mean once checked: the matrix of
// rows, the files, the engine, and how each row runs (one pass or a time, with intervals, steady
// state, preconditioning, verification). Every bad value or combination is refused here with one
// message naming the flag and the fix, before any file is made.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "offload/io_engine.h"
#include "bench/bench_io_files.h"
#include "bench/bench_io_runs.h"
#include "bench/bench_io_workload.h"

namespace strata::bench::bench_io {

// The flags as given.
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
  std::string fio_mem = "same";
  unsigned batch = 1;
  bool sqpoll = false;
  bool vs_fio = false;
  bool json = false;
  bool keep_file = false;
  int pairs = 3;
  // Sustained, mixed and verified runs.
  std::string time;
  std::string ramp;
  std::string interval;
  std::string interval_log;
  std::string steady_state;
  std::string steady_window = "10s";
  bool precondition = false;
  int mix = -1;  // -1: not given
  unsigned read_qd = 0;
  unsigned write_qd = 0;
  bool verify = false;
  std::string inject_fault;
  std::uint64_t seed = 0;
  bool histogram = false;
  // Scale: workers per path, their placement, polled completions, raw block devices.
  unsigned jobs = 1;
  bool pin = false;
  bool iopoll = false;
  std::string device;
  bool destructive = false;
  std::string plot;  // --plot: bandwidth and latency over time (bench/bench_io_plot.h)
};

struct BenchPlan {
  std::vector<std::string> dirs;  // or, with --device, the block devices
  bool devices = false;
  std::uint64_t file_bytes = 0;
  std::vector<Row> rows;
  std::size_t buffer_bytes = 0;  // the largest row's slots (Note [Bench buffers] in bench/bench_io_files.h)
  offload::IoEngineOptions engine_options;
  FileState file_state = FileState::Written;
  std::optional<bool> huge_always;  // --huge-pages on/off; nullopt for auto
  std::chrono::nanoseconds time{0}, ramp{0}, interval{0};
  std::optional<SteadySpec> steady;
  std::chrono::nanoseconds steady_window{0};
  unsigned mix = 50;
  bool precondition = false;
  bool verify = false;
  std::string fault_kind;        // --inject-fault (tests); empty: none
  std::uint64_t fault_block = 0;
  std::uint64_t seed = 0;
  unsigned jobs = 1;
  bool pin = false;
};

BenchPlan make_plan(const BenchIoArgs& a);

// "500ms", "1.5s", "10m", "1h"; a bare number is seconds. ConfigError naming `flag` otherwise.
std::chrono::nanoseconds parse_duration(const std::string& text, const char* flag);

// The row's groups of requests: one for read/write/randread/randwrite/randrw; for a concurrent
// row "A+B" readers on the first half of every file and writers on the second, each with its
// own queue depth (--read-qd, --write-qd; the row's qd when not given).
std::vector<Group> row_groups(const BenchPlan& plan, const BenchIoArgs& a, const Row& row);

bool row_writes(const Row& row);

}  // namespace strata::bench::bench_io
