// Tests of the element types: the scalar conversions of core/dtype.h against an independent
// reference, and the bulk conversions of core/dtype_bulk.h against the scalar ones, bit for bit,
// on every SIMD path this CPU has.
//
// The reference rounding (nearest_16bit below) does not reuse any bit trick of dtype.h: it lists
// every finite value of the 16-bit format as a double, finds the two neighbours of x by binary
// search, and compares x with their midpoint (exact in double). It is run on every 16-bit value's
// midpoints and their fp32 neighbours (all ties, both directions, every exponent), on a strided and
// a random sample of all 2^32 fp32 patterns, and on named edge cases — so a rounding bug in dtype.h
// fails here.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/dtype_bulk.h"

namespace strata {
namespace {

enum class Half { BF16, F16 };

float f32_from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// Value of a non-negative 16-bit pattern, from the format's definition (not from dtype.h).
double half_value(Half fmt, std::uint16_t bits) {
  const int exp_bits = fmt == Half::BF16 ? 8 : 5;
  const int mant_bits = 15 - exp_bits;
  const int bias = (1 << (exp_bits - 1)) - 1;
  const int exp = (bits >> mant_bits) & ((1 << exp_bits) - 1);
  const int mant = bits & ((1 << mant_bits) - 1);
  if (exp == (1 << exp_bits) - 1) return mant == 0 ? INFINITY : NAN;
  if (exp == 0) return std::ldexp(static_cast<double>(mant), 1 - bias - mant_bits);
  return std::ldexp(static_cast<double>(mant + (1 << mant_bits)), exp - bias - mant_bits);
}

std::uint16_t inf_bits(Half fmt) { return fmt == Half::BF16 ? 0x7F80 : 0x7C00; }
bool is_nan16(Half fmt, std::uint16_t bits) { return (bits & 0x7FFF) > inf_bits(fmt); }

// Non-negative values by bit pattern 0 .. inf_bits; the last entry stands for Inf with the value
// the next exponent would have had (2^16 or 2^128), so IEEE overflow rounding falls out of the
// same midpoint rule (65520 is the midpoint of 65504 and 2^16 and ties to the even pattern: Inf).
std::vector<double> make_value_table(Half fmt) {
  std::vector<double> v;
  for (std::uint32_t b = 0; b < inf_bits(fmt); ++b) v.push_back(half_value(fmt, static_cast<std::uint16_t>(b)));
  v.push_back(fmt == Half::BF16 ? std::ldexp(1.0, 128) : std::ldexp(1.0, 16));
  return v;
}

const std::vector<double>& value_table(Half fmt) {
  static const std::vector<double> bf16_table = make_value_table(Half::BF16);
  static const std::vector<double> f16_table = make_value_table(Half::F16);
  return fmt == Half::BF16 ? bf16_table : f16_table;
}

// The slow, obviously correct fp32 -> 16-bit round-to-nearest-even. NaN follows the spec in
// dtype.h: quiet bit set, sign and the top payload bits kept.
std::uint16_t nearest_16bit(Half fmt, float x) {
  const std::uint32_t u = bits_of(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  if (std::isnan(x)) {
    return fmt == Half::BF16 ? static_cast<std::uint16_t>((u >> 16) | 0x0040u)
                             : static_cast<std::uint16_t>(sign | 0x7E00u | ((u >> 13) & 0x3FFu));
  }
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(a)) return sign | inf_bits(fmt);
  const std::vector<double>& v = value_table(fmt);
  if (a >= v.back()) return sign | inf_bits(fmt);
  // lo: the largest pattern whose value is <= a.
  const auto lo = static_cast<std::size_t>(std::upper_bound(v.begin(), v.end(), a) - v.begin() - 1);
  if (v[lo] == a) return static_cast<std::uint16_t>(sign | lo);
  const std::size_t hi = lo + 1;
  const double mid = (v[lo] + v[hi]) / 2;  // exact: both have <= 12 significant bits
  std::size_t pick = lo;
  if (a > mid || (a == mid && (hi & 1u) == 0)) pick = hi;
  return static_cast<std::uint16_t>(sign | pick);
}

std::uint16_t scalar_16bit(Half fmt, float x) {
  return fmt == Half::BF16 ? f32_to_bf16(x).bits : f32_to_f16(x).bits;
}

std::string hex32(std::uint32_t u) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", u);
  return buf;
}

// Checks dtype.h against the reference on `inputs`; reports the first few mismatches.
void expect_matches_reference(Half fmt, const std::vector<float>& inputs) {
  int failures = 0;
  for (float x : inputs) {
    const std::uint16_t want = nearest_16bit(fmt, x);
    const std::uint16_t got = scalar_16bit(fmt, x);
    if (want != got) {
      ADD_FAILURE() << (fmt == Half::BF16 ? "f32_to_bf16(" : "f32_to_f16(") << hex32(bits_of(x)) << " = " << x
                    << ") gave 0x" << std::hex << got << ", want 0x" << want;
      if (++failures >= 10) return;
    }
  }
}

// Every tie between adjacent 16-bit values (both signs), and the fp32 neighbours 1 and 2 ulp away,
// plus the 16-bit values themselves and their neighbours.
std::vector<float> boundary_inputs(Half fmt) {
  const std::vector<double>& v = value_table(fmt);
  std::vector<float> out;
  out.reserve(v.size() * 16);
  for (std::size_t b = 0; b + 1 < v.size(); ++b) {
    const auto mid = static_cast<float>((v[b] + v[b + 1]) / 2);  // representable in fp32
    const auto exact = static_cast<float>(v[b]);
    for (float c : {mid, exact}) {
      float down = c, up = c;
      for (int k = 0; k < 2; ++k) {
        down = std::nextafter(down, -INFINITY);
        up = std::nextafter(up, INFINITY);
        for (float y : {down, up}) {
          out.push_back(y);
          out.push_back(-y);
        }
      }
      out.push_back(c);
      out.push_back(-c);
    }
  }
  return out;
}

// A strided walk over all 2^32 patterns (odd stride, so every residue class is visited) plus
// uniformly random patterns.
std::vector<float> sampled_inputs() {
  std::vector<float> out;
  constexpr std::uint64_t kStride = 4099;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += kStride) out.push_back(f32_from_bits(static_cast<std::uint32_t>(u)));
  std::mt19937 rng(12345);
  for (int i = 0; i < 300000; ++i) out.push_back(f32_from_bits(static_cast<std::uint32_t>(rng())));
  return out;
}

