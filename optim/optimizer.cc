// Hyper-parameter validation, per-step constants, the parallel drivers of AdamW/Adam, SGD and
// Lion, and ParamGroup (see optim/optimizer.h).
#include "optim/optimizer.h"

#include <cmath>
#include <cstddef>

#include <fmt/format.h>

#include "core/error.h"
#include "optim/cpu_kernels.h"

namespace strata::optim {
namespace {

void require_finite(double value, std::string_view where, std::string_view optimizer, std::string_view name) {
  if (!std::isfinite(value)) {
    throw ConfigError(fmt::format("{}: {} {} = {} is not a finite number; set it to a finite value", where,
                                  optimizer, name, value));
  }
}

void require_at_least(double value, double lo, std::string_view where, std::string_view optimizer,
                      std::string_view name) {
  require_finite(value, where, optimizer, name);
  if (value < lo) {
    throw ConfigError(fmt::format("{}: {} {} = {} is out of range; it must be >= {}", where, optimizer, name,
                                  value, lo));
  }
}

void require_positive(double value, std::string_view where, std::string_view optimizer, std::string_view name) {
  require_finite(value, where, optimizer, name);
  if (value <= 0.0) {
    throw ConfigError(fmt::format("{}: {} {} = {} is out of range; it must be > 0 (typical: 1e-8)", where,
                                  optimizer, name, value));
  }
}

void require_unit_interval(double value, std::string_view where, std::string_view optimizer, std::string_view name) {
  require_finite(value, where, optimizer, name);
  if (value < 0.0 || value >= 1.0) {
    throw ConfigError(fmt::format("{}: {} {} = {} is out of range; it must be in [0, 1)", where, optimizer, name,
                                  value));
  }
}

void check_shard(const OptimShard& s, std::size_t index, bool needs_moment1, bool needs_moment2,
                 std::string_view optimizer) {
  const std::size_t n = s.master.size();
  if (needs_moment1 && s.moment1.size() != n) {
    throw ConfigError(fmt::format("{} shard {}: moment1 has {} elements but master has {}; give both the same size",
                                  optimizer, index, s.moment1.size(), n));
  }
  if (needs_moment2 && s.moment2.size() != n) {
    throw ConfigError(fmt::format("{} shard {}: moment2 has {} elements but master has {}; give both the same size",
                                  optimizer, index, s.moment2.size(), n));
  }
  if (n > 0 && s.grad.data == nullptr) {
    throw ConfigError(fmt::format("{} shard {}: the gradient pointer is null for {} elements", optimizer, index, n));
  }
  if (s.out.data != nullptr && s.out.dtype == DType::F32) {
    throw ConfigError(fmt::format("{} shard {}: the low-precision copy must be bf16 or fp16, not fp32 "
                                  "(fp32 weights are the master buffer itself)",
                                  optimizer, index));
  }
}

const std::byte* grad_at(const GradRef& g, std::size_t elem) {
  return static_cast<const std::byte*>(g.data) + elem * dtype_bytes(g.dtype);
}

void* out_at(const LowPrecisionOut& o, std::size_t elem) {
  return o.data == nullptr ? nullptr : static_cast<std::byte*>(o.data) + elem * dtype_bytes(o.dtype);
}

// SGD and Lion: the scalar element functions in parallel. The FMA-target clone runs fmaf as one
// instruction (and may auto-vectorize); the baseline clone calls libm's correctly rounded fmaf.
// Both round identically (Note [Explicit fma] in optim/optim_math.h).
template <typename Element>
[[gnu::always_inline]] inline void elementwise_block(const OptimShard& s, std::size_t begin, std::size_t end,
                                                     Element element) {
  float* p = s.master.data();
  for (std::size_t i = begin; i < end; ++i) {
    element(i, detail::load_grad(s.grad.data, s.grad.dtype, i));
    if (s.out.data != nullptr) detail::store_low(s.out.data, s.out.dtype, i, p[i]);
  }
}

void sgd_block_baseline(const SgdStepConsts& c, const OptimShard& s, std::size_t begin, std::size_t end) {
  float dummy = 0.0f;
  const bool has_buf = !s.moment1.empty();
  elementwise_block(s, begin, end, [&](std::size_t i, float g) {
    sgd_element(s.master[i], has_buf ? s.moment1[i] : dummy, g, c);
  });
}

__attribute__((target("avx2,fma,f16c"))) void sgd_block_fma(const SgdStepConsts& c, const OptimShard& s,
                                                             std::size_t begin, std::size_t end) {
  float dummy = 0.0f;
  const bool has_buf = !s.moment1.empty();
  elementwise_block(s, begin, end, [&](std::size_t i, float g) {
    sgd_element(s.master[i], has_buf ? s.moment1[i] : dummy, g, c);
  });
}

void lion_block_baseline(const LionStepConsts& c, const OptimShard& s, std::size_t begin, std::size_t end) {
  elementwise_block(s, begin, end, [&](std::size_t i, float g) { lion_element(s.master[i], s.moment1[i], g, c); });
}

__attribute__((target("avx2,fma,f16c"))) void lion_block_fma(const LionStepConsts& c, const OptimShard& s,
                                                              std::size_t begin, std::size_t end) {
  elementwise_block(s, begin, end, [&](std::size_t i, float g) { lion_element(s.master[i], s.moment1[i], g, c); });
}

}  // namespace

void validate(const AdamParams& params, std::string_view where) {
  const std::string_view name = params.weight_decay_mode == WeightDecayMode::Decoupled ? "AdamW" : "Adam";
  require_at_least(params.lr, 0.0, where, name, "lr");
  require_unit_interval(params.beta1, where, name, "beta1");
  require_unit_interval(params.beta2, where, name, "beta2");
  require_positive(params.eps, where, name, "eps");
  require_at_least(params.weight_decay, 0.0, where, name, "weight_decay");
}

void validate(const SgdParams& params, std::string_view where) {
  require_at_least(params.lr, 0.0, where, "SGD", "lr");
  require_unit_interval(params.momentum, where, "SGD", "momentum");
  require_unit_interval(params.dampening, where, "SGD", "dampening");
  require_at_least(params.weight_decay, 0.0, where, "SGD", "weight_decay");
  if (params.nesterov && (params.momentum == 0.0 || params.dampening != 0.0)) {
    throw ConfigError(fmt::format("{}: SGD nesterov = true needs momentum > 0 and dampening = 0 (got momentum {}, "
                                  "dampening {})",
                                  where, params.momentum, params.dampening));
  }
}

void validate(const LionParams& params, std::string_view where) {
  require_at_least(params.lr, 0.0, where, "Lion", "lr");
  require_unit_interval(params.beta1, where, "Lion", "beta1");
  require_unit_interval(params.beta2, where, "Lion", "beta2");
  require_at_least(params.weight_decay, 0.0, where, "Lion", "weight_decay");
}

AdamStepConsts make_adam_consts(const AdamParams& params, std::int64_t step, float grad_scale) {
  STRATA_CHECK(step >= 1, "Adam step counter {} (steps count from 1)", step);
  AdamStepConsts c;
  c.grad_scale = grad_scale;
  c.beta1 = static_cast<float>(params.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - params.beta1);
  c.beta2 = static_cast<float>(params.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - params.beta2);
  double step_size = params.lr;
  double inv_bc2_sqrt = 1.0;
  if (params.bias_correction == BiasCorrection::On) {
    const double t = static_cast<double>(step);
    step_size = params.lr / (1.0 - std::pow(params.beta1, t));
    inv_bc2_sqrt = 1.0 / std::sqrt(1.0 - std::pow(params.beta2, t));
  }
  c.neg_step_size = static_cast<float>(-step_size);
  c.inv_bias_correction2_sqrt = static_cast<float>(inv_bc2_sqrt);
  c.eps = static_cast<float>(params.eps);
  if (params.weight_decay_mode == WeightDecayMode::Decoupled) {
    c.decay = static_cast<float>(1.0 - params.lr * params.weight_decay);
    c.l2_weight_decay = 0.0f;
  } else {
    c.decay = 1.0f;
    c.l2_weight_decay = static_cast<float>(params.weight_decay);
  }
  return c;
}

SgdStepConsts make_sgd_consts(const SgdParams& params, std::int64_t step, float grad_scale) {
  STRATA_CHECK(step >= 1, "SGD step counter {} (steps count from 1)", step);
  SgdStepConsts c;
  c.grad_scale = grad_scale;
  c.lr = static_cast<float>(params.lr);
  c.momentum = static_cast<float>(params.momentum);
  c.one_minus_dampening = static_cast<float>(1.0 - params.dampening);
  c.weight_decay = static_cast<float>(params.weight_decay);
  c.nesterov = params.nesterov;
  c.first_step = step == 1;
  return c;
}

LionStepConsts make_lion_consts(const LionParams& params, float grad_scale) {
  LionStepConsts c;
  c.grad_scale = grad_scale;
  c.lr = static_cast<float>(params.lr);
  c.beta1 = static_cast<float>(params.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - params.beta1);
  c.beta2 = static_cast<float>(params.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - params.beta2);
  c.decay = static_cast<float>(1.0 - params.lr * params.weight_decay);
  return c;
}

void adam_step(const AdamStepConsts& consts, WeightDecayMode mode, std::span<const OptimShard> shards,
               const CpuExec& exec) {
  for (std::size_t i = 0; i < shards.size(); ++i) check_shard(shards[i], i, true, true, "Adam");
  const detail::KernelSet& kernels = detail::kernels_for(exec.simd);
  detail::parallel_blocks(
      exec, shards.size(), [&](std::size_t s) { return shards[s].master.size(); },
      [&](std::size_t s, std::size_t begin, std::size_t end, std::size_t) {
        const OptimShard& sh = shards[s];
        const detail::AdamBlock block{sh.master.data() + begin, sh.moment1.data() + begin, sh.moment2.data() + begin,
                                      grad_at(sh.grad, begin),  sh.grad.dtype,             out_at(sh.out, begin),
                                      sh.out.dtype,             end - begin};
        kernels.adam(consts, mode, block);
      });
}

void sgd_step(const SgdStepConsts& consts, std::span<const OptimShard> shards, const CpuExec& exec) {
  for (std::size_t i = 0; i < shards.size(); ++i) {
    check_shard(shards[i], i, consts.momentum != 0.0f, false, "SGD");
  }
  const bool fma = simd_level_capped(exec.simd) != SimdLevel::Scalar;
  detail::parallel_blocks(
      exec, shards.size(), [&](std::size_t s) { return shards[s].master.size(); },
      [&](std::size_t s, std::size_t begin, std::size_t end, std::size_t) {
        if (fma) {
          sgd_block_fma(consts, shards[s], begin, end);
        } else {
          sgd_block_baseline(consts, shards[s], begin, end);
        }
      });
}

void lion_step(const LionStepConsts& consts, std::span<const OptimShard> shards, const CpuExec& exec) {
  for (std::size_t i = 0; i < shards.size(); ++i) check_shard(shards[i], i, true, false, "Lion");
  const bool fma = simd_level_capped(exec.simd) != SimdLevel::Scalar;
  detail::parallel_blocks(
      exec, shards.size(), [&](std::size_t s) { return shards[s].master.size(); },
      [&](std::size_t s, std::size_t begin, std::size_t end, std::size_t) {
        if (fma) {
          lion_block_fma(consts, shards[s], begin, end);
        } else {
          lion_block_baseline(consts, shards[s], begin, end);
        }
      });
}

int state_arrays(OptimizerKind kind) { return kind == OptimizerKind::AdamW || kind == OptimizerKind::Adam ? 3 : 2; }

std::string_view optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::AdamW: return "AdamW";
    case OptimizerKind::Adam: return "Adam";
    case OptimizerKind::Sgd: return "SGD";
    case OptimizerKind::Lion: return "Lion";
  }
  return "?";
}

