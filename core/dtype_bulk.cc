// Vectorized fp32 <-> bf16/fp16 array conversions (see core/dtype_bulk.h).
//
// Each conversion has three bodies — scalar (the core/dtype.h functions in a loop), AVX2+F16C and
// AVX-512 F+BW+VL — compiled with GCC target attributes and picked at run time. The SIMD bodies
// reproduce the scalar bits exactly:
//  * fp32 -> bf16 uses the reference's integer rounding (core/dtype_simd.h).
//  * fp32 -> fp16 uses vcvtps2ph with round-to-nearest-even. Its NaN result (quiet bit set, top 10
//    payload bits kept, sign kept) already equals the reference's, as do overflow and subnormals.
//  * fp16 -> fp32 uses vcvtph2ps, which sets the quiet bit of a signaling NaN; the reference keeps
//    the payload as is (sign | 0x7F800000 | mant << 13), so Inf/NaN lanes are recomputed with
//    integer ops and blended in. (Inf lanes give the same bits either way.)
//  * bf16 -> fp32 is a 16-bit shift.
// Tails use masked loads/stores on AVX-512 and the scalar function on AVX2.
#include "core/dtype_bulk.h"

// Before anything that includes <immintrin.h> (oneTBB does): see GCC bug 105593 in dtype_simd.h.
#include "core/dtype_simd.h"

#include <algorithm>
#include <cstring>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "core/error.h"
#include "core/tsan.h"

namespace strata {
namespace {

using dtype_simd::bf16_round_avx2;
using dtype_simd::bf16_round_avx512;
using dtype_simd::bf16_widen_avx2;
using dtype_simd::bf16_widen_avx512;

// ---------------------------------------------------------------- scalar (the reference in a loop)

void f32_to_bf16_scalar(const float* src, bf16* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
void bf16_to_f32_scalar(const bf16* src, float* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
void f32_to_f16_scalar(const float* src, fp16* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}
void f16_to_f32_scalar(const fp16* src, float* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

// ---------------------------------------------------------------- AVX2 + F16C

STRATA_TARGET_AVX2 void f32_to_bf16_avx2(const float* src, bf16* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = bf16_round_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m256i b = bf16_round_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8)));
    // packus works per 128-bit lane: [a0-3 b0-3 a4-7 b4-7]; the permute restores element order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  f32_to_bf16_scalar(src + i, dst + i, n - i);
}

STRATA_TARGET_AVX2 void bf16_to_f32_avx2(const bf16* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bf16_widen_avx2(src + i));
  }
  bf16_to_f32_scalar(src + i, dst + i, n - i);
}

STRATA_TARGET_AVX2 void f32_to_f16_avx2(const float* src, fp16* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  f32_to_f16_scalar(src + i, dst + i, n - i);
}

STRATA_TARGET_AVX2 void f16_to_f32_avx2(const fp16* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256i converted = _mm256_castps_si256(_mm256_cvtph_ps(h));
    // Inf/NaN lanes: sign | 0x7F800000 | mant << 13, the reference's bits (see the file comment).
    const __m256i x = _mm256_cvtepu16_epi32(h);
    const __m256i special = _mm256_or_si256(
        _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x8000)), 16),
                        _mm256_set1_epi32(0x7F800000)),
        _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x3FF)), 13));
    const __m256i is_special =
        _mm256_cmpeq_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7C00)), _mm256_set1_epi32(0x7C00));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_blendv_epi8(converted, special, is_special));
  }
  f16_to_f32_scalar(src + i, dst + i, n - i);
}

// ---------------------------------------------------------------- AVX-512 F + BW + VL

STRATA_TARGET_AVX512 inline __mmask16 tail_mask16(std::size_t count) {
  return static_cast<__mmask16>((1u << count) - 1u);  // count < 16
}

STRATA_TARGET_AVX512 void f32_to_bf16_avx512(const float* src, bf16* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i r = bf16_round_avx512(_mm512_loadu_si512(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
  }
  if (i < n) {
    const __mmask16 m = tail_mask16(n - i);
    const __m512i r = bf16_round_avx512(_mm512_maskz_loadu_epi32(m, src + i));
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, r);
  }
}