// ------------------------------------------------------------------ scalar conversions

TEST(DType, NamesAndParsing) {
  DType t{};
  EXPECT_TRUE(parse_dtype("bf16", &t));
  EXPECT_EQ(t, DType::BF16);
  EXPECT_TRUE(parse_dtype("float16", &t));
  EXPECT_EQ(t, DType::F16);
  EXPECT_TRUE(parse_dtype("fp32", &t));
  EXPECT_EQ(t, DType::F32);
  EXPECT_FALSE(parse_dtype("int8", &t));
  EXPECT_FALSE(parse_dtype("", &t));
  EXPECT_EQ(dtype_name(DType::BF16), "bf16");
  EXPECT_EQ(dtype_bytes(DType::F32), 4u);
  EXPECT_EQ(dtype_bytes(DType::F16), 2u);
}

TEST(DType, EveryBf16RoundTripsThroughF32) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const bf16 h{static_cast<std::uint16_t>(b)};
    const float f = bf16_to_f32(h);
    ASSERT_EQ(bits_of(f), b << 16) << "bf16 0x" << std::hex << b;
    const std::uint16_t back = f32_to_bf16(f).bits;
    if (is_nan16(Half::BF16, h.bits)) {
      ASSERT_TRUE(std::isnan(f));
      // Stays NaN, same sign and payload, quiet bit forced on.
      ASSERT_EQ(back, b | 0x0040u) << "bf16 NaN 0x" << std::hex << b;
    } else {
      ASSERT_EQ(back, b) << "bf16 0x" << std::hex << b;
      ASSERT_EQ(static_cast<double>(f), (b & 0x8000 ? -1 : 1) * half_value(Half::BF16, b & 0x7FFF));
    }
  }
}

