// The AVX-512 (F+BW+VL) per-block kernels, 16 floats per vector, compiled with a GCC target
// attribute so the rest of the binary stays baseline x86-64. The arithmetic mirrors
// optim/optim_math.h operation for operation (Note [Explicit fma] there), and the bf16 packing is
// the integer round-to-nearest-even of core/dtype.h, so every result is bit-identical to the
// scalar path. (vcvtneps2bf16 is not used: it flushes denormal inputs to zero.)
// GCC 12 warns about the deliberately undefined pass-through operand inside its own
// _mm512_sqrt_ps / _mm512_cvtps_ph (GCC bug 105593); the warning is about the header, not us.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>

#include "optim/cpu_kernels.h"

#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace strata::optim::detail {
namespace {

enum class Out { None, BF16, F16 };

STRATA_AVX512 inline __m512 load16(const float* g) { return _mm512_loadu_ps(g); }

STRATA_AVX512 inline __m512 load16(const bf16* g) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

STRATA_AVX512 inline __m512 load16(const fp16* g) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
}

// f32_to_bf16 of core/dtype.h on 16 lanes: (u + 0x7FFF + lsb) >> 16, NaN -> quiet NaN.
STRATA_AVX512 inline void store16_bf16(void* out, __m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __m512i quiet_nan = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                   _mm512_set1_epi32(0x7F800000));
  const __m512i bits = _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan);
  _mm256_storeu_si256(static_cast<__m256i*>(out), _mm512_cvtepi32_epi16(bits));
}

// vcvtps2ph rounds to nearest even with fp16 subnormals and quiets NaNs keeping the top payload
// bits: the same bits as f32_to_f16.
STRATA_AVX512 inline void store16_f16(void* out, __m512 x) {
  _mm256_storeu_si256(static_cast<__m256i*>(out), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <Out kOut>
STRATA_AVX512 inline void store_out(void* out, std::size_t i, __m512 x) {
  if constexpr (kOut == Out::BF16) {
    store16_bf16(static_cast<bf16*>(out) + i, x);
  } else if constexpr (kOut == Out::F16) {
    store16_f16(static_cast<fp16*>(out) + i, x);
  }
}

template <WeightDecayMode kMode, typename G, Out kOut>
STRATA_AVX512 void adam_body(const AdamStepConsts& c, const AdamBlock& b) {
  // Locals, so the stores below cannot alias the block descriptor and force reloads.
  const G* __restrict g = static_cast<const G*>(b.g);
  float* __restrict pp = b.p;
  float* __restrict mp = b.m;
  float* __restrict vp = b.v;
  void* const out = b.out;
  const std::size_t n = b.n;
  const __m512 grad_scale = _mm512_set1_ps(c.grad_scale);
  const __m512 beta1 = _mm512_set1_ps(c.beta1);
  const __m512 one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2);
  const __m512 one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 neg_step_size = _mm512_set1_ps(c.neg_step_size);
  const __m512 inv_bc2_sqrt = _mm512_set1_ps(c.inv_bias_correction2_sqrt);
  const __m512 eps = _mm512_set1_ps(c.eps);
  const __m512 decay = _mm512_set1_ps(c.decay);
  const __m512 l2_wd = _mm512_set1_ps(c.l2_weight_decay);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 p = _mm512_loadu_ps(pp + i);
    __m512 gv = _mm512_mul_ps(load16(g + i), grad_scale);
    if constexpr (kMode == WeightDecayMode::L2) gv = _mm512_fmadd_ps(l2_wd, p, gv);
    const __m512 m = _mm512_fmadd_ps(beta1, _mm512_loadu_ps(mp + i), _mm512_mul_ps(one_minus_beta1, gv));
    const __m512 v = _mm512_fmadd_ps(beta2, _mm512_loadu_ps(vp + i),
                                     _mm512_mul_ps(one_minus_beta2, _mm512_mul_ps(gv, gv)));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), inv_bc2_sqrt, eps);
    const __m512 update = _mm512_div_ps(m, denom);
    if constexpr (kMode == WeightDecayMode::Decoupled) p = _mm512_mul_ps(p, decay);
    p = _mm512_fmadd_ps(neg_step_size, update, p);
    _mm512_storeu_ps(pp + i, p);
    _mm512_storeu_ps(mp + i, m);
    _mm512_storeu_ps(vp + i, v);
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

void adam_avx512(const AdamStepConsts& c, WeightDecayMode mode, const AdamBlock& b) {
  // L2 with no decay is exactly the decoupled update with decay 1 (adam_element skips it too).
  if (mode == WeightDecayMode::L2 && c.l2_weight_decay != 0.0f) return adam_grad<WeightDecayMode::L2>(c, b);
  return adam_grad<WeightDecayMode::Decoupled>(c, b);
}

