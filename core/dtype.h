// Element types: fp32, bf16 and fp16, with round-to-nearest-even conversions.
//
// bf16 and fp16 are stored as raw 16-bit patterns (struct with `bits`), never as a compiler
// extension type, so that host and device code agree on layout and on rounding. The scalar
// conversions here are the reference: core/dtype_bulk.h's vectorized paths must give the same bits,
// and the CUDA kernels call these very functions.
//
// Rounding rules (IEEE 754 roundTiesToEven):
//  * fp32 -> bf16: add 0x7FFF + lsb to the dropped 16 bits; NaN stays NaN (quiet bit set, sign
//    kept); overflow rounds to ±Inf; fp32 denormals round like any other value.
//  * fp32 -> fp16: exact RNE including fp16 subnormals; |x| >= 65520 -> ±Inf; NaN -> quiet NaN
//    keeping sign and the top payload bits.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/hd.h"

namespace strata {

enum class DType : std::uint8_t { F32, BF16, F16 };

constexpr std::size_t dtype_bytes(DType t) { return t == DType::F32 ? 4 : 2; }
std::string_view dtype_name(DType t);
// Parses "fp32"/"f32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16"; false if unknown.
bool parse_dtype(std::string_view text, DType* out);

struct bf16 {
  std::uint16_t bits;
};
struct fp16 {
  std::uint16_t bits;
};

STRATA_HD std::uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

STRATA_HD float bits_f32(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

STRATA_HD float bf16_to_f32(bf16 h) { return bits_f32(static_cast<std::uint32_t>(h.bits) << 16); }

STRATA_HD bf16 f32_to_bf16(float f) {
  const std::uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: keep sign and top payload, force quiet.
    return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  }
  const std::uint32_t lsb = (u >> 16) & 1u;
  return bf16{static_cast<std::uint16_t>((u + 0x7FFFu + lsb) >> 16)};
}

STRATA_HD float f16_to_f32(fp16 h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1Fu;
  std::uint32_t mant = h.bits & 0x3FFu;
  if (exp == 0x1Fu) {  // Inf / NaN
    return bits_f32(sign | 0x7F800000u | (mant << 13));
  }
  if (exp != 0) {  // normal
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  }
  if (mant == 0) {
    return bits_f32(sign);
  }
  // Subnormal: normalize. value = mant * 2^-24.
  std::uint32_t e = 113;  // exponent (biased, fp32) of 2^-14 is 113
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  mant &= 0x3FFu;
  return bits_f32(sign | (e << 23) | (mant << 13));
}

STRATA_HD fp16 f32_to_f16(float f) {
  const std::uint32_t u = f32_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) {  // NaN: quiet, keep top payload bits.
    return fp16{static_cast<std::uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu))};
  }
  if (abs >= 0x477FF000u) {  // >= 65520 rounds to Inf (and Inf stays Inf)
    return fp16{static_cast<std::uint16_t>(sign | 0x7C00u)};
  }
  if (abs >= 0x38800000u) {  // >= 2^-14: normal fp16
    // Re-bias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
    const std::uint32_t rebiased = abs - 0x38000000u;
    const std::uint32_t lsb = (rebiased >> 13) & 1u;
    return fp16{static_cast<std::uint16_t>(sign | ((rebiased + 0x0FFFu + lsb) >> 13))};
  }
  if (abs < 0x33000000u) {  // < 2^-25: rounds to zero (2^-25 exactly is a tie -> even = 0)
    return fp16{sign};
  }
  // Subnormal fp16: value = m * 2^-24, m in [1, 1023]. Shift the full 24-bit significand.
  const std::uint32_t exp = abs >> 23;                 // 102..112
  const std::uint32_t sig = (abs & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - exp;              // 14..24
  const std::uint32_t kept = sig >> shift;
  const std::uint32_t rem = sig & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  std::uint32_t m = kept;
  if (rem > half || (rem == half && (kept & 1u))) {
    ++m;  // may carry into the smallest normal, which is the right answer
  }
  return fp16{static_cast<std::uint16_t>(sign | m)};
}

// Generic load/store in fp32, for code templated on the element type.
STRATA_HD float to_f32(float x) { return x; }
STRATA_HD float to_f32(bf16 x) { return bf16_to_f32(x); }
STRATA_HD float to_f32(fp16 x) { return f16_to_f32(x); }

template <typename T>
STRATA_HD T from_f32(float x);
template <>
STRATA_HD float from_f32<float>(float x) {
  return x;
}
template <>
STRATA_HD bf16 from_f32<bf16>(float x) {
  return f32_to_bf16(x);
}
template <>
STRATA_HD fp16 from_f32<fp16>(float x) {
  return f32_to_f16(x);
}

}  // namespace strata
