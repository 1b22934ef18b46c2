// Disk yardsticks the benchmarks measure in the same run as the thing they judge: sequential
// passes over a file through the I/O engine the training config asks for (strata's io_uring
// engine at the config's queue depth, the requests the swap store would make).
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"

namespace strata {

struct DiskPassSeconds {
  double write = 0;
  double read = 0;
};

// One timed sequential write pass of `write_bytes` and then one read pass of `read_bytes` over a
// hidden file in `dir` (removed afterwards) whose blocks were written once before, as `strata
// bench io` and the swap files have them; each pass in 64 MiB pieces from one huge-page buffer.
DiskPassSeconds time_disk_passes(const TrainConfig& cfg, const std::string& dir, std::uint64_t read_bytes,
                                 std::uint64_t write_bytes);

}  // namespace strata
