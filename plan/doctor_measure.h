// `strata doctor --measure`: this machine as a machine file (plan/machine.h), from a few seconds
// of the benchmarks' own yardsticks: the CPU AdamW rate and the Adam-shaped memory pass
// (plan/yardsticks.h, as `strata bench adam`), the drive under --dir (plan/bench_disk.h, as the
// benchmarks' disk passes), and the devices. What cannot be measured here is written as 0 where
// the machine file reads 0 as unknown, and the note says which figures those are and why.
#pragma once

#include <cstdint>
#include <string>

#include "core/topology.h"
#include "plan/machine.h"

namespace strata {

struct MeasureOptions {
  std::string dir;                        // the drive measured: a directory on it (doctor's --dir)
  std::uint64_t device_memory_bytes = 0;  // the sim device's memory; 0: a quarter of host memory
};

// Without a usable CUDA device the GPU described is the sim device: its memory is the option's, its
// bf16_tflops this machine's sgemm rate (the sim device computes on the CPU), its link none (copies
// at memory speed, as without strata.device.h2d_gbps). The result passes parse_machine.
MachineSpec measure_machine(const MeasureOptions& options, const Topology& topo);

}  // namespace strata