template <typename G>
STRATA_AVX512 void memory_pass_body(const AdamBlock& b) {
  const G* __restrict g = static_cast<const G*>(b.g);
  float* __restrict pp = b.p;
  float* __restrict mp = b.m;
  float* __restrict vp = b.v;
  const std::size_t n = b.n;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gv = load16(g + i);
    const __m512 m = _mm512_add_ps(_mm512_loadu_ps(mp + i), gv);
    const __m512 v = _mm512_add_ps(_mm512_loadu_ps(vp + i), gv);
    const __m512 p = _mm512_add_ps(_mm512_loadu_ps(pp + i), m);
    _mm512_storeu_ps(pp + i, p);
    _mm512_storeu_ps(mp + i, m);
    _mm512_storeu_ps(vp + i, v);
  }
  memory_pass_tail(b, i);
}

void memory_pass_avx512(const AdamBlock& b) {
  switch (b.g_dtype) {
    case DType::F32: return memory_pass_body<float>(b);
    case DType::BF16: return memory_pass_body<bf16>(b);
    case DType::F16: return memory_pass_body<fp16>(b);
  }
}

template <typename G>
STRATA_AVX512 double sum_squares_body(const void* data, DType dtype, std::size_t n) {
  const G* g = static_cast<const G*>(data);
  __m512d lanes_lo = _mm512_setzero_pd();  // lanes 0..7
  __m512d lanes_hi = _mm512_setzero_pd();  // lanes 8..15
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = load16(g + i);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    lanes_lo = _mm512_fmadd_pd(lo, lo, lanes_lo);
    lanes_hi = _mm512_fmadd_pd(hi, hi, lanes_hi);
  }
  alignas(64) double lanes[kSumLanes];
  _mm512_store_pd(lanes, lanes_lo);
  _mm512_store_pd(lanes + 8, lanes_hi);
  sum_squares_tail(data, dtype, i, n, lanes);
  return combine_lanes(lanes);
}

double sum_squares_avx512(const void* g, DType dtype, std::size_t n) {
  switch (dtype) {
    case DType::F32: return sum_squares_body<float>(g, dtype, n);
    case DType::BF16: return sum_squares_body<bf16>(g, dtype, n);
    case DType::F16: return sum_squares_body<fp16>(g, dtype, n);
  }
  return 0.0;
}

STRATA_AVX512 void scale_inplace_avx512(float* g, std::size_t n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_loadu_ps(g + i), s));
  for (; i < n; ++i) g[i] *= scale;
}

template <typename G>
STRATA_AVX512 void widen_scale_body(const void* data, float* out, std::size_t n, float scale, DType dtype) {
  const G* g = static_cast<const G*>(data);
  const __m512 s = _mm512_set1_ps(scale);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(load16(g + i), s));
  for (; i < n; ++i) out[i] = load_grad(data, dtype, i) * scale;
}

void widen_scale_avx512(const void* g, DType dtype, float* out, std::size_t n, float scale) {
  switch (dtype) {
    case DType::F32: return widen_scale_body<float>(g, out, n, scale, dtype);
    case DType::BF16: return widen_scale_body<bf16>(g, out, n, scale, dtype);
    case DType::F16: return widen_scale_body<fp16>(g, out, n, scale, dtype);
  }
}

STRATA_AVX512 bool has_nonfinite_avx512(const float* g, std::size_t n) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7F800000);
  __mmask16 any = 0;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(g + i));
    any = static_cast<__mmask16>(any | _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exp_mask), exp_mask));
  }
  bool found = any != 0;
  for (; i < n; ++i) found = found || (f32_bits(g[i]) & 0x7F800000u) == 0x7F800000u;
  return found;
}

STRATA_AVX512 void pack_avx512(const float* p, void* out, DType dtype, std::size_t n) {
  std::size_t i = 0;
  if (dtype == DType::BF16) {
    for (; i + 16 <= n; i += 16) store16_bf16(static_cast<bf16*>(out) + i, _mm512_loadu_ps(p + i));
  } else if (dtype == DType::F16) {
    for (; i + 16 <= n; i += 16) store16_f16(static_cast<fp16*>(out) + i, _mm512_loadu_ps(p + i));
  }
  for (; i < n; ++i) store_low(out, dtype, i, p[i]);
}

}  // namespace

const KernelSet& avx512_kernels() {
  static const KernelSet set{SimdLevel::Avx512,  adam_avx512,          memory_pass_avx512,
                             sum_squares_avx512, scale_inplace_avx512, widen_scale_avx512,
                             has_nonfinite_avx512, pack_avx512};
  return set;
}

}  // namespace strata::optim::detail
