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

template <typename T>
void add_all(ExactSquares& acc, const T* x, std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) acc.add(to_f32(x[i]));
}

}  // namespace

ExactSquares exact_sum_squares(const void* data, DType dtype, std::size_t n, const CpuExec& exec) {
  if (n == 0) return {};
  STRATA_CHECK(data != nullptr, "exact_sum_squares: null pointer for {} elements", n);
  auto body = [&](const tbb::blocked_range<std::size_t>& range, ExactSquares acc) {
    // kCpuBlockElems values at a time, then a normalization, so no word can wrap.
    for (std::size_t b = range.begin(); b < range.end(); b += kCpuBlockElems) {
      const std::size_t e = std::min(range.end(), b + kCpuBlockElems);
      switch (dtype) {
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
