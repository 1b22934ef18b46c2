// The fused optimizer phase and its unfused baseline (see optim/optimizer_phase.h).
#include "optim/optimizer_phase.h"

#include <cstdint>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "optim/cpu_kernels.h"

namespace strata::optim {
namespace {

std::size_t shard_elems(std::span<const OptimShard> shards, std::size_t s) { return shards[s].master.size(); }

}  // namespace

PhaseResult decide_phase(const GradStats& global_stats, LossScaler* scaler, const PhaseOptions& options) {
  PhaseResult result;
  result.loss_scale = scaler != nullptr ? scaler->scale() : 1.0;
  const double divisor = result.loss_scale * options.grad_divisor;
  result.grad_norm = unscaled_norm(global_stats, divisor);
  if (!global_stats.finite()) {
    if (scaler != nullptr) scaler->update(true);
    return result;
  }
  result.clip_coef = clip_coefficient(result.grad_norm, options.max_grad_norm);
  result.grad_scale = static_cast<float>(result.clip_coef / divisor);
  result.applied = true;
  if (scaler != nullptr) scaler->update(false);
  return result;
}

PhaseResult apply_update(ParamGroup& group, std::span<const OptimShard> shards, const GradStats& global_stats,
                         LossScaler* scaler, const PhaseOptions& options, const CpuExec& exec) {
  const PhaseResult result = decide_phase(global_stats, scaler, options);
  if (result.applied) group.step(shards, result.grad_scale, exec);
  return result;
}

PhaseResult fused_optimizer_phase(ParamGroup& group, std::span<const OptimShard> shards, LossScaler* scaler,
                                  const PhaseOptions& options, const CpuExec& exec) {
  return apply_update(group, shards, grad_stats(shards, exec), scaler, options, exec);
}

PhaseResult unfused_optimizer_phase(ParamGroup& group, std::span<const OptimShard> shards,
                                    std::span<const std::span<float>> grad_f32, LossScaler* scaler,
                                    const PhaseOptions& options, const CpuExec& exec) {
  if (grad_f32.size() != shards.size()) {
    throw ConfigError(fmt::format("unfused optimizer phase: {} fp32 gradient buffers for {} shards", grad_f32.size(),
                                  shards.size()));
  }
  for (std::size_t s = 0; s < shards.size(); ++s) {
    if (grad_f32[s].size() != shards[s].master.size()) {
      throw ConfigError(fmt::format("unfused optimizer phase: shard {} has {} elements but its fp32 gradient "
                                    "buffer {}",
                                    s, shards[s].master.size(), grad_f32[s].size()));
    }
  }
  const detail::KernelSet& k = detail::kernels_for(exec.simd);
  auto elems = [&](std::size_t s) { return shard_elems(shards, s); };
  PhaseResult result;
  result.loss_scale = scaler != nullptr ? scaler->scale() : 1.0;

  // Pass 1: unscale into fp32.
  const float inv_scale = static_cast<float>(1.0 / result.loss_scale);
  detail::parallel_blocks(exec, shards.size(), elems, [&](std::size_t s, std::size_t b, std::size_t e, std::size_t) {
    const GradRef& g = shards[s].grad;
    float* dst = grad_f32[s].data() + b;
    if (g.dtype == DType::F32 && g.data == grad_f32[s].data()) {
      k.scale_inplace(dst, e - b, inv_scale);
    } else {
      k.widen_scale(static_cast<const std::byte*>(g.data) + b * dtype_bytes(g.dtype), g.dtype, dst, e - b, inv_scale);
    }
  });

  // Pass 2: non-finite scan.
  std::size_t total_blocks = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) total_blocks += (elems(s) + kCpuBlockElems - 1) / kCpuBlockElems;
  std::vector<std::uint8_t> bad(total_blocks, 0);
  detail::parallel_blocks(exec, shards.size(), elems, [&](std::size_t s, std::size_t b, std::size_t e, std::size_t i) {
    bad[i] = k.has_nonfinite(grad_f32[s].data() + b, e - b) ? 1 : 0;
  });
  bool overflow = false;
  for (std::uint8_t f : bad) overflow = overflow || f != 0;
  if (overflow) {
    result.grad_norm = std::numeric_limits<double>::infinity();
    if (scaler != nullptr) scaler->update(true);
    return result;
  }

  // Pass 3: norm of the unscaled gradients.
  std::vector<GradSpan> spans;
  for (std::size_t s = 0; s < shards.size(); ++s) spans.push_back(GradSpan{grad_f32[s].data(), DType::F32, elems(s)});
  result.grad_norm = unscaled_norm(grad_stats(spans, exec), 1.0);

  // Pass 4: clip (torch's clip_grad_norm_ multiplies by the clamped coefficient unconditionally).
  result.clip_coef = clip_coefficient(result.grad_norm, options.max_grad_norm);
  const float coef = static_cast<float>(result.clip_coef);
  detail::parallel_blocks(exec, shards.size(), elems, [&](std::size_t s, std::size_t b, std::size_t e, std::size_t) {
    k.scale_inplace(grad_f32[s].data() + b, e - b, coef);
  });

  // Pass 5: the update, on fp32 gradients, without a copy-out.
  std::vector<OptimShard> plain(shards.begin(), shards.end());
  for (std::size_t s = 0; s < shards.size(); ++s) {
    plain[s].grad = GradRef{grad_f32[s].data(), DType::F32};
    plain[s].out = LowPrecisionOut{};
  }
  group.step(plain, 1.0f, exec);

  // Pass 6: fp32 -> bf16/fp16 copy of the new weights.
  detail::parallel_blocks(exec, shards.size(), elems, [&](std::size_t s, std::size_t b, std::size_t e, std::size_t) {
    const LowPrecisionOut& out = shards[s].out;
    if (out.data == nullptr) return;
    k.pack(shards[s].master.data() + b, static_cast<std::byte*>(out.data) + b * dtype_bytes(out.dtype), out.dtype,
           e - b);
  });
  result.grad_scale = 1.0f;
  result.applied = true;
  if (scaler != nullptr) scaler->update(false);
  return result;
}

}  // namespace strata::optim