STRATA_TARGET_AVX512 void bf16_to_f32_avx512(const bf16* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_si512(dst + i, bf16_widen_avx512(src + i));
  }
  if (i < n) {
    const __mmask16 m = tail_mask16(n - i);
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i));
    _mm512_mask_storeu_epi32(dst + i, m, _mm512_slli_epi32(h, 16));
  }
}

STRATA_TARGET_AVX512 void f32_to_f16_avx512(const float* src, fp16* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  if (i < n) {
    const __mmask16 m = tail_mask16(n - i);
    const __m256i h =
        _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(dst + i, m, h);
  }
}

STRATA_TARGET_AVX512 inline __m512i f16_to_f32_bits_avx512(__m256i h) {
  const __m512i converted = _mm512_castps_si512(_mm512_cvtph_ps(h));
  const __m512i x = _mm512_cvtepu16_epi32(h);
  const __m512i special = _mm512_or_si512(
      _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x8000)), 16),
                      _mm512_set1_epi32(0x7F800000)),
      _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x3FF)), 13));
  const __mmask16 is_special =
      _mm512_cmpeq_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7C00)), _mm512_set1_epi32(0x7C00));
  return _mm512_mask_blend_epi32(is_special, converted, special);
}

STRATA_TARGET_AVX512 void f16_to_f32_avx512(const fp16* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, f16_to_f32_bits_avx512(h));
  }
  if (i < n) {
    const __mmask16 m = tail_mask16(n - i);
    _mm512_mask_storeu_epi32(dst + i, m, f16_to_f32_bits_avx512(_mm256_maskz_loadu_epi16(m, src + i)));
  }
}

// ---------------------------------------------------------------- generic

// bf16 <-> fp16 goes through an fp32 block on the stack; the block is small enough to stay in L1.
constexpr std::size_t kBlockElems = 1024;

void convert_16_to_16(SimdLevel level, const void* src, DType src_dtype, void* dst, DType dst_dtype,
                      std::size_t n) {
  float block[kBlockElems];
  const auto* in = static_cast<const std::uint16_t*>(src);
  auto* out = static_cast<std::uint16_t*>(dst);
  for (std::size_t i = 0; i < n; i += kBlockElems) {
    const std::size_t count = std::min(kBlockElems, n - i);
    if (src_dtype == DType::BF16) {
      convert_bf16_to_f32(level, reinterpret_cast<const bf16*>(in + i), block, count);
    } else {
      convert_f16_to_f32(level, reinterpret_cast<const fp16*>(in + i), block, count);
    }
    if (dst_dtype == DType::BF16) {
      convert_f32_to_bf16(level, block, reinterpret_cast<bf16*>(out + i), count);
    } else {
      convert_f32_to_f16(level, block, reinterpret_cast<fp16*>(out + i), count);
    }
  }
}

}  // namespace

void convert_f32_to_bf16(SimdLevel level, const float* src, bf16* dst, std::size_t n_elems) {
  switch (simd_level_capped(level)) {
    case SimdLevel::Avx512: return f32_to_bf16_avx512(src, dst, n_elems);
    case SimdLevel::Avx2: return f32_to_bf16_avx2(src, dst, n_elems);
    case SimdLevel::Scalar: break;
  }
  f32_to_bf16_scalar(src, dst, n_elems);
}

void convert_bf16_to_f32(SimdLevel level, const bf16* src, float* dst, std::size_t n_elems) {
  switch (simd_level_capped(level)) {
    case SimdLevel::Avx512: return bf16_to_f32_avx512(src, dst, n_elems);
    case SimdLevel::Avx2: return bf16_to_f32_avx2(src, dst, n_elems);
    case SimdLevel::Scalar: break;
  }
  bf16_to_f32_scalar(src, dst, n_elems);
}

