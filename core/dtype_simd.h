// Internal: the fp32 <-> bf16 bit conversions of core/dtype.h on one AVX2 or AVX-512 vector, the
// one home of the integer rounding that the bulk conversions (core/dtype_bulk.cc) and the CPU
// optimizer kernels (optim/cpu_kernels_avx2.cc, optim/cpu_kernels_avx512.cc) both apply. Each
// function carries its GCC target attribute, so it inlines into any caller compiled for that
// instruction set or a wider one and the including file stays baseline x86-64.
//
// fp32 -> bf16 is the reference's integer rounding, (u + 0x7FFF + lsb) >> 16, with a NaN made quiet
// keeping its sign; AVX512_BF16's vcvtneps2bf16 is not used: it flushes fp32 denormals to zero,
// the reference rounds them. bf16 -> fp32 is a 16-bit shift.
#pragma once

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*() idiom once
// inlined (GCC bug 105593, fixed in 12.3/13); the warning's location is inside the header, so
// silencing it around the include covers exactly those lines and nothing of ours -- when this is
// the first inclusion of <immintrin.h> in the file, so a .cc file includes this header first.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "core/dtype.h"

#define STRATA_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define STRATA_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace strata::dtype_simd {

// 8 fp32 bit patterns -> 8 bf16 patterns in the low 16 bits of each 32-bit lane.
STRATA_TARGET_AVX2 inline __m256i bf16_round_avx2(__m256i u) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
  // |u| > Inf as signed compare: |u| <= 0x7FFFFFFF, so no lane is negative.
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                            _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

// 8 bf16 -> 8 fp32 bit patterns.
STRATA_TARGET_AVX2 inline __m256i bf16_widen_avx2(const bf16* src) {
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  return _mm256_slli_epi32(h, 16);
}

// 16 fp32 bit patterns -> 16 bf16 patterns in the low 16 bits of each 32-bit lane.
STRATA_TARGET_AVX512 inline __m512i bf16_round_avx512(__m512i u) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                    _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan);
}

// 16 bf16 -> 16 fp32 bit patterns.
STRATA_TARGET_AVX512 inline __m512i bf16_widen_avx512(const bf16* src) {
  const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  return _mm512_slli_epi32(h, 16);
}

}  // namespace strata::dtype_simd
