// The whole optimizer phase of one step over a param group's shards: non-finite check, global
// gradient norm, loss-scale unscaling, clipping, the update and the low-precision copy-out.
//
// fused_optimizer_phase reads the gradients twice and everything else once: one grad_stats() pass
// (norm and non-finite check together; the norm must be known before any element is clipped) and
// one fused update pass with 1/loss_scale and the clip coefficient folded into one multiplier and
// the bf16/fp16 copy written in the same pass. On overflow nothing is written at all.
//
// unfused_optimizer_phase does the same work the way DeepSpeed's offload path does it, as separate
// parallel passes: unscale (g *= 1/scale, widening 16-bit gradients to fp32), non-finite scan, norm,
// clip (g *= coef), the update, and the fp32 -> bf16/fp16 copy. It is the baseline of `strata
// bench adam --mode phase`, and a second implementation the tests hold the fused one against: with
// a power-of-two loss scale both give the same bits.
#pragma once

#include <span>

#include "optim/cpu_exec.h"
#include "optim/grad_stats.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"

namespace strata::optim {

struct PhaseOptions {
  double max_grad_norm = 0.0;  // DeepSpeed's gradient_clipping; <= 0 turns clipping off
  // The stored gradients are sums of this many unit gradients and the update wants their mean
  // (the ZeRO engine: micro-batches x ranks); folded into grad_scale with the loss scale.
  double grad_divisor = 1.0;
};

struct PhaseResult {
  bool applied = false;    // false: some gradient was NaN/Inf, the step was skipped
  double grad_norm = 0.0;  // global L2 norm of the unscaled gradients, before clipping
  double clip_coef = 1.0;
  float grad_scale = 1.0f;  // what the update multiplied the stored gradients by
  double loss_scale = 1.0;  // the scale the gradients carried
};

// `scaler` may be null (bf16/fp32 training: scale 1, no skipping logic beyond the non-finite check).
// With a scaler, its update() is called with the outcome. The group's step counter advances only
// when the step is applied. Multi-rank callers combine GradStats across ranks themselves and call
// apply_update() (below) instead.
PhaseResult fused_optimizer_phase(ParamGroup& group, std::span<const OptimShard> shards, LossScaler* scaler,
                                  const PhaseOptions& options, const CpuExec& exec);

// The phase's decision from the global stats, without touching any shard: the norm of the mean
// unscaled gradient, skip on a non-finite norm (the scaler's update(true)), else the clip
// coefficient and grad_scale = clip / (loss_scale * grad_divisor) (the scaler's update(false)).
// applied says whether the update must run; the caller runs it where the state lives (the CPU
// shards below, the ZeRO engine's device shards or its offloaded chunks) with that grad_scale.
PhaseResult decide_phase(const GradStats& global_stats, LossScaler* scaler, const PhaseOptions& options);

// Given the global stats: decides skip/apply, updates the scaler, runs the fused update.
PhaseResult apply_update(ParamGroup& group, std::span<const OptimShard> shards, const GradStats& global_stats,
                         LossScaler* scaler, const PhaseOptions& options, const CpuExec& exec);

// grad_f32[i] is shard i's fp32 gradient buffer (master.size() floats): for fp32 gradients it may
// be the gradient itself (then unscaled and clipped in place, as DeepSpeed does), for bf16/fp16
// gradients a scratch buffer the unscale pass widens into.
PhaseResult unfused_optimizer_phase(ParamGroup& group, std::span<const OptimShard> shards,
                                    std::span<const std::span<float>> grad_f32, LossScaler* scaler,
                                    const PhaseOptions& options, const CpuExec& exec);

}  // namespace strata::optim
