// Internal: the one body of the SIMD per-block kernels of optim/cpu_kernels.h, written once over a
// vector traits struct V and compiled once per instruction set: optim/cpu_kernels_avx2.cc and
// optim/cpu_kernels_avx512.cc each include this header after their `#pragma GCC target(...)` and
// instantiate kernel_set<V>() with their own traits.
//
// Note [One SIMD body]: a traits struct V gives one instruction set's vector of floats and the few
// operations the kernels use:
//   F, kWidth                         the float vector and its number of lanes
//   set1, load (float, bf16, fp16), store, add, mul, div, fmadd(a, b, c) = a * b + c, sqrt
//                                     (all but the 16-bit loads from STRATA_SIMD_FLOAT_OPS below)
//   store_bf16, store_f16             f32_to_bf16 / f32_to_f16 of core/dtype.h on every lane
//   Flags, no_flags, add_nonfinite, any_flag   "some lane had an all-ones exponent", accumulated
//   Squares, no_squares, add_squares, store_squares   kSumLanes double accumulators: add_squares
//                                     adds the squares of g[0..kSumLanes) to lanes 0..kSumLanes-1
// Every operation is one instruction (or the integer rounding of core/dtype_simd.h), and the
// bodies below call them in the order optim/optim_math.h writes the element math (see
// Note [Explicit fma] in optim/optim_math.h), so every path gives the scalar path's bits. The
// traits' members are always_inline: a body instantiated outside its target pragma then fails to
// compile instead of running slowly.
//
// Each traits struct lives in its file's anonymous namespace, so every instantiation here has
// internal linkage: no AVX-512 copy of a template can stand in for the AVX2 one at link time. The
// scalar tails (optim/cpu_kernels.h) are included before the pragma and stay baseline code.
#pragma once

#include <cstddef>

#include "optim/cpu_kernels.h"

