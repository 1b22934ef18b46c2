// Bulk conversions between fp32, bf16 and fp16 over whole arrays, vectorized with AVX-512 or
// AVX2+F16C and chosen at run time (core/cpu_features.h). Every path gives exactly the bits of the
// scalar reference in core/dtype.h — round-to-nearest-even, the same NaN quieting, the same
// overflow to ±Inf, fp32 denormals rounded like any other value — so which CPU a run lands on never
// changes a result (tests/core/dtype_test.cc holds every path to that, bit for bit).
//
// These are what copy-out of new low-precision weights, gradient up-casts and checkpoint export
// call. Source and destination must not overlap (the same pointer with the same dtype is allowed).
#pragma once

#include <cstddef>

#include "core/cpu_features.h"
#include "core/dtype.h"

namespace strata {

// At simd_level() (the best the CPU has, lowered by STRATA_SIMD).
void convert_f32_to_bf16(const float* src, bf16* dst, std::size_t n_elems);
void convert_bf16_to_f32(const bf16* src, float* dst, std::size_t n_elems);
void convert_f32_to_f16(const float* src, fp16* dst, std::size_t n_elems);
void convert_f16_to_f32(const fp16* src, float* dst, std::size_t n_elems);

// The same at an explicit level, capped at what the CPU supports (so a test can ask for Avx512 on
// any machine and get the best path that exists there; simd_level_capped says which one ran).
void convert_f32_to_bf16(SimdLevel level, const float* src, bf16* dst, std::size_t n_elems);
void convert_bf16_to_f32(SimdLevel level, const bf16* src, float* dst, std::size_t n_elems);
void convert_f32_to_f16(SimdLevel level, const float* src, fp16* dst, std::size_t n_elems);
void convert_f16_to_f32(SimdLevel level, const fp16* src, float* dst, std::size_t n_elems);

// Any dtype to any dtype. Same dtype is a copy; bf16 <-> fp16 goes through fp32 (exact widening,
// then one rounding), so it equals f32_to_X(to_f32(x)) element by element.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n_elems);
void convert(SimdLevel level, const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n_elems);

// Like convert, split over oneTBB worker threads when the larger side is at least
// kParallelConvertMinBytes; smaller arrays run on the calling thread. Each chunk runs the serial
// function, so the bits never depend on the thread count.
inline constexpr std::size_t kParallelConvertMinBytes = std::size_t{4} << 20;
void convert_parallel(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n_elems);

}  // namespace strata
