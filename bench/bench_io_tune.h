// `strata bench io --tune [--out tuned.json]`: the drive of a config's nvme_path swept over the
// I/O engine's two settings the engine reads from a config (aio.request_size and
// aio.write_request_size: the largest kernel read and write; aio.queue_depth), with sequential
// reads and writes of the swap store's size of transfer, and the winners written as a config
// fragment `strata train --config-fragment` merges (its plan line then shows them).
//
// The read and the write request size are chosen apart (each the fastest at its queue depth);
// the queue depth is the one whose best read and best write move equal bytes in the least time,
// as a step reads and writes about alike. Concurrent reads and writes and several rings per drive
// are not swept (follow-ups). Small by default (256 MiB per row, 3 sizes x 3 depths x 2 = 18 rows).
#pragma once

#include <string>
#include <vector>

#include "bench/bench_io_plan.h"
#include "bench/bench_io_report.h"

namespace strata::bench::bench_io {

struct TuneArgs {
  bool enabled = false;
  std::string out;
  std::string config;  // empty: the built-in demo
  std::vector<std::string> overrides;
  std::string request_sizes = "256K,1M,4M";
  std::string qds = "4,16,32";
  bool size_given = false;  // --size was given (else 256M per row)
};

// Every row of the flags' matrix, measured (bench/bench_io.cc).
std::vector<RowReport> measure_rows(const BenchIoArgs& a);

// `base`: the bench's other flags (--dir/--paths, --engine, --size, --json, ...).
int run_tune(const TuneArgs& t, const BenchIoArgs& base);

}  // namespace strata::bench::bench_io
