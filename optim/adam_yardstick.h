// The CPU Adam yardstick: AdamW timed between two runs of the Adam-shaped memory pass
// (optim/memory_pass.h) over one shard in huge-page host memory, each figure the best of its
// repetitions. `strata bench adam` prints it per thread count (and builds its --mode phase on the
// same shard); measure_adam_rates is one such run on all cores, which `strata doctor --measure`
// (sim/doctor_measure.h) and the simulator's machine measurement (sim/sim_machine_measure.h) write
// into a machine's host. It sits here, on the optimizer's floor, so every floor above reaches it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include <tbb/task_arena.h>

#include "core/dtype.h"
#include "core/host_buffer.h"
#include "optim/cpu_exec.h"
#include "optim/optimizer.h"

namespace strata::optim {

// What a timed shard is for: the bare update (p, m, v, g), or bench adam's --mode phase, which
// also needs the bf16 output, pristine gradients to restore and fp32 gradients to unscale into.
enum class YardstickRun { Update, Phase };

// The buffers of one shard, in (transparent) huge-page host memory.
struct YardstickShard {
  std::size_t n = 0;
  DType grad_dtype = DType::F32;
  HostBuffer p, m, v, g, g_pristine, out, scratch;

  OptimShard shard(YardstickRun run) const;
};

// Who asks for a yardstick shard, for the one error allocate_yardstick_shard may throw.
struct ShardRequest {
  std::string what;  // who asked for the shard, for the error: "--params 100M"
  std::string fix;   // what to do when the host lacks the memory: "use a smaller --params"
};
// Allocates the buffers `run` needs for n parameters of grad_dtype (set in `st`), after checking
// that the host has the memory (a ConfigError naming `asked` and its fix when it does not).
void allocate_yardstick_shard(YardstickShard& st, const ShardRequest& asked, YardstickRun run);

// Fills the shard with deterministic, realistic values (gradients of `grad_magnitude`), first
// touched by the threads of `arena` so pages are spread like they would be in training.
void fill_yardstick_shard(YardstickShard& st, float grad_magnitude, tbb::task_arena& arena);

// The bytes AdamW and the memory pass must move per parameter: read p, m, v, g; write p, m, v.
std::size_t adam_bytes_per_param(DType grad_dtype);

double seconds_of(const std::function<void()>& fn);

// Best seconds of the repetitions: the memory pass before and after, and the timed kernels
// (a: AdamW or bench adam's fused phase; b: its separate passes, phase mode only).
struct BestSeconds {
  double before = 1e30, after = 1e30, a = 1e30, b = 1e30;
};

// Pass, AdamW, pass, `reps` times after one warm-up of each (b is left unset).
BestSeconds time_adam_between_passes(const OptimShard& shard, const CpuExec& exec, int reps);

struct AdamRates {
  double adam_params_per_s = 0;  // AdamW on all cores, fp32 gradients
  double memory_gbps = 0;        // the faster Adam-shaped memory pass around it, 1e9 bytes/s
};

// `strata bench adam --params N --threads <all> --reps R` in one call: the best of `reps`
// repetitions of pass, AdamW, pass over `params` fp32 parameters with fp32 gradients.
AdamRates measure_adam_rates(std::size_t params, int reps);

}  // namespace strata::optim
