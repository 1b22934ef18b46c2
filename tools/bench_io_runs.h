// One timed run of a `strata bench io` row (tools/bench_io.cc): through Strata's I/O engine, every
// path streaming its test file with qd requests of bs bytes in flight, or through fio with the same
// parameters on the same files. The matrix, the buffers, the file state and the printing are
// bench_io.cc's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "offload/file.h"
#include "offload/io_engine.h"

namespace strata::tools::bench_io {

struct Row {
  std::string rw;
  std::size_t bs_bytes = 0;
  unsigned qd = 0;
};

struct RunResult {
  double gbps = 0;
  double iops = 0;
  double p50_us = 0;
  double p99_us = 0;
};

struct TestFile {
  std::string dir;
  std::string path;
  offload::UniqueFd fd;
  offload::FileId id = -1;
};

// One Strata run of `row` (blocks in order, or shuffled with `seed` for the random rows): GB/s,
// IOPS and the p50/p99 latency of one request.
RunResult run_strata(offload::IoEngine& engine, std::vector<TestFile>& files, std::span<std::byte> buffer,
                     const Row& row, std::uint64_t file_bytes, std::uint32_t seed);

// Runs fio with the row's parameters on the same files; returns its GB/s (1e9 bytes/s).
double run_fio(const std::vector<TestFile>& files, const Row& row, std::uint64_t file_bytes,
               const std::vector<std::string>& extra_options);

}  // namespace strata::tools::bench_io
