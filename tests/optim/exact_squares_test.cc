// The exact sum of squares (Note [Exact sum of squares] in optim/exact_squares.h): exact for single
// values, the same bits for any order, split and thread count, and accurate against a long-double
// reference where rounding cannot hide an error.
#include "optim/exact_squares.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <tbb/task_arena.h>

#include "optim/cpu_exec.h"

namespace strata::optim {
namespace {

bool same_words(const ExactSquares& a, const ExactSquares& b) {
  ExactSquares x = a, y = b;
  x.normalize();
  y.normalize();
  return std::memcmp(&x, &y, sizeof x) == 0;
}

std::vector<float> mixed_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-60, 60);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(mant(rng), expo(rng));
  return v;
}

ExactSquares serial_sum(const std::vector<float>& v) {
  ExactSquares acc;
  for (float x : v) acc.add(x);
  return acc;
}

TEST(ExactSquares, OneValueIsItsSquareExactly) {
  // The square of an fp32 value is exact in double, so one value's sum must equal it bit for bit,
  // across the whole range: subnormals, the smallest normal, one, the largest float.
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -3.0f, 0.1f, FLT_MIN, FLT_TRUE_MIN, 3 * FLT_TRUE_MIN,
                               FLT_MAX, -FLT_MAX, 1e-30f, 7.5e25f};
  for (float x : mixed_values(2000, 1)) values.push_back(x);
  for (float x : values) {
    ExactSquares acc;
    acc.add(x);
    EXPECT_EQ(acc.value(), static_cast<double>(x) * static_cast<double>(x)) << x;
  }
  ExactSquares pair;
  pair.add(3.0f);
  pair.add(4.0f);
  EXPECT_EQ(pair.value(), 25.0);
}

TEST(ExactSquares, AnyOrderAndSplitGivesTheSameBits) {
  const std::vector<float> v = mixed_values(50'000, 2);
  const ExactSquares ref = serial_sum(v);
  std::vector<float> shuffled = v;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(3));
  EXPECT_TRUE(same_words(ref, serial_sum(shuffled)));
  EXPECT_EQ(ref.value(), serial_sum(shuffled).value());
  // The double sums of the two orders differ, so the data could show an order dependence.
  double a = 0, b = 0;
  for (float x : v) a += static_cast<double>(x) * x;
  for (float x : shuffled) b += static_cast<double>(x) * x;
  EXPECT_NE(a, b);
  // Any cut into parts, merged in any order.
  for (std::size_t cut : {std::size_t{1}, std::size_t{17}, std::size_t{16384}, std::size_t{31'000}}) {
    ExactSquares left = exact_sum_squares(v.data(), DType::F32, cut, default_cpu_exec());
    const ExactSquares right = exact_sum_squares(v.data() + cut, DType::F32, v.size() - cut, default_cpu_exec());
    ExactSquares rl = right;
    rl.merge(left);
    left.merge(right);
    EXPECT_TRUE(same_words(ref, left)) << cut;
    EXPECT_TRUE(same_words(ref, rl)) << cut;
  }
}

TEST(ExactSquares, ThreadCountDoesNotMatter) {
  const std::vector<float> v = mixed_values(200'000, 4);
  tbb::task_arena one(1), two(2);
  const ExactSquares a = exact_sum_squares(v.data(), DType::F32, v.size(), CpuExec{SimdLevel::Scalar, &one});
  const ExactSquares b = exact_sum_squares(v.data(), DType::F32, v.size(), CpuExec{SimdLevel::Scalar, &two});
  EXPECT_TRUE(same_words(a, b));
  EXPECT_TRUE(same_words(a, serial_sum(v)));
}

TEST(ExactSquares, AccurateAgainstLongDouble) {
  // Integers up to 2^12: the squares and their sum (under 2^41) are exact in double, so the sum
  // must be exactly right.
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> ints(-4096, 4096);
  std::vector<float> v(1 << 16);
  double exact = 0;
  for (float& x : v) {
    x = static_cast<float>(ints(rng));
    exact += static_cast<double>(x) * x;
  }
  EXPECT_EQ(exact_sum_squares(v.data(), DType::F32, v.size(), default_cpu_exec()).value(), exact);
  // Fractions over 120 binades: within two double roundings of the long-double sum (whose own
  // error is far smaller for these values).
  const std::vector<float> w = mixed_values(1 << 16, 8);
  long double ref = 0;
  for (float x : w) ref += static_cast<long double>(x) * x;
  const double got = exact_sum_squares(w.data(), DType::F32, w.size(), default_cpu_exec()).value();
  EXPECT_LE(std::fabs(static_cast<long double>(got) - ref) / ref, 4.5e-16L);
  // Tiny values beside huge ones are kept, not absorbed: 1 + 2^-60 summed 2^20 times.
  ExactSquares acc;
  acc.add(1.0f);
  for (int i = 0; i < (1 << 20); ++i) acc.add(std::ldexp(1.0f, -30));  // each square 2^-60
  EXPECT_EQ(acc.value(), 1.0 + std::ldexp(1.0, -40));
}

TEST(ExactSquares, LargestValuesDoNotOverflow) {
  std::vector<float> v(1 << 20, FLT_MAX);
  const double got = exact_sum_squares(v.data(), DType::F32, v.size(), default_cpu_exec()).value();
  EXPECT_EQ(got, std::ldexp(static_cast<double>(FLT_MAX) * FLT_MAX, 20));
}

TEST(ExactSquares, NonFiniteValuesAreCounted) {
  std::vector<float> v = mixed_values(1000, 6);
  EXPECT_TRUE(exact_sum_squares(v.data(), DType::F32, v.size(), default_cpu_exec()).finite());
  v[500] = std::numeric_limits<float>::quiet_NaN();
  v[7] = -std::numeric_limits<float>::infinity();
  const ExactSquares s = exact_sum_squares(v.data(), DType::F32, v.size(), default_cpu_exec());
  EXPECT_FALSE(s.finite());
  EXPECT_EQ(s.non_finite, 2u);
  EXPECT_TRUE(std::isinf(s.value()));
}

TEST(ExactSquares, SixteenBitValuesAreTheirWidening) {
  const std::vector<float> v = mixed_values(40'000, 7);
  std::vector<bf16> b(v.size());
  std::vector<fp16> h(v.size());
  std::vector<float> wb(v.size()), wh(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    b[i] = f32_to_bf16(v[i]);
    h[i] = f32_to_f16(v[i]);
    wb[i] = bf16_to_f32(b[i]);
    wh[i] = f16_to_f32(h[i]);
  }
  EXPECT_TRUE(same_words(exact_sum_squares(b.data(), DType::BF16, b.size(), default_cpu_exec()), serial_sum(wb)));
  EXPECT_TRUE(same_words(exact_sum_squares(h.data(), DType::F16, h.size(), default_cpu_exec()), serial_sum(wh)));
}

}  // namespace
}  // namespace strata::optim
