// The global gradient norm and the non-finite check, fused into one read of the gradients, with a
// fixed-order (deterministic) reduction; and the clipping coefficient.
//
// Each shard is cut into the blocks of Note [Blocks] (optim/cpu_exec.h); a block's sum of squares
// is taken in double in 16 lanes with a fixed lane rule (optim/cpu_kernels.h, kSumLanes), and the
// block partials are added in shard order, then block order. The result therefore has the same bits
// for any thread count and on every SIMD path. In double, the square of any finite fp32 value is
// exact and finite, so the sum is non-finite exactly when some gradient element is NaN or Inf: the
// non-finite check needs no separate pass and no separate comparison.
#pragma once

#include <cstddef>
#include <span>

#include "core/dtype.h"
#include "optim/cpu_exec.h"

namespace strata::optim {

struct OptimShard;

// A run of gradients in their stored type.
struct GradSpan {
  const void* data = nullptr;
  DType dtype = DType::F32;
  std::size_t elems = 0;
};

struct GradStats {
  double sum_squares = 0.0;  // of the gradients as stored (i.e. still multiplied by the loss scale)
  bool finite() const;       // false iff some element was NaN or +-Inf
};

// How many block partials a gradient of n_elems elements has: ceil(n_elems / kCpuBlockElems), one per
// block of Note [Blocks] in optim/cpu_exec.h (the last may be partial). The device ops write that many
// (engine/device_ops.h), and the plan sizes their buffer with it (plan/part_bytes.h).
constexpr std::size_t sum_squares_blocks(std::size_t n_elems) {
  return (n_elems + kCpuBlockElems - 1) / kCpuBlockElems;
}

// Over all spans, in the order given.
GradStats grad_stats(std::span<const GradSpan> grads, const CpuExec& exec);
// Over the gradients of optimizer shards (elems = master.size()).
GradStats grad_stats(std::span<const OptimShard> shards, const CpuExec& exec);

// Combines the stats of several parts (shards handled elsewhere, other ranks): call it in one fixed
// order everywhere to keep the result deterministic.
GradStats combine(const GradStats& a, const GradStats& b);

// The L2 norm of the true gradients: sqrt(sum_squares) / loss_scale.
double unscaled_norm(const GradStats& stats, double loss_scale);

// torch.nn.utils.clip_grad_norm_: min(1, max_norm / (total_norm + 1e-6)); 1 when max_norm <= 0
// (clipping off) or the norm is not finite.
double clip_coefficient(double total_norm, double max_norm);

}  // namespace strata::optim
