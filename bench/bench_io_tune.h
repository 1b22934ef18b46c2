// `strata bench io --tune [--out tuned.json] [--machine-file M.json] [--plot heat.svg]`: the
// drive(s) of a config's nvme_path (or --dir/--paths) swept in three stages, each at the winners
// of the one before (the full product would be hundreds of rows):
//   1. kernel request size x queue depth, reads and writes apart, each request at an offset of
//      its own (randread/randwrite rows of that block size, as the swap store's scattered keys),
//      one ring per drive:
//      the read and the write request size (each the fastest at its depth) and a first depth, the
//      one whose best read and best write move equal bytes in the least time;
//   2. --tune-jobs: rings per drive (bench io's --jobs) at those settings. The engine runs one
//      ring per drive and no config key changes that, so this is reported, never written;
//   3. --tune-rw-qd: readers and writers at once (the read+write row, each side its own depth), as
//      the chunk pipeline reads ahead and writes behind through one engine whose aio.queue_depth
//      both share: the pair whose equal bytes each way finish first sets aio.queue_depth.
// The winners go out as a config fragment of the aio keys the engine reads (queue_depth,
// request_size, write_request_size; `strata train --config-fragment` merges it and its plan line
// shows them), and stage 1's grid, per drive, as the drive curve of a machine file (Note [Drive
// curves] in plan/machine_curve.h), which `strata simulate` reads at the plan's settings.
// Small by default (256 MiB per row).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_io_plan.h"
#include "bench/bench_io_report.h"

namespace strata::bench::bench_io {

struct TuneArgs {
  bool enabled = false;
  std::string out;
  std::string machine_file;  // --machine-file: the machine file that gets the drive curve
  std::string config;        // empty: the built-in demo
  std::vector<std::string> overrides;
  std::string request_sizes = "256K,1M,4M";
  std::string qds = "4,16,32";
  std::string jobs = "1,2,4";
  std::string rw_qds = "auto";  // R+W pairs; auto: Q/2+Q/2 for every --tune-qd Q >= 2
  bool size_given = false;      // --size was given (else 256M per row)
};

// What --tune chose; the fragment holds only keys the engine reads.
struct TuneChoice {
  unsigned queue_depth = 0;  // aio.queue_depth: the engine's, spanning every drive
  std::size_t read_request_bytes = 0;
  std::size_t write_request_bytes = 0;
};
nlohmann::json tuned_fragment(const TuneChoice& choice);

// Every row of the flags' matrix, measured (bench/bench_io.cc).
std::vector<RowReport> measure_rows(const BenchIoArgs& a);
// The rows of `strata bench io` printed as a table or JSON lines (with --plot, drawn too); 0 on success.
int run_bench_io(const BenchIoArgs& a);

// `base`: the bench's other flags (--dir/--paths, --engine, --size, --json, --plot: the heat maps, ...).
int run_tune(const TuneArgs& t, const BenchIoArgs& base);

}  // namespace strata::bench::bench_io
