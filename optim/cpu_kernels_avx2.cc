// The AVX2 (+FMA, F16C) per-block kernels, 8 floats per vector, compiled with a GCC target
// attribute. Same structure and the same bit-exact arithmetic as optim/cpu_kernels_avx512.cc
// (see the note there and Note [Explicit fma] in optim/optim_math.h); only the width and the
// bf16 packing instructions differ.
#include <immintrin.h>

#include <cstdint>

#include "optim/cpu_kernels.h"

#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace strata::optim::detail {
namespace {

enum class Out { None, BF16, F16 };

STRATA_AVX2 inline __m256 load8(const float* g) { return _mm256_loadu_ps(g); }

STRATA_AVX2 inline __m256 load8(const bf16* g) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

STRATA_AVX2 inline __m256 load8(const fp16* g) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g)));
}

// f32_to_bf16 of core/dtype.h on 8 lanes, then 32 -> 16 bit packing (values are < 2^16, so the
// unsigned saturation of packus never fires).
STRATA_AVX2 inline void store8_bf16(void* out, __m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i quiet_nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  // abs(u) fits in a positive int32, so the signed compare is the unsigned one.
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                            _mm256_set1_epi32(0x7F800000));
  const __m256i bits = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // packus works per 128-bit lane: qwords 0 and 2 hold elements 0..3 and 4..7.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
  _mm_storeu_si128(static_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
}

STRATA_AVX2 inline void store8_f16(void* out, __m256 x) {
  _mm_storeu_si128(static_cast<__m128i*>(out), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <Out kOut>
STRATA_AVX2 inline void store_out(void* out, std::size_t i, __m256 x) {
  if constexpr (kOut == Out::BF16) {
    store8_bf16(static_cast<bf16*>(out) + i, x);
  } else if constexpr (kOut == Out::F16) {
    store8_f16(static_cast<fp16*>(out) + i, x);
  }
}

template <WeightDecayMode kMode, typename G, Out kOut>
STRATA_AVX2 void adam_body(const AdamStepConsts& c, const AdamBlock& b) {
  // Locals, so the stores below cannot alias the block descriptor and force reloads.
  const G* __restrict g = static_cast<const G*>(b.g);
  float* __restrict pp = b.p;
  float* __restrict mp = b.m;
  float* __restrict vp = b.v;
  void* const out = b.out;
  const std::size_t n = b.n;
  const __m256 grad_scale = _mm256_set1_ps(c.grad_scale);
  const __m256 beta1 = _mm256_set1_ps(c.beta1);
  const __m256 one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 neg_step_size = _mm256_set1_ps(c.neg_step_size);
  const __m256 inv_bc2_sqrt = _mm256_set1_ps(c.inv_bias_correction2_sqrt);
  const __m256 eps = _mm256_set1_ps(c.eps);
  const __m256 decay = _mm256_set1_ps(c.decay);
  const __m256 l2_wd = _mm256_set1_ps(c.l2_weight_decay);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 p = _mm256_loadu_ps(pp + i);
    __m256 gv = _mm256_mul_ps(load8(g + i), grad_scale);
    if constexpr (kMode == WeightDecayMode::L2) gv = _mm256_fmadd_ps(l2_wd, p, gv);
    const __m256 m = _mm256_fmadd_ps(beta1, _mm256_loadu_ps(mp + i), _mm256_mul_ps(one_minus_beta1, gv));
    const __m256 v = _mm256_fmadd_ps(beta2, _mm256_loadu_ps(vp + i),
                                     _mm256_mul_ps(one_minus_beta2, _mm256_mul_ps(gv, gv)));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), inv_bc2_sqrt, eps);
    const __m256 update = _mm256_div_ps(m, denom);
    if constexpr (kMode == WeightDecayMode::Decoupled) p = _mm256_mul_ps(p, decay);
    p = _mm256_fmadd_ps(neg_step_size, update, p);
    _mm256_storeu_ps(pp + i, p);
    _mm256_storeu_ps(mp + i, m);
    _mm256_storeu_ps(vp + i, v);
    store_out<kOut>(out, i, p);
  }
  adam_tail<kMode>(c, b, i);
}

template <WeightDecayMode kMode, typename G>
void adam_out(const AdamStepConsts& c, const AdamBlock& b) {
  if (b.out == nullptr) return adam_body<kMode, G, Out::None>(c, b);
  if (b.out_dtype == DType::BF16) return adam_body<kMode, G, Out::BF16>(c, b);
  return adam_body<kMode, G, Out::F16>(c, b);
}

template <WeightDecayMode kMode>
void adam_grad(const AdamStepConsts& c, const AdamBlock& b) {
  switch (b.g_dtype) {
    case DType::F32: return adam_out<kMode, float>(c, b);
    case DType::BF16: return adam_out<kMode, bf16>(c, b);
    case DType::F16: return adam_out<kMode, fp16>(c, b);
  }
}

void adam_avx2(const AdamStepConsts& c, WeightDecayMode mode, const AdamBlock& b) {
  if (mode == WeightDecayMode::L2 && c.l2_weight_decay != 0.0f) return adam_grad<WeightDecayMode::L2>(c, b);
  return adam_grad<WeightDecayMode::Decoupled>(c, b);
}