TEST(DType, EveryFp16RoundTripsThroughF32) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const fp16 h{static_cast<std::uint16_t>(b)};
    const float f = f16_to_f32(h);
    const std::uint32_t sign = (b & 0x8000u) << 16;
    const std::uint16_t back = f32_to_f16(f).bits;
    if (is_nan16(Half::F16, h.bits)) {
      // The reference keeps the payload bits exactly (no quieting on the way up)...
      ASSERT_EQ(bits_of(f), sign | 0x7F800000u | ((b & 0x3FFu) << 13)) << "fp16 NaN 0x" << std::hex << b;
      // ...and sets the quiet bit on the way down.
      ASSERT_EQ(back, b | 0x0200u) << "fp16 NaN 0x" << std::hex << b;
    } else {
      const double want = (b & 0x8000 ? -1 : 1) * half_value(Half::F16, b & 0x7FFF);
      ASSERT_EQ(static_cast<double>(f), want) << "fp16 0x" << std::hex << b;
      ASSERT_EQ(bits_of(f) & 0x80000000u, sign) << "sign of fp16 0x" << std::hex << b;
      ASSERT_EQ(back, b) << "fp16 0x" << std::hex << b;
    }
  }
}

TEST(DType, Fp16NamedEdgeCases) {
  auto h = [](float x) { return f32_to_f16(x).bits; };
  EXPECT_EQ(h(0.0f), 0x0000);
  EXPECT_EQ(h(-0.0f), 0x8000);
  EXPECT_EQ(h(1.0f), 0x3C00);
  EXPECT_EQ(h(65504.0f), 0x7BFF);                      // largest finite
  EXPECT_EQ(h(65519.99f), 0x7BFF);                     // just under the overflow midpoint
  EXPECT_EQ(h(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(h(65520.0f), 0x7C00);                      // the midpoint ties to even: Inf
  EXPECT_EQ(h(-65520.0f), 0xFC00);
  EXPECT_EQ(h(1e10f), 0x7C00);
  EXPECT_EQ(h(INFINITY), 0x7C00);
  EXPECT_EQ(h(-INFINITY), 0xFC00);
  EXPECT_EQ(h(std::ldexp(1.0f, -14)), 0x0400);          // smallest normal
  EXPECT_EQ(h(std::ldexp(1023.0f, -24)), 0x03FF);       // largest subnormal
  EXPECT_EQ(h(std::ldexp(2047.0f, -25)), 0x0400);       // tie between them: even is 0x0400
  EXPECT_EQ(h(std::ldexp(1.0f, -24)), 0x0001);          // smallest subnormal
  EXPECT_EQ(h(std::ldexp(1.0f, -25)), 0x0000);          // half of it: tie to even (0)
  EXPECT_EQ(h(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(h(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(h(std::ldexp(3.0f, -25)), 0x0002);          // 1.5 ulp: tie, rounds up to even 2
  EXPECT_EQ(h(std::ldexp(5.0f, -25)), 0x0002);          // 2.5 ulp: tie, rounds down to even 2
  EXPECT_EQ(h(1.0f + std::ldexp(1.0f, -11)), 0x3C00);   // tie above 1.0 -> even (1.0)
  EXPECT_EQ(h(1.0f + std::ldexp(3.0f, -11)), 0x3C02);   // tie above 1+ulp -> even (1+2ulp)
  EXPECT_EQ(h(f32_from_bits(0x00000001)), 0x0000);      // fp32 denormal
  EXPECT_EQ(h(f32_from_bits(0x7FC00000)), 0x7E00);      // quiet NaN
  EXPECT_EQ(h(f32_from_bits(0x7F800001)), 0x7E00);      // signalling NaN, low payload: quieted
  EXPECT_EQ(h(f32_from_bits(0xFFA02000)), 0xFF01);      // sign and top payload bits kept
}

TEST(DType, Bf16NamedEdgeCases) {
  auto b = [](std::uint32_t u) { return f32_to_bf16(f32_from_bits(u)).bits; };
  EXPECT_EQ(b(0x3F800000), 0x3F80);  // 1.0
  EXPECT_EQ(b(0x3F808000), 0x3F80);  // tie -> even, down
  EXPECT_EQ(b(0x3F818000), 0x3F82);  // tie -> even, up
  EXPECT_EQ(b(0x3F808001), 0x3F81);  // just above the tie
  EXPECT_EQ(b(0x3F807FFF), 0x3F80);  // just below
  EXPECT_EQ(b(0x7F7FFFFF), 0x7F80);  // max fp32 rounds to Inf
  EXPECT_EQ(b(0x7F7F7FFF), 0x7F7F);  // stays the largest finite bf16
  EXPECT_EQ(b(0x7F7F8000), 0x7F80);  // tie at the top: even is Inf
  EXPECT_EQ(b(0xFF800000), 0xFF80);  // -Inf
  EXPECT_EQ(b(0x00008000), 0x0000);  // fp32 denormal tie -> 0
  EXPECT_EQ(b(0x00018000), 0x0002);  // fp32 denormal tie -> even 2
  EXPECT_EQ(b(0x00008001), 0x0001);  // fp32 denormal above the tie
  EXPECT_EQ(b(0x807FFFFF), 0x8080);  // largest negative fp32 denormal carries into the normals
  EXPECT_EQ(b(0x7FC00001), 0x7FC0);  // quiet NaN with low payload
  EXPECT_EQ(b(0x7F800001), 0x7FC0);  // signalling NaN: quieted, not turned into Inf
  EXPECT_EQ(b(0xFF810000), 0xFFC1);  // sign and top payload kept
  EXPECT_EQ(b(0x7FFFFFFF), 0x7FFF);  // NaN whose rounding would carry: no carry into the sign
}

TEST(DType, RoundingMatchesIndependentReferenceAtEveryTie) {
  for (Half fmt : {Half::BF16, Half::F16}) {
    SCOPED_TRACE(fmt == Half::BF16 ? "bf16" : "fp16");
    expect_matches_reference(fmt, boundary_inputs(fmt));
  }
}

TEST(DType, RoundingMatchesIndependentReferenceOnSampledPatterns) {
  const std::vector<float> inputs = sampled_inputs();
  for (Half fmt : {Half::BF16, Half::F16}) {
    SCOPED_TRACE(fmt == Half::BF16 ? "bf16" : "fp16");
    expect_matches_reference(fmt, inputs);
  }
}

TEST(DType, GenericLoadStoreUseTheSameFunctions) {
  const float x = 3.14159f;
  EXPECT_EQ(from_f32<bf16>(x).bits, f32_to_bf16(x).bits);
  EXPECT_EQ(from_f32<fp16>(x).bits, f32_to_f16(x).bits);
  EXPECT_EQ(to_f32(from_f32<float>(x)), x);
  EXPECT_EQ(to_f32(bf16{0x4049}), bf16_to_f32(bf16{0x4049}));
  EXPECT_EQ(to_f32(fp16{0x4248}), f16_to_f32(fp16{0x4248}));
}

// ------------------------------------------------------------------ bulk conversions

class BulkConvert : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (simd_level_capped(GetParam()) != GetParam()) {
      GTEST_SKIP() << "this CPU has no " << simd_level_name(GetParam()) << " path (best: "
                   << simd_level_name(simd_level_capped(SimdLevel::Avx512)) << ")";
    }
  }
};

// Inputs that hit every lane kind: specials, ties, denormals, NaNs, random patterns.
std::vector<float> mixed_f32(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::uint32_t specials[] = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
                                    0xFFA02000, 0x00008000, 0x00018000, 0x3F808000, 0x3F818000, 0x477FF000,
                                    0x477FEFFF, 0x33000000, 0x33000001, 0x387FC000, 0x7F7FFFFF, 0x7FFFFFFF};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t r = rng();
    if (r % 4 == 0) {
      v[i] = f32_from_bits(specials[(r >> 8) % std::size(specials)]);
    } else if (r % 4 == 1) {
      v[i] = std::ldexp(static_cast<float>(rng() % 4096) / 16.0f, static_cast<int>(rng() % 40) - 30);
    } else {
      v[i] = f32_from_bits(rng());
    }
  }
  return v;
}

// Runs `bulk` on n elements at element offset `offset` of the input and output (unaligned
// pointers), with guard elements around the output that must stay untouched.
template <typename In, typename Out, typename Bulk, typename Scalar>
void check_bulk(const std::vector<In>& input, std::size_t n, std::size_t offset, Bulk bulk, Scalar scalar) {
  std::vector<In> src(input.begin(), input.begin() + static_cast<std::ptrdiff_t>(n + offset));
  std::vector<Out> dst(n + offset + 16);
  std::memset(dst.data(), 0xA5, dst.size() * sizeof(Out));
  bulk(src.data() + offset, dst.data() + offset, n);
  for (std::size_t i = 0; i < dst.size(); ++i) {
    std::uint32_t got = 0, want = 0;
    std::memcpy(&got, &dst[i], sizeof(Out));
    if (i >= offset && i < offset + n) {
      const Out ref = scalar(src[i]);
      std::memcpy(&want, &ref, sizeof(Out));
    } else {
      std::memset(&want, 0xA5, sizeof(Out));  // guard element
    }
    ASSERT_EQ(got, want) << "n=" << n << " offset=" << offset << " element " << i
                         << (i >= offset && i < offset + n ? "" : " (outside the range: overwritten)");
  }
}

const std::size_t kSizes[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 4099};

TEST_P(BulkConvert, F32ToBf16MatchesScalar) {
  const SimdLevel level = GetParam();
  const std::vector<float> in = mixed_f32(4099 + 8, 1);
  for (std::size_t n : kSizes) {
    for (std::size_t off : {0, 1, 3}) {
      check_bulk<float, bf16>(in, n, off, [&](const float* s, bf16* d, std::size_t k) { convert_f32_to_bf16(level, s, d, k); },
                              [](float x) { return f32_to_bf16(x); });
    }
  }
}

TEST_P(BulkConvert, F32ToF16MatchesScalar) {
  const SimdLevel level = GetParam();
  const std::vector<float> in = mixed_f32(4099 + 8, 2);
  for (std::size_t n : kSizes) {
    for (std::size_t off : {0, 1, 3}) {
      check_bulk<float, fp16>(in, n, off, [&](const float* s, fp16* d, std::size_t k) { convert_f32_to_f16(level, s, d, k); },
                              [](float x) { return f32_to_f16(x); });
    }
  }
}

TEST_P(BulkConvert, SixteenBitToF32MatchesScalarOnRaggedSizes) {
  const SimdLevel level = GetParam();
  std::mt19937 rng(3);
  std::vector<bf16> b(4099 + 8);
  std::vector<fp16> h(4099 + 8);
  for (std::size_t i = 0; i < b.size(); ++i) {
    b[i].bits = static_cast<std::uint16_t>(rng());
    h[i].bits = static_cast<std::uint16_t>(rng());
  }
  for (std::size_t n : kSizes) {
    for (std::size_t off : {0, 1, 3}) {
      check_bulk<bf16, float>(b, n, off, [&](const bf16* s, float* d, std::size_t k) { convert_bf16_to_f32(level, s, d, k); },
                              [](bf16 x) { return bf16_to_f32(x); });
      check_bulk<fp16, float>(h, n, off, [&](const fp16* s, float* d, std::size_t k) { convert_f16_to_f32(level, s, d, k); },
                              [](fp16 x) { return f16_to_f32(x); });
    }
  }
}

// All 65,536 patterns up (signalling NaNs included: F16C would quiet them, the reference does not).
TEST_P(BulkConvert, EverySixteenBitPatternToF32) {
  const SimdLevel level = GetParam();
  std::vector<bf16> b(0x10000);
  std::vector<fp16> h(0x10000);
  for (std::uint32_t i = 0; i < 0x10000; ++i) b[i].bits = h[i].bits = static_cast<std::uint16_t>(i);
  std::vector<float> fb(0x10000), fh(0x10000);
  convert_bf16_to_f32(level, b.data(), fb.data(), b.size());
  convert_f16_to_f32(level, h.data(), fh.data(), h.size());
  for (std::uint32_t i = 0; i < 0x10000; ++i) {
    ASSERT_EQ(bits_of(fb[i]), bits_of(bf16_to_f32(b[i]))) << "bf16 0x" << std::hex << i;
    ASSERT_EQ(bits_of(fh[i]), bits_of(f16_to_f32(h[i]))) << "fp16 0x" << std::hex << i;
  }
}

// Every tie of both formats and the sampled fp32 patterns (NaN payloads included) in bulk.
TEST_P(BulkConvert, SampledF32PatternsMatchScalar) {
  const SimdLevel level = GetParam();
  std::vector<float> in = sampled_inputs();
  for (Half fmt : {Half::BF16, Half::F16}) {
    const std::vector<float> more = boundary_inputs(fmt);
    in.insert(in.end(), more.begin(), more.end());
  }
  // All NaN payload classes of the top 10/16 bits (the bits the 16-bit formats keep).
  for (std::uint32_t p = 1; p < (1u << 10); ++p) {
    in.push_back(f32_from_bits(0x7F800000u | (p << 13)));
    in.push_back(f32_from_bits(0xFF800000u | (p << 13) | 0x1FFFu));
  }
  std::vector<bf16> b(in.size());
  std::vector<fp16> h(in.size());
  convert_f32_to_bf16(level, in.data(), b.data(), in.size());
  convert_f32_to_f16(level, in.data(), h.data(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(b[i].bits, f32_to_bf16(in[i]).bits) << "bf16 of " << hex32(bits_of(in[i]));
    ASSERT_EQ(h[i].bits, f32_to_f16(in[i]).bits) << "fp16 of " << hex32(bits_of(in[i]));
  }
}

TEST_P(BulkConvert, GenericConvertCoversEveryPair) {
  const SimdLevel level = GetParam();
  const std::size_t n = 2500;  // crosses the 1024-element block of the 16 -> 16 path
  const std::vector<float> f = mixed_f32(n, 4);
  std::vector<bf16> b(n);
  std::vector<fp16> h(n);
  for (std::size_t i = 0; i < n; ++i) {
    b[i] = f32_to_bf16(f[i]);
    h[i] = f32_to_f16(f[i]);
  }
  const void* sources[3] = {f.data(), b.data(), h.data()};
  const DType types[3] = {DType::F32, DType::BF16, DType::F16};
  for (int s = 0; s < 3; ++s) {
    for (int d = 0; d < 3; ++d) {
      SCOPED_TRACE(std::string(dtype_name(types[s])) + " -> " + std::string(dtype_name(types[d])));
      std::vector<unsigned char> out(n * 4 + 4, 0xEE);
      convert(level, sources[s], types[s], out.data(), types[d], n);
      for (std::size_t i = 0; i < n; ++i) {
        float wide = 0;
        if (types[s] == DType::F32) wide = f[i];
        if (types[s] == DType::BF16) wide = bf16_to_f32(b[i]);
        if (types[s] == DType::F16) wide = f16_to_f32(h[i]);
        std::uint32_t want = bits_of(wide);
        if (types[d] == DType::BF16) want = f32_to_bf16(wide).bits;
        if (types[d] == DType::F16) want = f32_to_f16(wide).bits;
        if (types[s] == types[d] && types[s] == DType::BF16) want = b[i].bits;
        if (types[s] == types[d] && types[s] == DType::F16) want = h[i].bits;
        std::uint32_t got = 0;
        std::memcpy(&got, out.data() + i * dtype_bytes(types[d]), dtype_bytes(types[d]));
        ASSERT_EQ(got, want) << "element " << i;
      }
      EXPECT_EQ(out[n * dtype_bytes(types[d])], 0xEE) << "wrote past the end";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, BulkConvert, ::testing::Values(SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512),
                         [](const ::testing::TestParamInfo<SimdLevel>& info) {
                           return std::string(simd_level_name(info.param));
                         });

TEST(BulkConvertParallel, LargeArraysGiveTheSerialBits) {
  const std::size_t n = (kParallelConvertMinBytes / 4) * 3 + 12345;  // several chunks and a ragged end
  const std::vector<float> f = mixed_f32(n, 5);
  std::vector<bf16> serial(n), parallel(n);
  convert(f.data(), DType::F32, serial.data(), DType::BF16, n);
  convert_parallel(f.data(), DType::F32, parallel.data(), DType::BF16, n);
  ASSERT_EQ(std::memcmp(serial.data(), parallel.data(), n * sizeof(bf16)), 0);
  std::vector<fp16> h(n);
  convert_parallel(serial.data(), DType::BF16, h.data(), DType::F16, n);
  for (std::size_t i = 0; i < n; i += 997) ASSERT_EQ(h[i].bits, f32_to_f16(bf16_to_f32(serial[i])).bits) << i;
  std::vector<float> small_out(100);
  convert_parallel(f.data(), DType::F32, small_out.data(), DType::F32, 100);  // below the threshold
  EXPECT_EQ(std::memcmp(small_out.data(), f.data(), 100 * sizeof(float)), 0);
}

}  // namespace
}  // namespace strata
