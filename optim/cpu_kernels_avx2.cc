// The AVX2 (+FMA, F16C) per-block kernels, 8 floats per vector: the vector traits for the one body
// of the SIMD kernels (see Note [One SIMD body] in optim/cpu_kernels_simd.h), compiled for this
// instruction set with a GCC target pragma, so the rest of the binary stays baseline x86-64.
#include <cstddef>

#include "core/dtype_simd.h"
#include "optim/cpu_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "optim/cpu_kernels_simd.h"

namespace strata::optim::detail {
namespace {

struct Avx2 {
  STRATA_SIMD_FLOAT_OPS(__m256, _mm256)
  [[gnu::always_inline]] static F load(const bf16* g) { return _mm256_castsi256_ps(dtype_simd::bf16_widen_avx2(g)); }
  [[gnu::always_inline]] static F load(const fp16* g) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g)));
  }

  // f32_to_bf16 of core/dtype.h on 8 lanes, then 32 -> 16 bit packing (values are < 2^16, so the
  // unsigned saturation of packus never fires).
  [[gnu::always_inline]] static void store_bf16(bf16* out, F x) {
    const __m256i bits = dtype_simd::bf16_round_avx2(_mm256_castps_si256(x));
    // packus works per 128-bit lane: qwords 0 and 2 hold elements 0..3 and 4..7.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
  }
  [[gnu::always_inline]] static void store_f16(fp16* out, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

  using Flags = __m256i;  // all-ones in a lane that has seen a non-finite value
  [[gnu::always_inline]] static Flags no_flags() { return _mm256_setzero_si256(); }
  [[gnu::always_inline]] static Flags add_nonfinite(Flags any, F x) {
    const __m256i exp_mask = _mm256_set1_epi32(0x7F800000);
    const __m256i u = _mm256_castps_si256(x);
    return _mm256_or_si256(any, _mm256_cmpeq_epi32(_mm256_and_si256(u, exp_mask), exp_mask));
  }
  [[gnu::always_inline]] static bool any_flag(Flags any) { return _mm256_testz_si256(any, any) == 0; }

  struct Squares {
    __m256d lanes0;  // lanes 0..3
    __m256d lanes1;  // lanes 4..7
    __m256d lanes2;  // lanes 8..11
    __m256d lanes3;  // lanes 12..15
  };
  [[gnu::always_inline]] static Squares no_squares() {
    return {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  }
  template <typename G>
  [[gnu::always_inline]] static void add_squares(Squares& s, const G* g) {
    const __m256 x0 = load(g);
    const __m256 x1 = load(g + 8);
    const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x0));
    const __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1));
    const __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(x1));
    const __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1));
    s.lanes0 = _mm256_fmadd_pd(d0, d0, s.lanes0);
    s.lanes1 = _mm256_fmadd_pd(d1, d1, s.lanes1);
    s.lanes2 = _mm256_fmadd_pd(d2, d2, s.lanes2);
    s.lanes3 = _mm256_fmadd_pd(d3, d3, s.lanes3);
  }
  [[gnu::always_inline]] static void store_squares(double* lanes, const Squares& s) {
    _mm256_store_pd(lanes, s.lanes0);
    _mm256_store_pd(lanes + 4, s.lanes1);
    _mm256_store_pd(lanes + 8, s.lanes2);
    _mm256_store_pd(lanes + 12, s.lanes3);
  }
};

}  // namespace
}  // namespace strata::optim::detail

#pragma GCC pop_options

namespace strata::optim::detail {

const KernelSet& avx2_kernels() {
  static const KernelSet set = simd::kernel_set<Avx2>(SimdLevel::Avx2);
  return set;
}

}  // namespace strata::optim::detail