ParamGroup ParamGroup::adam(std::string name, OptimizerKind kind, const AdamParams& params) {
  STRATA_CHECK(kind == OptimizerKind::Adam || kind == OptimizerKind::AdamW, "ParamGroup::adam with kind {}",
               optimizer_name(kind));
  ParamGroup group(std::move(name), kind);
  group.adam_ = params;
  group.adam_.weight_decay_mode = kind == OptimizerKind::AdamW ? WeightDecayMode::Decoupled : WeightDecayMode::L2;
  validate(group.adam_, fmt::format("param group '{}'", group.name_));
  return group;
}

ParamGroup ParamGroup::sgd(std::string name, const SgdParams& params) {
  ParamGroup group(std::move(name), OptimizerKind::Sgd);
  group.sgd_ = params;
  validate(group.sgd_, fmt::format("param group '{}'", group.name_));
  return group;
}

ParamGroup ParamGroup::lion(std::string name, const LionParams& params) {
  ParamGroup group(std::move(name), OptimizerKind::Lion);
  group.lion_ = params;
  validate(group.lion_, fmt::format("param group '{}'", group.name_));
  return group;
}

void ParamGroup::set_lr(double lr) {
  const std::string where = fmt::format("param group '{}'", name_);
  require_at_least(lr, 0.0, where, optimizer_name(kind_), "lr");
  adam_.lr = lr;
  sgd_.lr = lr;
  lion_.lr = lr;
}

void ParamGroup::step(std::span<const OptimShard> shards, float grad_scale, const CpuExec& exec) {
  const std::int64_t step = step_count_ + 1;
  apply(shards, grad_scale, step, exec);
  step_count_ = step;  // only after the update ran: a throw leaves the counter unchanged
}

void ParamGroup::apply(std::span<const OptimShard> shards, float grad_scale, std::int64_t step,
                       const CpuExec& exec) const {
  STRATA_CHECK(step >= 1, "optimizer step number {} (they count from 1)", step);
  switch (kind_) {
    case OptimizerKind::AdamW:
    case OptimizerKind::Adam:
      adam_step(make_adam_consts(adam_, step, grad_scale), adam_.weight_decay_mode, shards, exec);
      break;
    case OptimizerKind::Sgd: sgd_step(make_sgd_consts(sgd_, step, grad_scale), shards, exec); break;
    case OptimizerKind::Lion: lion_step(make_lion_consts(lion_, grad_scale), shards, exec); break;
  }
}

}  // namespace strata::optim
