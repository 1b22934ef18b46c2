// Per-element math of the model ops, shared by the CPU kernels and the CUDA kernels.
//
// Every function here is STRATA_HD (core/hd.h): the CUDA kernels in models/kernels/*.cu call these
// very functions, so the host test suite exercises the math the GPU runs (docs/DESIGN.md, "The
// device abstraction"). Keep them small, branch-light and free of host-only calls.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace strata::models::math {

// GELU, tanh approximation (GPT-2's "gelu_new"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
STRATA_HD float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  const float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + cube)));
}

// d gelu_tanh / dx.
STRATA_HD float gelu_tanh_grad(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  const float inner = kSqrt2OverPi * (x + 0.044715f * x * x * x);
  const float t = tanhf(inner);
  const float sech2 = 1.0f - t * t;
  const float dinner = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * dinner;
}

STRATA_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// SiLU(g) * u and its two partial derivatives (LLaMA's MLP: down(silu(gate(x)) * up(x))).
STRATA_HD float swiglu(float gate, float up) { return gate * sigmoid(gate) * up; }
STRATA_HD float swiglu_dgate(float gate, float up, float dout) {
  const float s = sigmoid(gate);
  return dout * up * s * (1.0f + gate * (1.0f - s));
}
STRATA_HD float swiglu_dup(float gate, float dout) { return dout * gate * sigmoid(gate); }

// The cosine and sine of a rotary angle (models/kernels/rope_spec.h gives the angle).
STRATA_HD void rope_cos_sin(float angle, float* cos_a, float* sin_a) {
  *cos_a = cosf(angle);
  *sin_a = sinf(angle);
}

// Rotates the pair (x1, x2) by the angle whose cosine and sine are given. Backward rotates the
// gradient by the negative angle (pass -sin).
STRATA_HD void rope_rotate(float x1, float x2, float cos_a, float sin_a, float* out1, float* out2) {
  *out1 = x1 * cos_a - x2 * sin_a;
  *out2 = x2 * cos_a + x1 * sin_a;
}

// exp(x - shift): a softmax numerator with the row maximum (or the log-sum-exp) subtracted.
STRATA_HD float shifted_exp(float x, float shift) { return expf(x - shift); }

// Reciprocal standard deviation of a row of n elements from its sum of squares (layer norm: of the
// deviations from the mean; RMS norm: of the values): 1 / sqrt(sum_sq / n + eps).
STRATA_HD float norm_rstd(float sum_sq, float n, float eps) { return 1.0f / sqrtf(sum_sq / n + eps); }

// Layer norm of one element given the row's mean and reciprocal standard deviation.
STRATA_HD float layernorm_apply(float x, float mean, float rstd, float w, float b) {
  return (x - mean) * rstd * w + b;
}
STRATA_HD float layernorm_xhat(float x, float mean, float rstd) { return (x - mean) * rstd; }

// Layer-norm input gradient of one element: with g = dout * w and the row means of g and g * xhat,
// dx = (g - mean(g) - xhat * mean(g * xhat)) * rstd.
STRATA_HD float layernorm_dx(float g, float xhat, float g_mean, float g_xhat_mean, float rstd) {
  return (g - g_mean - xhat * g_xhat_mean) * rstd;
}

// RMS norm of one element: x * rstd * w; the normalized value alone is xhat = x * rstd.
STRATA_HD float rmsnorm_apply(float x, float rstd, float w) { return x * rstd * w; }
STRATA_HD float rmsnorm_xhat(float x, float rstd) { return x * rstd; }
// One term of the row sum behind the RMS-norm input gradient: dout * w * x * rstd (= g * xhat).
STRATA_HD float rmsnorm_dot_term(float dout, float w, float x, float rstd) { return dout * w * x * rstd; }
// RMS-norm input gradient of one element: (dout * w - xhat * mean(g * xhat)) * rstd.
STRATA_HD float rmsnorm_dx(float dout, float w, float xhat, float dot_mean, float rstd) {
  return (dout * w - xhat * dot_mean) * rstd;
}
// One row's contribution to the RMS-norm weight gradient: dout * x * rstd.
STRATA_HD float rmsnorm_dweight_term(float dout, float x, float rstd) { return dout * x * rstd; }

// The online-softmax running state of one attention query row (flash attention): running max `m`
// and running sum `l` of exp(s - m). Folding in a new tile maximum returns the factor by which the
// old sum and the old output accumulator must be scaled.
STRATA_HD float online_softmax_rescale(float m_old, float m_new) {
  // exp(-inf - finite) = 0 is what the first tile needs (nothing accumulated yet).
  return expf(m_old - m_new);
}

// Log-sum-exp of a finished online-softmax row: m + log(l). Saved for the backward pass.
STRATA_HD float online_softmax_lse(float m, float l) { return m + logf(l); }

// Attention backward: probability from a recomputed score and the saved log-sum-exp, and the score
// gradient dS = p * (dP - delta) with delta = sum_c dout * out of the query row.
STRATA_HD float attention_prob(float score, float lse) { return shifted_exp(score, lse); }
STRATA_HD float attention_dscore(float p, float dp, float delta) { return p * (dp - delta); }

// Cross-entropy loss of one row: log(sum_j exp(logit_j - row_max)) + row_max - logit[target].
STRATA_HD float cross_entropy_loss(float row_max, float sum, float target_logit) {
  return logf(sum) + row_max - target_logit;
}

// The gradient of softmax cross-entropy with respect to one logit: (p - [j == target]) * scale.
STRATA_HD float cross_entropy_dlogit(float logit, float row_max, float inv_sum, bool is_target, float scale) {
  const float p = shifted_exp(logit, row_max) * inv_sum;
  return (p - (is_target ? 1.0f : 0.0f)) * scale;
}

}  // namespace strata::models::math