// The traits' one-instruction float operations, the same for __m256 and __m512 but for the prefix
// of the intrinsics' names: STRATA_SIMD_FLOAT_OPS(__m256, _mm256) inside the traits struct.
#define STRATA_SIMD_FLOAT_OPS(VEC, PREFIX)                                                               \
  using F = VEC;                                                                                          \
  static constexpr std::size_t kWidth = sizeof(VEC) / sizeof(float);                                      \
  [[gnu::always_inline]] static F set1(float x) { return PREFIX##_set1_ps(x); }                           \
  [[gnu::always_inline]] static F load(const float* p) { return PREFIX##_loadu_ps(p); }                   \
  [[gnu::always_inline]] static void store(float* p, F x) { PREFIX##_storeu_ps(p, x); }                   \
  [[gnu::always_inline]] static F add(F a, F b) { return PREFIX##_add_ps(a, b); }                         \
  [[gnu::always_inline]] static F mul(F a, F b) { return PREFIX##_mul_ps(a, b); }                         \
  [[gnu::always_inline]] static F div(F a, F b) { return PREFIX##_div_ps(a, b); }                         \
  [[gnu::always_inline]] static F fmadd(F a, F b, F c) { return PREFIX##_fmadd_ps(a, b, c); }             \
  [[gnu::always_inline]] static F sqrt(F x) { return PREFIX##_sqrt_ps(x); }

namespace strata::optim::detail::simd {

enum class Out { None, BF16, F16 };

template <class V, Out kOut>
inline void store_out(void* out, std::size_t i, typename V::F x) {
  if constexpr (kOut == Out::BF16) {
    V::store_bf16(static_cast<bf16*>(out) + i, x);
  } else if constexpr (kOut == Out::F16) {
    V::store_f16(static_cast<fp16*>(out) + i, x);
  }
}

template <class V, WeightDecayMode kMode, typename G, Out kOut>
void adam_body(const AdamStepConsts& c, const AdamBlock& b) {
  using F = typename V::F;
  // Locals, so the stores below cannot alias the block descriptor and force reloads.
  const G* __restrict g = static_cast<const G*>(b.g);
  float* __restrict pp = b.p;
  float* __restrict mp = b.m;
  float* __restrict vp = b.v;
  void* const out = b.out;
  const std::size_t n = b.n;
  const F grad_scale = V::set1(c.grad_scale);
  const F beta1 = V::set1(c.beta1);
  const F one_minus_beta1 = V::set1(c.one_minus_beta1);
  const F beta2 = V::set1(c.beta2);
  const F one_minus_beta2 = V::set1(c.one_minus_beta2);
  const F neg_step_size = V::set1(c.neg_step_size);
  const F inv_bc2_sqrt = V::set1(c.inv_bias_correction2_sqrt);
  const F eps = V::set1(c.eps);
  const F decay = V::set1(c.decay);
  const F l2_wd = V::set1(c.l2_weight_decay);
  std::size_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    F p = V::load(pp + i);
    F gv = V::mul(V::load(g + i), grad_scale);
    if constexpr (kMode == WeightDecayMode::L2) gv = V::fmadd(l2_wd, p, gv);
    const F m = V::fmadd(beta1, V::load(mp + i), V::mul(one_minus_beta1, gv));
    const F v = V::fmadd(beta2, V::load(vp + i), V::mul(one_minus_beta2, V::mul(gv, gv)));
    const F denom = V::fmadd(V::sqrt(v), inv_bc2_sqrt, eps);
    const F update = V::div(m, denom);
    if constexpr (kMode == WeightDecayMode::Decoupled) p = V::mul(p, decay);
    p = V::fmadd(neg_step_size, update, p);
    V::store(pp + i, p);
    V::store(mp + i, m);
    V::store(vp + i, v);
    store_out<V, kOut>(out, i, p);
  }
  adam_tail<kMode>(c, b, i);
}

template <class V, WeightDecayMode kMode, typename G>
void adam_out(const AdamStepConsts& c, const AdamBlock& b) {
  if (b.out == nullptr) return adam_body<V, kMode, G, Out::None>(c, b);
  if (b.out_dtype == DType::BF16) return adam_body<V, kMode, G, Out::BF16>(c, b);
  return adam_body<V, kMode, G, Out::F16>(c, b);
}

template <class V, WeightDecayMode kMode>
void adam_grad(const AdamStepConsts& c, const AdamBlock& b) {
  switch (b.g_dtype) {
    case DType::F32: return adam_out<V, kMode, float>(c, b);
    case DType::BF16: return adam_out<V, kMode, bf16>(c, b);
    case DType::F16: return adam_out<V, kMode, fp16>(c, b);
  }
}

template <class V>
void adam(const AdamStepConsts& c, WeightDecayMode mode, const AdamBlock& b) {
  // L2 with no decay is exactly the decoupled update with decay 1 (adam_element skips it too).
  if (mode == WeightDecayMode::L2 && c.l2_weight_decay != 0.0f) return adam_grad<V, WeightDecayMode::L2>(c, b);
  return adam_grad<V, WeightDecayMode::Decoupled>(c, b);
}

template <class V, typename G>
void memory_pass_body(const AdamBlock& b) {
  using F = typename V::F;
  const G* __restrict g = static_cast<const G*>(b.g);
  float* __restrict pp = b.p;
  float* __restrict mp = b.m;
  float* __restrict vp = b.v;
  const std::size_t n = b.n;
  std::size_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    const F gv = V::load(g + i);
    const F m = V::add(V::load(mp + i), gv);
    const F v = V::add(V::load(vp + i), gv);
    const F p = V::add(V::load(pp + i), m);
    V::store(pp + i, p);
    V::store(mp + i, m);
    V::store(vp + i, v);
  }
  memory_pass_tail(b, i);
}

template <class V>
void memory_pass(const AdamBlock& b) {
  switch (b.g_dtype) {
    case DType::F32: return memory_pass_body<V, float>(b);
    case DType::BF16: return memory_pass_body<V, bf16>(b);
    case DType::F16: return memory_pass_body<V, fp16>(b);
  }
}

template <class V, typename G>
double sum_squares_body(const void* data, DType dtype, std::size_t n) {
  const G* g = static_cast<const G*>(data);
  typename V::Squares acc = V::no_squares();
  std::size_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) V::add_squares(acc, g + i);
  alignas(64) double lanes[kSumLanes];
  V::store_squares(lanes, acc);
  sum_squares_tail(data, dtype, i, n, lanes);
  return combine_lanes(lanes);
}

template <class V>
double sum_squares(const void* g, DType dtype, std::size_t n) {
  switch (dtype) {
    case DType::F32: return sum_squares_body<V, float>(g, dtype, n);
    case DType::BF16: return sum_squares_body<V, bf16>(g, dtype, n);
    case DType::F16: return sum_squares_body<V, fp16>(g, dtype, n);
  }
  return 0.0;
}

template <class V>
void scale_inplace(float* g, std::size_t n, float scale) {
  const typename V::F s = V::set1(scale);
  std::size_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) V::store(g + i, V::mul(V::load(g + i), s));
  for (; i < n; ++i) g[i] *= scale;
}

template <class V, typename G>
void widen_scale_body(const void* data, float* out, std::size_t n, float scale, DType dtype) {
  const G* g = static_cast<const G*>(data);
  const typename V::F s = V::set1(scale);
  std::size_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) V::store(out + i, V::mul(V::load(g + i), s));
  for (; i < n; ++i) out[i] = load_grad(data, dtype, i) * scale;
}

template <class V>
void widen_scale(const void* g, DType dtype, float* out, std::size_t n, float scale) {
  switch (dtype) {
    case DType::F32: return widen_scale_body<V, float>(g, out, n, scale, dtype);
    case DType::BF16: return widen_scale_body<V, bf16>(g, out, n, scale, dtype);
    case DType::F16: return widen_scale_body<V, fp16>(g, out, n, scale, dtype);
  }
}

template <class V>
bool has_nonfinite(const float* g, std::size_t n) {
  typename V::Flags any = V::no_flags();
  std::size_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) any = V::add_nonfinite(any, V::load(g + i));
  bool found = V::any_flag(any);
  for (; i < n; ++i) found = found || (f32_bits(g[i]) & 0x7F800000u) == 0x7F800000u;
  return found;
}

template <class V>
void pack(const float* p, void* out, DType dtype, std::size_t n) {
  std::size_t i = 0;
  if (dtype == DType::BF16) {
    for (; i + V::kWidth <= n; i += V::kWidth) V::store_bf16(static_cast<bf16*>(out) + i, V::load(p + i));
  } else if (dtype == DType::F16) {
    for (; i + V::kWidth <= n; i += V::kWidth) V::store_f16(static_cast<fp16*>(out) + i, V::load(p + i));
  }
  for (; i < n; ++i) store_low(out, dtype, i, p[i]);
}

template <class V>
KernelSet kernel_set(SimdLevel level) {
  return KernelSet{level,          adam<V>,          memory_pass<V>, sum_squares<V>,
                   scale_inplace<V>, widen_scale<V>, has_nonfinite<V>, pack<V>};
}

}  // namespace strata::optim::detail::simd
