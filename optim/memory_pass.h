// The Adam-shaped memory pass: the yardstick of `strata bench adam`. It moves exactly the bytes an
// Adam step moves — reads the master weights, both moments and the gradient (in the gradient's
// stored type), writes weights and moments back in place — with trivial math (m += g, v += g,
// p += m), using the same SIMD level, blocks (Note [Blocks] in optim/cpu_exec.h) and threads as adam_step. No CPU Adam
// can beat it on the same machine, so "fraction of the memory pass" is how close to the memory
// bandwidth roofline the optimizer runs.
#pragma once

#include <span>

#include "optim/cpu_exec.h"
#include "optim/optimizer.h"

namespace strata::optim {

// Uses master, moment1, moment2 and grad of each shard (their contents change; out is ignored).
void adam_shaped_memory_pass(std::span<const OptimShard> shards, const CpuExec& exec);

}  // namespace strata::optim
