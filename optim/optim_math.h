// The per-element math of every optimizer, written once as STRATA_HD functions: the CPU scalar
// path, the tail of the SIMD paths, the CUDA kernel (optim/adam_kernel.cu) and the tests'
// reference all call these very functions, so "the same math on host and device" is true by
// construction rather than by review.
//
// Note [Explicit fma]: every product that feeds an addition is written as fmaf(), and no plain
// `a * b + c` is left anywhere in this file. GCC contracts a*b+c into an FMA in C++ (even with
// -std=c++20) inside functions compiled for an FMA target, nvcc does the same on the device, and
// the baseline x86-64 scalar path has no FMA instruction at all. With nothing left to contract,
// the scalar path, the AVX2/AVX-512 paths (which use _mm*_fmadd_ps at the same places) and the
// CUDA kernel round identically: the SIMD paths are bit-exact against the scalar path. The
// per-step scalars (bias corrections, step size) are computed once on the host in double by
// make_*_consts() and passed by value to every path, so they agree too.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace strata::optim {

// How Adam applies weight decay.
enum class WeightDecayMode : std::uint8_t {
  Decoupled,  // AdamW (torch.optim.AdamW): p *= 1 - lr * wd before the update
  L2,         // Adam (torch.optim.Adam): g += wd * p (decay through the moments)
};

// Everything one Adam step needs per element, precomputed for the step (see make_adam_consts in
// optim/optimizer.h). Plain floats so the struct crosses to the device by value.
struct AdamStepConsts {
  float grad_scale = 1.0f;        // multiplies the stored gradient: 1/loss_scale * clip coefficient
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float neg_step_size = -1e-3f;   // -lr / (1 - beta1^step)
  float inv_bias_correction2_sqrt = 1.0f;  // 1 / sqrt(1 - beta2^step)
  float eps = 1e-8f;
  float decay = 1.0f;             // 1 - lr * wd in Decoupled mode, exactly 1 otherwise
  float l2_weight_decay = 0.0f;   // wd in L2 mode, exactly 0 otherwise
};

// One AdamW/Adam element update, PyTorch semantics:
//   g  = g_stored * grad_scale            (+ wd * p in L2 mode)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g^2
//   p  = p * (1 - lr*wd) - step_size * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// eps is added after the square root, as in torch.optim.AdamW.
template <WeightDecayMode kMode>
STRATA_HD void adam_element(float& p, float& m, float& v, float g_stored, const AdamStepConsts& c) {
  float g = g_stored * c.grad_scale;
  if constexpr (kMode == WeightDecayMode::L2) {
    if (c.l2_weight_decay != 0.0f) g = fmaf(c.l2_weight_decay, p, g);  // 0 * Inf would be NaN
  }
  m = fmaf(c.beta1, m, c.one_minus_beta1 * g);
  v = fmaf(c.beta2, v, c.one_minus_beta2 * (g * g));
  const float denom = fmaf(sqrtf(v), c.inv_bias_correction2_sqrt, c.eps);
  const float update = m / denom;
  float decayed = p;
  if constexpr (kMode == WeightDecayMode::Decoupled) {
    decayed = p * c.decay;
  }
  p = fmaf(c.neg_step_size, update, decayed);
}

// SGD with momentum, torch.optim.SGD semantics (momentum buffer starts as the first gradient).
struct SgdStepConsts {
  float grad_scale = 1.0f;
  float lr = 1e-2f;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = false;  // the buffer is initialised to g instead of updated
};

STRATA_HD void sgd_element(float& p, float& buf, float g_stored, const SgdStepConsts& c) {
  float g = g_stored * c.grad_scale;
  if (c.weight_decay != 0.0f) g = fmaf(c.weight_decay, p, g);  // 0 * Inf would be NaN
  if (c.momentum != 0.0f) {
    if (c.first_step) {
      buf = g;
    } else {
      buf = fmaf(c.momentum, buf, c.one_minus_dampening * g);
    }
    g = c.nesterov ? fmaf(c.momentum, buf, g) : buf;
  }
  p = fmaf(-c.lr, g, p);
}

// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"):
//   p = p * (1 - lr*wd) - lr * sign(beta1 * m + (1 - beta1) * g);  m = beta2 * m + (1 - beta2) * g
struct LionStepConsts {
  float grad_scale = 1.0f;
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.99f;
  float one_minus_beta2 = 0.01f;
  float decay = 1.0f;  // 1 - lr * wd
};

STRATA_HD float sign_or_zero(float x) {
  if (x > 0.0f) return 1.0f;
  if (x < 0.0f) return -1.0f;
  return x;  // keeps 0, -0 and NaN (as torch.sign does)
}

STRATA_HD void lion_element(float& p, float& m, float g_stored, const LionStepConsts& c) {
  const float g = g_stored * c.grad_scale;
  const float direction = sign_or_zero(fmaf(c.beta1, m, c.one_minus_beta1 * g));
  p = fmaf(-c.lr, direction, p * c.decay);
  m = fmaf(c.beta2, m, c.one_minus_beta2 * g);
}

}  // namespace strata::optim
