// The exact sum of squares (Note [Exact sum of squares] in optim/exact_squares.h).
#include "optim/exact_squares.h"

#include <cmath>
#include <limits>

#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>

#include "core/error.h"
#include "optim/cpu_exec.h"

namespace strata::optim {

void ExactSquares::normalize() {
  std::uint64_t carry = 0;
  for (std::uint64_t& w : words) {
    const std::uint64_t v = w + carry;  // w < 2^63 + 2^32 and carry < 2^32: no wrap
    w = v & 0xFFFFFFFFu;
    carry = v >> 32;
  }
  STRATA_CHECK(carry == 0, "exact sum of squares overflowed its {} digits", kExactDigits);
}

void ExactSquares::merge(const ExactSquares& other) {
  ExactSquares b = other;
  normalize();
  b.normalize();
  for (int i = 0; i < kExactDigits; ++i) words[i] += b.words[i];
  non_finite += b.non_finite;
  normalize();
}

void ExactSquares::add_shifted(std::uint64_t v, int k) {
  const SquarePieces p = shifted_pieces(v, k);
  for (int i = 0; i < 3; ++i) words[p.word + i] += p.piece[i];
}

double ExactSquares::value() const {
  if (!finite()) return std::numeric_limits<double>::infinity();
  ExactSquares n = *this;
  n.normalize();
  double sum = 0.0;
  for (int i = kExactDigits - 1; i >= 0; --i) {
    if (n.words[i] != 0) sum += std::ldexp(static_cast<double>(n.words[i]), 32 * i + kExactScaleExp);
  }
  return sum;
}

namespace {

// The bulk path: square_pieces one value at a time would chain every add through the same few
// words (gradients share exponents). Instead each value's m^2 goes into a 64-bit bin per biased
// exponent, in 4 interleaved sets of bins so consecutive values do not wait on each other; the bins
// (each under 2^62 for a run of kBinRun values) then go into the digits, shifted by their k. Sums
// are exact either way, so this gives the same digits as add().
constexpr std::size_t kBinRun = kCpuBlockElems;  // m^2 < 2^48: 2^14 of them stay under 2^62
// (the caller hands add_all at most kBinRun values)
static_assert(kBinRun <= (std::size_t{1} << 14));
constexpr int kBinSets = 4;

template <typename T>
void add_all(ExactSquares& acc, const T* x, std::size_t begin, std::size_t end) {
  STRATA_CHECK(end - begin <= kBinRun, "exact sum of squares: {} values in one run of bins", end - begin);
  std::uint64_t bins[kBinSets][256] = {};
  std::uint64_t non_finite = 0;
  std::size_t i = begin;
  const auto one = [&](int set, float v) {
    std::uint64_t m2 = 0;
    const std::uint32_t e = mantissa_square(v, m2);
    bins[set][e] += m2;  // e == 255 (NaN, infinity) is counted below, its bin ignored
    non_finite += e == 0xFFu;
  };
  for (; i + kBinSets <= end; i += kBinSets) {
    for (int s = 0; s < kBinSets; ++s) one(s, to_f32(x[i + static_cast<std::size_t>(s)]));
  }
  for (; i < end; ++i) one(0, to_f32(x[i]));
  for (int e = 0; e < 255; ++e) {
    std::uint64_t sum = 0;  // all sets together hold at most kBinRun squares: under 2^62
    for (int s = 0; s < kBinSets; ++s) sum += bins[s][e];
    if (sum != 0) acc.add_shifted(sum, square_shift(static_cast<std::uint32_t>(e)));
  }
  acc.non_finite += non_finite;
}

}  // namespace

ExactSquares exact_sum_squares(const void* data, DType dtype, std::size_t n, const CpuExec& exec) {
  if (n == 0) return {};
  STRATA_CHECK(data != nullptr, "exact_sum_squares: null pointer for {} elements", n);
  auto body = [&](const tbb::blocked_range<std::size_t>& range, ExactSquares acc) {
    // kCpuBlockElems values at a time, then a normalization, so no word can wrap.
    for (std::size_t b = range.begin(); b < range.end(); b += kCpuBlockElems) {
      const std::size_t e = std::min(range.end(), b + kCpuBlockElems);
      switch (dtype) {  // at most kBinRun values per call
        case DType::F32: add_all(acc, static_cast<const float*>(data), b, e); break;
        case DType::BF16: add_all(acc, static_cast<const bf16*>(data), b, e); break;
        case DType::F16: add_all(acc, static_cast<const fp16*>(data), b, e); break;
      }
      acc.normalize();
    }
    return acc;
  };
  auto join = [](ExactSquares a, const ExactSquares& b) {
    a.merge(b);
    return a;
  };
  auto run = [&] {
    return tbb::parallel_reduce(tbb::blocked_range<std::size_t>(0, n, kCpuBlockElems), ExactSquares{}, body, join);
  };
  return exec.arena != nullptr ? exec.arena->execute(run) : run();
}

}  // namespace strata::optim