template <typename G>
STRATA_AVX2 void memory_pass_body(const AdamBlock& b) {
  const G* __restrict g = static_cast<const G*>(b.g);
  float* __restrict pp = b.p;
  float* __restrict mp = b.m;
  float* __restrict vp = b.v;
  const std::size_t n = b.n;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = load8(g + i);
    const __m256 m = _mm256_add_ps(_mm256_loadu_ps(mp + i), gv);
    const __m256 v = _mm256_add_ps(_mm256_loadu_ps(vp + i), gv);
    const __m256 p = _mm256_add_ps(_mm256_loadu_ps(pp + i), m);
    _mm256_storeu_ps(pp + i, p);
    _mm256_storeu_ps(mp + i, m);
    _mm256_storeu_ps(vp + i, v);
  }
  memory_pass_tail(b, i);
}

void memory_pass_avx2(const AdamBlock& b) {
  switch (b.g_dtype) {
    case DType::F32: return memory_pass_body<float>(b);
    case DType::BF16: return memory_pass_body<bf16>(b);
    case DType::F16: return memory_pass_body<fp16>(b);
  }
}

template <typename G>
STRATA_AVX2 double sum_squares_body(const void* data, DType dtype, std::size_t n) {
  const G* g = static_cast<const G*>(data);
  __m256d lanes0 = _mm256_setzero_pd();  // lanes 0..3
  __m256d lanes1 = _mm256_setzero_pd();  // lanes 4..7
  __m256d lanes2 = _mm256_setzero_pd();  // lanes 8..11
  __m256d lanes3 = _mm256_setzero_pd();  // lanes 12..15
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 x0 = load8(g + i);
    const __m256 x1 = load8(g + i + 8);
    const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x0));
    const __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1));
    const __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(x1));
    const __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1));
    lanes0 = _mm256_fmadd_pd(d0, d0, lanes0);
    lanes1 = _mm256_fmadd_pd(d1, d1, lanes1);
    lanes2 = _mm256_fmadd_pd(d2, d2, lanes2);
    lanes3 = _mm256_fmadd_pd(d3, d3, lanes3);
  }
  alignas(32) double lanes[kSumLanes];
  _mm256_store_pd(lanes, lanes0);
  _mm256_store_pd(lanes + 4, lanes1);
  _mm256_store_pd(lanes + 8, lanes2);
  _mm256_store_pd(lanes + 12, lanes3);
  sum_squares_tail(data, dtype, i, n, lanes);
  return combine_lanes(lanes);
}

double sum_squares_avx2(const void* g, DType dtype, std::size_t n) {
  switch (dtype) {
    case DType::F32: return sum_squares_body<float>(g, dtype, n);
    case DType::BF16: return sum_squares_body<bf16>(g, dtype, n);
    case DType::F16: return sum_squares_body<fp16>(g, dtype, n);
  }
  return 0.0;
}

STRATA_AVX2 void scale_inplace_avx2(float* g, std::size_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), s));
  for (; i < n; ++i) g[i] *= scale;
}

template <typename G>
STRATA_AVX2 void widen_scale_body(const void* data, float* out, std::size_t n, float scale, DType dtype) {
  const G* g = static_cast<const G*>(data);
  const __m256 s = _mm256_set1_ps(scale);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(load8(g + i), s));
  for (; i < n; ++i) out[i] = load_grad(data, dtype, i) * scale;
}

void widen_scale_avx2(const void* g, DType dtype, float* out, std::size_t n, float scale) {
  switch (dtype) {
    case DType::F32: return widen_scale_body<float>(g, out, n, scale, dtype);
    case DType::BF16: return widen_scale_body<bf16>(g, out, n, scale, dtype);
    case DType::F16: return widen_scale_body<fp16>(g, out, n, scale, dtype);
  }
}

STRATA_AVX2 bool has_nonfinite_avx2(const float* g, std::size_t n) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7F800000);
  __m256i any = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(g + i));
    any = _mm256_or_si256(any, _mm256_cmpeq_epi32(_mm256_and_si256(u, exp_mask), exp_mask));
  }
  bool found = _mm256_testz_si256(any, any) == 0;
  for (; i < n; ++i) found = found || (f32_bits(g[i]) & 0x7F800000u) == 0x7F800000u;
  return found;
}

STRATA_AVX2 void pack_avx2(const float* p, void* out, DType dtype, std::size_t n) {
  std::size_t i = 0;
  if (dtype == DType::BF16) {
    for (; i + 8 <= n; i += 8) store8_bf16(static_cast<bf16*>(out) + i, _mm256_loadu_ps(p + i));
  } else if (dtype == DType::F16) {
    for (; i + 8 <= n; i += 8) store8_f16(static_cast<fp16*>(out) + i, _mm256_loadu_ps(p + i));
  }
  for (; i < n; ++i) store_low(out, dtype, i, p[i]);
}

}  // namespace

const KernelSet& avx2_kernels() {
  static const KernelSet set{SimdLevel::Avx2,  adam_avx2,          memory_pass_avx2,
                             sum_squares_avx2, scale_inplace_avx2, widen_scale_avx2,
                             has_nonfinite_avx2, pack_avx2};
  return set;
}

}  // namespace strata::optim::detail
