// `strata simulate --machine measure`: the machine a config's sim-device run trains on, measured
// here, so the simulator's prediction can be checked against `strata bench step` on the same host
// (docs/MEASUREMENTS.md). On the sim device the "GPU" is this CPU:
//   - peak rate: sgemm GFLOP/s of the models' matmul op at the block's MLP shape
//     (models/sgemm_yardstick.h, the yardstick of `strata bench model`);
//   - efficiency: the FLOPs of one micro-batch of the config's model (cut to 8 blocks when it has
//     more; the blocks are alike) over its fastest forward+backward on the sim device, divided by
//     that peak; one figure for the blocks and the head. The per-op costs the FLOP count leaves out
//     (norms, softmax, launching sim kernels on the stream) are inside it. This calibrates the
//     compute queue on the config's own shapes, so what the check against `bench step` tests is
//     the rest: the engine's schedule, how the queues overlap and wait for each other.
//   - CPU Adam and host memory: AdamW and the Adam-shaped pass of optim/adam_yardstick.h (what
//     `strata doctor --measure` writes for a host);
//   - copies: the config's modeled link when it sets one, else memcpy;
//   - NVMe: the write and read passes `strata bench step` uses, in the config's first nvme_path;
//   - wake-ups (Note [Wake-ups] in sim/step_sim.h): half the median round trip of an empty host
//     function through an idle sim stream.
#pragma once

#include "config/config.h"
#include "sim/step_sim.h"

namespace strata::sim {

// Measures this host for `config`'s sim device (a few seconds). `workload` is the config's.
SimMachine measure_sim_machine(const TrainConfig& config, const StepWorkload& workload);

}  // namespace strata::sim
