// The CPU optimizers over flat fp32 shards: AdamW / Adam (PyTorch semantics), SGD with momentum
// and Lion; their hyper-parameters, validation, and the per-group step counter.
//
// One call updates a list of shards in one fused pass per element: read the fp32 master weights,
// the optimizer state and the gradient (fp32, bf16 or fp16, multiplied by `grad_scale`, which
// folds the loss-scale unscaling and the clipping coefficient together), write the new master
// weights and state in place and, in the same pass, a bf16/fp16 copy of the new weights into a
// caller-given buffer (the pinned staging buffer the device reads). AdamW runs on AVX-512, AVX2
// or scalar code chosen at run time (CpuExec::simd), all bit-identical (optim/optim_math.h, Note
// [Explicit fma]); SGD and Lion run the scalar element functions in parallel. Results do not
// depend on the thread count (optim/cpu_exec.h, Note [Blocks] in optim/cpu_exec.h).
//
// Non-finite gradients are not looked for here: the caller runs grad_stats() first (it needs the
// norm for clipping anyway) and skips the step on overflow (optim/optimizer_phase.h does both).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "optim/cpu_exec.h"
#include "optim/optim_math.h"

namespace strata::optim {

enum class BiasCorrection : std::uint8_t { On, Off };

// torch.optim.AdamW defaults, except weight_decay (0.01 there as well).
struct AdamParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  WeightDecayMode weight_decay_mode = WeightDecayMode::Decoupled;  // Decoupled = AdamW, L2 = Adam
  BiasCorrection bias_correction = BiasCorrection::On;
};

struct SgdParams {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

struct LionParams {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double weight_decay = 0.0;
};

// Each throws ConfigError naming `where`, the parameter, its value and the allowed range:
// lr >= 0, betas and momentum in [0, 1), eps > 0, weight_decay >= 0, all finite.
void validate(const AdamParams& params, std::string_view where);
void validate(const SgdParams& params, std::string_view where);
void validate(const LionParams& params, std::string_view where);

// The per-step scalars, computed in double and rounded to float once. `step` counts from 1.
AdamStepConsts make_adam_consts(const AdamParams& params, std::int64_t step, float grad_scale);
SgdStepConsts make_sgd_consts(const SgdParams& params, std::int64_t step, float grad_scale);
LionStepConsts make_lion_consts(const LionParams& params, float grad_scale);

// A gradient in its stored type.
struct GradRef {
  const void* data = nullptr;
  DType dtype = DType::F32;
};

// Optional low-precision copy of the new weights: data == nullptr means none. dtype BF16 or F16.
struct LowPrecisionOut {
  void* data = nullptr;
  DType dtype = DType::BF16;
};

// One flat shard. master.size() is the element count; the other buffers have as many elements.
// moment1 is Adam's exp_avg, SGD's momentum buffer (may be empty when momentum == 0) and Lion's
// exp_avg; moment2 is Adam's exp_avg_sq and empty for SGD and Lion.
struct OptimShard {
  std::span<float> master;
  std::span<float> moment1;
  std::span<float> moment2;
  GradRef grad;
  LowPrecisionOut out;
};

// One AdamW/Adam step over all shards. Throws ConfigError if a shard's buffers disagree in size
// or a dtype is not allowed.
void adam_step(const AdamStepConsts& consts, WeightDecayMode mode, std::span<const OptimShard> shards,
               const CpuExec& exec);
void sgd_step(const SgdStepConsts& consts, std::span<const OptimShard> shards, const CpuExec& exec);
void lion_step(const LionStepConsts& consts, std::span<const OptimShard> shards, const CpuExec& exec);

enum class OptimizerKind : std::uint8_t { AdamW, Adam, Sgd, Lion };
std::string_view optimizer_name(OptimizerKind kind);
// fp32 arrays per state element: master and moment1, plus moment2 for Adam and AdamW.
int state_arrays(OptimizerKind kind);

// A param group: which optimizer, its hyper-parameters and its step counter. The engine keeps one
// per group of parameters (DeepSpeed/torch "param_groups"); a skipped step (overflow) does not
// advance the counter.
class ParamGroup {
 public:
  // Validates the hyper-parameters (ConfigError naming `name`). kind Adam forces L2 decay,
  // AdamW forces decoupled decay.
  static ParamGroup adam(std::string name, OptimizerKind kind, const AdamParams& params);
  static ParamGroup sgd(std::string name, const SgdParams& params);
  static ParamGroup lion(std::string name, const LionParams& params);

  const std::string& name() const { return name_; }
  OptimizerKind kind() const { return kind_; }
  const AdamParams& adam_params() const { return adam_; }
  const SgdParams& sgd_params() const { return sgd_; }
  const LionParams& lion_params() const { return lion_; }
  std::int64_t step_count() const { return step_count_; }
  // For checkpoint restore.
  void set_step_count(std::int64_t steps) { step_count_ = steps; }
  // Learning-rate schedulers change lr between steps; validated like the rest.
  void set_lr(double lr);

  // Advances the step counter and updates the shards with this group's optimizer.
  void step(std::span<const OptimShard> shards, float grad_scale, const CpuExec& exec);
  // Updates the shards as step number `step` (counting from 1) without touching the counter: an
  // engine that updates its state piece by piece calls it per piece, then set_step_count(step).
  void apply(std::span<const OptimShard> shards, float grad_scale, std::int64_t step, const CpuExec& exec) const;

 private:
  ParamGroup(std::string name, OptimizerKind kind) : name_(std::move(name)), kind_(kind) {}

  std::string name_;
  OptimizerKind kind_;
  AdamParams adam_;
  SgdParams sgd_;
  LionParams lion_;
  std::int64_t step_count_ = 0;
};

}  // namespace strata::optim
