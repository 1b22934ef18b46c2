// The exact sum of squares of fp32 values: the gradient norm of exact mode, whose bits depend on
// nothing but the set of gradient values.
//
// Note [Exact sum of squares]
// The fast norm (optim/grad_stats.h) rounds: its block partials are summed in a fixed order, so
// its bits depend on where blocks begin. That holds across thread counts and ZeRO stages, whose
// shards are whole blocks of the same list, but not across tensor ranks: a column-parallel
// weight's slice is strided in the one-rank layout, so no cut into blocks is common to every T.
// Exact mode promises the same weights for every T, and with clipping the weights depend on the
// norm's bits. So exact mode sums the squares without rounding at all, and an exact sum is the
// same for any order and any grouping.
//
// Every finite fp32 x is m * 2^(e - 150) with an integer m < 2^24 (e the biased exponent, taken as
// 1 for subnormals), so x * x = m^2 * 2^k * 2^-298 with m^2 < 2^48 and k = 2 * (e - 1) in
// [0, 506]. The sum is kept as an integer in units of 2^-298: kExactDigits base-2^32 digits, each
// held in a 64-bit word so that up to 2^32 additions of 32-bit pieces need no carry. One square
// adds three pieces (m^2 shifted by k % 32 is under 2^80) to words k / 32 .. k / 32 + 2. Words are
// normalized (carried) when two sums are merged; 19 digits (608 bits) hold 554 bits of range plus
// 54 of count. NaN and infinity are counted apart. The bulk path (exact_sum_squares) first sums m^2
// per exponent in 64-bit bins, 2^14 values at a time, and adds each bin once: 3-4x faster, and
// the same digits, since every step is exact. `value()` turns the normalized digits into a
// double, top digit first: a fixed function of the exact sum, so equal sums give equal bits.
//
// The CUDA kernel (engine/device_ops_cuda.cu) adds the same pieces with integer atomics, whose
// order does not matter either; square_pieces is the one definition both use.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/hd.h"

namespace strata::optim {

struct CpuExec;  // optim/cpu_exec.h (not included: nvcc reads this header)

inline constexpr int kExactDigits = 19;
inline constexpr int kExactScaleExp = -298;  // the sum is an integer times 2^kExactScaleExp
// At most this many values go into one accumulator between normalizations (each word takes fewer
// than 2^32 additions of pieces under 2^32, so it cannot wrap).
inline constexpr std::uint64_t kExactMaxAdds = std::uint64_t{1} << 31;

// The three base-2^32 pieces of x * x, to be added to words `word`, `word + 1`, `word + 2`.
struct SquarePieces {
  int word = 0;
  std::uint32_t piece[3] = {0, 0, 0};
};

// x's biased exponent e (255: NaN or infinity) and m^2 for its integer mantissa m (< 2^24), so that
// x * x = m^2 * 2^square_shift(e) in units of 2^kExactScaleExp.
STRATA_HD std::uint32_t mantissa_square(float x, std::uint64_t& m2) {
  const std::uint32_t u = f32_bits(x);
  const std::uint32_t e = (u >> 23) & 0xFFu;
  const std::uint64_t m = e == 0 ? (u & 0x7FFFFFu) : ((u & 0x7FFFFFu) | 0x800000u);
  m2 = m * m;  // < 2^48
  return e;
}
STRATA_HD int square_shift(std::uint32_t e) { return e == 0 ? 0 : 2 * static_cast<int>(e - 1); }

// v * 2^k (v < 2^64, k in [0, 506]) as three base-2^32 pieces; the third is under 2^32.
STRATA_HD SquarePieces shifted_pieces(std::uint64_t v, int k) {
  const int r = k & 31;
  const std::uint64_t lo = v << r;                      // the low 64 bits of v * 2^r
  const std::uint64_t hi = r == 0 ? 0 : v >> (64 - r);  // the rest
  SquarePieces out;
  out.word = k >> 5;
  out.piece[0] = static_cast<std::uint32_t>(lo);
  out.piece[1] = static_cast<std::uint32_t>(lo >> 32);
  out.piece[2] = static_cast<std::uint32_t>(hi);
  return out;
}

// False for NaN or infinity (nothing to add). A zero gives three zero pieces.
STRATA_HD bool square_pieces(float x, SquarePieces& out) {
  std::uint64_t m2 = 0;
  const std::uint32_t e = mantissa_square(x, m2);
  if (e == 0xFFu) return false;
  out = shifted_pieces(m2, square_shift(e));
  return true;
}

// Trivially copyable (ranks exchange it as bytes); the device kernel writes the same layout.
struct ExactSquares {
  std::uint64_t words[kExactDigits] = {};
  std::uint64_t non_finite = 0;  // NaN and infinite values seen

  void add(float x) {
    SquarePieces p;
    if (!square_pieces(x, p)) {
      ++non_finite;
      return;
    }
    for (int i = 0; i < 3; ++i) words[p.word + i] += p.piece[i];
  }
  // Adds v * 2^k (in units of 2^kExactScaleExp; k in [0, 506]) as three pieces under 2^32.
  // Between normalizations, at most kExactMaxAdds calls of add and add_shifted together.
  void add_shifted(std::uint64_t v, int k);
  // Carries every word into the next, leaving each under 2^32.
  void normalize();
  // this += other, exactly (both normalized first).
  void merge(const ExactSquares& other);
  bool finite() const { return non_finite == 0; }
  // The sum as a double (+infinity when a value was not finite); equal sums give equal bits.
  double value() const;
};

// How many accumulators the exact sum of n_elems values is taken in when each may take at most
// kExactMaxAdds of them (the device ops' parts, engine/device_ops.h; their buffer, plan/part_bytes.h).
constexpr std::size_t exact_sum_squares_parts(std::size_t n_elems) {
  return static_cast<std::size_t>((n_elems + kExactMaxAdds - 1) / kExactMaxAdds);
}

// The exact sum of squares of n values of dtype (fp32, bf16 or fp16, widened exactly), in
// parallel in exec's arena; the result does not depend on the split.
ExactSquares exact_sum_squares(const void* data, DType dtype, std::size_t n, const CpuExec& exec);

}  // namespace strata::optim
