// The AVX-512 (F+BW+VL) per-block kernels, 16 floats per vector: the vector traits for the one
// body of the SIMD kernels (see Note [One SIMD body] in optim/cpu_kernels_simd.h), compiled for
// this instruction set with a GCC target pragma, so the rest of the binary stays baseline x86-64.
// The bf16 rounding is core/dtype_simd.h's, bit-identical to the scalar path.
// GCC 12 warns about the deliberately undefined pass-through operand inside its own
// _mm512_sqrt_ps / _mm512_cvtps_ph (GCC bug 105593); the warning is about the header, not us.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstddef>

#include "core/dtype_simd.h"
#include "optim/cpu_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")

#include "optim/cpu_kernels_simd.h"

namespace strata::optim::detail {
namespace {

struct Avx512 {
  STRATA_SIMD_FLOAT_OPS(__m512, _mm512)
  [[gnu::always_inline]] static F load(const bf16* g) { return _mm512_castsi512_ps(dtype_simd::bf16_widen_avx512(g)); }
  [[gnu::always_inline]] static F load(const fp16* g) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
  }

  // f32_to_bf16 of core/dtype.h on 16 lanes, then 32 -> 16 bit truncation (values are < 2^16).
  [[gnu::always_inline]] static void store_bf16(bf16* out, F x) {
    const __m512i bits = dtype_simd::bf16_round_avx512(_mm512_castps_si512(x));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(bits));
  }
  // vcvtps2ph rounds to nearest even with fp16 subnormals and quiets NaNs keeping the top payload
  // bits: the same bits as f32_to_f16.
  [[gnu::always_inline]] static void store_f16(fp16* out, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

  using Flags = __mmask16;  // a bit set for a lane that has seen a non-finite value
  [[gnu::always_inline]] static Flags no_flags() { return 0; }
  [[gnu::always_inline]] static Flags add_nonfinite(Flags any, F x) {
    const __m512i exp_mask = _mm512_set1_epi32(0x7F800000);
    const __m512i u = _mm512_castps_si512(x);
    return static_cast<__mmask16>(any | _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exp_mask), exp_mask));
  }
  [[gnu::always_inline]] static bool any_flag(Flags any) { return any != 0; }

  struct Squares {
    __m512d lanes_lo;  // lanes 0..7
    __m512d lanes_hi;  // lanes 8..15
  };
  [[gnu::always_inline]] static Squares no_squares() { return {_mm512_setzero_pd(), _mm512_setzero_pd()}; }
  template <typename G>
  [[gnu::always_inline]] static void add_squares(Squares& s, const G* g) {
    const __m512 x = load(g);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    s.lanes_lo = _mm512_fmadd_pd(lo, lo, s.lanes_lo);
    s.lanes_hi = _mm512_fmadd_pd(hi, hi, s.lanes_hi);
  }
  [[gnu::always_inline]] static void store_squares(double* lanes, const Squares& s) {
    _mm512_store_pd(lanes, s.lanes_lo);
    _mm512_store_pd(lanes + 8, s.lanes_hi);
  }
};

}  // namespace
}  // namespace strata::optim::detail

#pragma GCC pop_options

namespace strata::optim::detail {

const KernelSet& avx512_kernels() {
  static const KernelSet set = simd::kernel_set<Avx512>(SimdLevel::Avx512);
  return set;
}

}  // namespace strata::optim::detail
