// Rotary position embedding frequencies: the base theta and Hugging Face's `rope_scaling`, as one
// plain value the model config holds and the CPU and CUDA rope kernels take (STRATA_HD, so the host
// tests run the math the GPU runs).
//
// Frequency of pair i of a head of head_dim (rotate_half convention: pair i couples elements i and
// i + head_dim/2) is f_i = theta^(-2i/head_dim), then scaled as transformers'
// ROPE_INIT_FUNCTIONS do (modeling_rope_utils.py):
//   linear  f_i / factor (position interpolation);
//   llama3  wavelength w_i = 2 pi / f_i against the original context L: w_i < L / high_freq_factor
//           keeps f_i, w_i > L / low_freq_factor gives f_i / factor, between them the blend
//           (1 - s) f_i / factor + s f_i with s = (L / w_i - low_freq_factor) / (high - low).
// Both keep transformers' attention scaling of 1. Other kinds (dynamic, yarn, longrope) are refused
// where a config names them (models/hf_config.cc).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace strata::models {

enum class RopeScaling : int { None, Linear, Llama3 };

struct RopeSpec {
  float theta = 10000.0f;
  RopeScaling scaling = RopeScaling::None;
  float factor = 1.0f;                     // linear, llama3
  float low_freq_factor = 1.0f;            // llama3
  float high_freq_factor = 4.0f;           // llama3
  float original_max_positions = 8192.0f;  // llama3: the context the model was trained at
  bool operator==(const RopeSpec&) const = default;
};

namespace math {

STRATA_HD float rope_inv_freq(int i, int head_dim, const RopeSpec& r) {
  const float f = 1.0f / powf(r.theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  if (r.scaling == RopeScaling::Linear) return f / r.factor;
  if (r.scaling != RopeScaling::Llama3) return f;
  const float wavelen = 6.283185307179586f / f;
  if (wavelen < r.original_max_positions / r.high_freq_factor) return f;
  if (wavelen > r.original_max_positions / r.low_freq_factor) return f / r.factor;
  const float smooth =
      (r.original_max_positions / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  return (1.0f - smooth) * f / r.factor + smooth * f;
}

// The rotation angle of pair `i` at position t.
STRATA_HD float rope_angle(std::int64_t t, int i, int head_dim, const RopeSpec& r) {
  return static_cast<float>(t) * rope_inv_freq(i, head_dim, r);
}

}  // namespace math
}  // namespace strata::models