void convert_f32_to_f16(SimdLevel level, const float* src, fp16* dst, std::size_t n_elems) {
  switch (simd_level_capped(level)) {
    case SimdLevel::Avx512: return f32_to_f16_avx512(src, dst, n_elems);
    case SimdLevel::Avx2: return f32_to_f16_avx2(src, dst, n_elems);
    case SimdLevel::Scalar: break;
  }
  f32_to_f16_scalar(src, dst, n_elems);
}

void convert_f16_to_f32(SimdLevel level, const fp16* src, float* dst, std::size_t n_elems) {
  switch (simd_level_capped(level)) {
    case SimdLevel::Avx512: return f16_to_f32_avx512(src, dst, n_elems);
    case SimdLevel::Avx2: return f16_to_f32_avx2(src, dst, n_elems);
    case SimdLevel::Scalar: break;
  }
  f16_to_f32_scalar(src, dst, n_elems);
}

void convert_f32_to_bf16(const float* src, bf16* dst, std::size_t n_elems) {
  convert_f32_to_bf16(simd_level(), src, dst, n_elems);
}
void convert_bf16_to_f32(const bf16* src, float* dst, std::size_t n_elems) {
  convert_bf16_to_f32(simd_level(), src, dst, n_elems);
}
void convert_f32_to_f16(const float* src, fp16* dst, std::size_t n_elems) {
  convert_f32_to_f16(simd_level(), src, dst, n_elems);
}
void convert_f16_to_f32(const fp16* src, float* dst, std::size_t n_elems) {
  convert_f16_to_f32(simd_level(), src, dst, n_elems);
}

void convert(SimdLevel level, const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n_elems) {
  if (n_elems == 0) return;
  STRATA_CHECK(src != nullptr && dst != nullptr, "convert {} -> {} of {} elements with a null pointer",
               dtype_name(src_dtype), dtype_name(dst_dtype), n_elems);
  if (src_dtype == dst_dtype) {
    if (src != dst) std::memmove(dst, src, n_elems * dtype_bytes(src_dtype));
    return;
  }
  if (src_dtype == DType::F32) {
    const auto* in = static_cast<const float*>(src);
    if (dst_dtype == DType::BF16) return convert_f32_to_bf16(level, in, static_cast<bf16*>(dst), n_elems);
    return convert_f32_to_f16(level, in, static_cast<fp16*>(dst), n_elems);
  }
  if (dst_dtype == DType::F32) {
    auto* out = static_cast<float*>(dst);
    if (src_dtype == DType::BF16) return convert_bf16_to_f32(level, static_cast<const bf16*>(src), out, n_elems);
    return convert_f16_to_f32(level, static_cast<const fp16*>(src), out, n_elems);
  }
  convert_16_to_16(level, src, src_dtype, dst, dst_dtype, n_elems);
}

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n_elems) {
  convert(simd_level(), src, src_dtype, dst, dst_dtype, n_elems);
}

void convert_parallel(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n_elems) {
  const std::size_t elem_bytes = std::max(dtype_bytes(src_dtype), dtype_bytes(dst_dtype));
  if (n_elems * elem_bytes < kParallelConvertMinBytes) {
    convert(src, src_dtype, dst, dst_dtype, n_elems);
    return;
  }
  // Chunks of 256 KiB of fp32 (a multiple of every vector width): big enough that the split costs
  // nothing, small enough to balance over the workers.
  constexpr std::size_t kChunkElems = std::size_t{64} << 10;
  const SimdLevel level = simd_level();
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  const std::size_t chunks = (n_elems + kChunkElems - 1) / kChunkElems;
  // The loop's hand-over and join, for ThreadSanitizer (core/tsan.h).
  int start = 0;
  int done = 0;
  tsan_release(&start);
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks), [&](const tbb::blocked_range<std::size_t>& r) {
    tsan_acquire(&start);
    for (std::size_t c = r.begin(); c != r.end(); ++c) {
      const std::size_t first = c * kChunkElems;
      const std::size_t count = std::min(kChunkElems, n_elems - first);
      convert(level, in + first * dtype_bytes(src_dtype), src_dtype, out + first * dtype_bytes(dst_dtype), dst_dtype,
              count);
    }
    tsan_release(&done);
  });
  tsan_acquire(&done);
}

}  // namespace strata
