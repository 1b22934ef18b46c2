// `strata doctor --measure`: this machine as a machine file (plan/machine.h), from a few seconds
// of the benchmarks' own yardsticks: the CPU AdamW rate and the Adam-shaped memory pass
// (optim/adam_yardstick.h, as `strata bench adam`), the sim device's sgemm rate
// (models/sgemm_yardstick.h, as `strata bench model`), the drive under --dir (plan/bench_disk.h, as
// the benchmarks' disk passes), and the devices. What cannot be measured here is written as 0 where
// the machine file reads 0 as unknown, and the note says which figures those are and why.
// It sits in sim/, beside the simulator's own measurement of this host (sim/sim_machine_measure.h),
// since the sgemm yardstick times the models' matmul op, a floor above plan/ (which keeps the
// machine file both write).
#pragma once

#include <cstdint>
#include <string>

#include "core/topology.h"
#include "plan/machine.h"

namespace strata::sim {

struct MeasureOptions {
  std::string dir;                        // the drive measured: a directory on it (doctor's --dir)
  std::uint64_t device_memory_bytes = 0;  // the sim device's memory; 0: a quarter of host memory
};

// Without a usable CUDA device the GPU described is the sim device: its memory is the option's, its
// bf16_tflops this machine's sgemm rate (the sim device computes on the CPU), its link none (copies
// at memory speed, as without strata.device.h2d_gbps). The result passes parse_machine.
MachineSpec measure_machine(const MeasureOptions& options, const Topology& topo);

}  // namespace strata::sim
