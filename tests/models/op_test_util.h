// Test helpers for the op set: buffers of any dtype filled from doubles, a dtype-aware comparison
// that prints the worst element, central finite differences in double over a reference function
// (the gradient check every op's backward is held to), and the per-element bounded and bitwise
// comparisons of two implementations (the CUDA kernels against the CPU ones, ops_cuda_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace strata::models::testing {

using Vec = std::vector<double>;

// A host tensor of `dtype` elements.
struct Buf {
  DType dtype = DType::F32;
  std::vector<std::uint8_t> bytes;
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  std::size_t size() const { return bytes.size() / dtype_bytes(dtype); }
};

inline Buf make_buf(const Vec& v, DType dtype) {
  Buf b{dtype, std::vector<std::uint8_t>(v.size() * dtype_bytes(dtype))};
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float f = static_cast<float>(v[i]);
    switch (dtype) {
      case DType::F32: std::memcpy(b.bytes.data() + 4 * i, &f, 4); break;
      case DType::BF16: { bf16 h = f32_to_bf16(f); std::memcpy(b.bytes.data() + 2 * i, &h, 2); break; }
      case DType::F16: { fp16 h = f32_to_f16(f); std::memcpy(b.bytes.data() + 2 * i, &h, 2); break; }
    }
  }
  return b;
}

inline Vec read_buf(const Buf& b) {
  Vec v(b.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    switch (b.dtype) {
      case DType::F32: { float f; std::memcpy(&f, b.bytes.data() + 4 * i, 4); v[i] = f; break; }
      case DType::BF16: { bf16 h; std::memcpy(&h, b.bytes.data() + 2 * i, 2); v[i] = bf16_to_f32(h); break; }
      case DType::F16: { fp16 h; std::memcpy(&h, b.bytes.data() + 2 * i, 2); v[i] = f16_to_f32(h); break; }
    }
  }
  return v;
}

// Values as they are after rounding to `dtype` (what the kernel actually sees).
inline Vec quantize(const Vec& v, DType dtype) { return read_buf(make_buf(v, dtype)); }

inline Vec random_vec(std::size_t n, std::uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Relative tolerance by dtype: fp32 kernels accumulate in fp32; 16-bit outputs are rounded once
// more (bf16 has 8 mantissa bits, fp16 11) and their inputs were rounded too.
inline double dtype_tolerance(DType dtype) {
  switch (dtype) {
    case DType::F32: return 2e-4;
    case DType::BF16: return 3e-2;
    case DType::F16: return 4e-3;
  }
  return 0;
}

// |got - want| <= tol * (1 + |want|) for every element; the worst element is printed on failure.
inline void expect_close(const std::string& what, const Vec& got, const Vec& want, double tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = -1;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i]));
    if (!(err <= worst) || std::isnan(got[i])) {
      worst = std::isnan(got[i]) ? INFINITY : err;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": worst element " << worst_i << " got " << got[worst_i] << " want "
                        << want[worst_i] << " (relative error " << worst << ", tolerance " << tol << ")";
}

// d/dx_i of sum(cot * f(x)) by central differences in double, for every i in `which` (all if empty).
inline Vec finite_difference(const std::function<Vec(const Vec&)>& f, const Vec& x, const Vec& cot,
                             const std::vector<std::size_t>& which = {}, double h = 1e-5) {
  Vec grad(x.size(), 0.0);
  auto loss = [&](const Vec& xx) {
    const Vec y = f(xx);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += cot[i] * y[i];
    return s;
  };
  Vec xx = x;
  auto one = [&](std::size_t i) {
    xx[i] = x[i] + h;
    const double up = loss(xx);
    xx[i] = x[i] - h;
    const double down = loss(xx);
    xx[i] = x[i];
    grad[i] = (up - down) / (2 * h);
  };
  if (which.empty()) {
    for (std::size_t i = 0; i < x.size(); ++i) one(i);
  } else {
    for (auto i : which) one(i);
  }
  return grad;
}

// `count` distinct indices below n (deterministic).
inline std::vector<std::size_t> sample_indices(std::size_t n, std::size_t count, std::uint32_t seed) {
  std::vector<std::size_t> idx(n);
  for (std::size_t i = 0; i < n; ++i) idx[i] = i;
  std::mt19937 rng(seed);
  std::shuffle(idx.begin(), idx.end(), rng);
  idx.resize(std::min(n, count));
  return idx;
}

inline Vec pick(const Vec& v, const std::vector<std::size_t>& which) {
  Vec out;
  for (auto i : which) out.push_back(v[i]);
  return out;
}

inline const DType kAllDtypes[] = {DType::F32, DType::BF16, DType::F16};

// ---- Two implementations of one op, element by element (ops_cuda_test.cc) ----

// One unit in the last place of a 16-bit `dtype` at magnitude |v|; 0 for fp32, whose rounding the
// callers' bounds already include. Two fp32 results within a bound of each other may round to
// neighbouring 16-bit values, so a 16-bit comparison allows this much more.
inline double ulp16(DType dtype, double v) {
  if (dtype == DType::F32 || v == 0 || !std::isfinite(v)) return 0;
  int exp2 = 0;
  std::frexp(std::abs(v), &exp2);  // |v| = f 2^exp2, f in [0.5, 1)
  exp2 -= 1;
  if (dtype == DType::F16) exp2 = std::max(exp2, -14);  // fp16 subnormals are evenly spaced
  return std::ldexp(1.0, exp2 - (dtype == DType::BF16 ? 7 : 10));
}

// Prints one line to stdout and records it as a test property, so a run's log shows how far each
// comparison is from failing, not only whether it failed.
inline void report_margin(const std::string& what, const std::string& line) {
  std::cout << "[ margin   ] " << what << ": " << line << std::endl;
  std::string key = what;
  for (char& ch : key) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  ::testing::Test::RecordProperty("margin_" + key, line);
}

// |got - want| <= bound[i] for every element, plus ulp16 for bf16/fp16 elements. bound[i] == 0
// means the two must be equal (an element the op must not touch, or an exact op); a NaN matches
// only a NaN. Reports the largest absolute and relative error and the worst error/bound ratio.
inline void expect_within_bounds(const std::string& what, const Buf& got_buf, const Buf& want_buf, const Vec& bound) {
  const Vec got = read_buf(got_buf), want = read_buf(want_buf);
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(bound.size(), want.size()) << what;
  double max_abs = 0, max_rel = 0, worst = -1;
  std::size_t worst_i = 0, over = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    double ratio = 0;
    if (std::isnan(got[i]) || std::isnan(want[i])) {
      ratio = std::isnan(got[i]) && std::isnan(want[i]) ? 0 : INFINITY;
    } else if (bound[i] == 0) {
      ratio = got[i] == want[i] ? 0 : INFINITY;
    } else {
      ratio = err / (bound[i] + ulp16(got_buf.dtype, std::max(std::abs(got[i]), std::abs(want[i]))));
    }
    if (!std::isnan(err)) {
      max_abs = std::max(max_abs, err);
      if (want[i] != 0) max_rel = std::max(max_rel, err / std::abs(want[i]));
    }
    if (!(ratio <= 1)) ++over;
    if (!(ratio <= worst)) {
      worst = ratio;
      worst_i = i;
    }
  }
  std::ostringstream line;
  line.precision(3);
  line << got.size() << " elements, max |err| " << max_abs << ", max rel err " << max_rel << ", worst err/bound "
       << worst;
  if (!got.empty()) {
    line.precision(9);
    line << " at element " << worst_i << " (got " << got[worst_i] << ", want " << want[worst_i] << ", bound "
         << bound[worst_i] << ")";
  }
  line << ", " << over << " over";
  report_margin(what, line.str());
  EXPECT_EQ(over, 0u) << what << ": " << line.str();
}

// Equal bits element by element; a NaN matches any NaN (a GPU may write the canonical one).
inline void expect_same_bits(const std::string& what, const Buf& got_buf, const Buf& want_buf) {
  ASSERT_EQ(got_buf.dtype, want_buf.dtype) << what;
  ASSERT_EQ(got_buf.bytes.size(), want_buf.bytes.size()) << what;
  const Vec got = read_buf(got_buf), want = read_buf(want_buf);
  const std::size_t esize = dtype_bytes(got_buf.dtype);
  std::size_t differ = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool nans = std::isnan(got[i]) && std::isnan(want[i]);
    if (!nans && std::memcmp(got_buf.bytes.data() + i * esize, want_buf.bytes.data() + i * esize, esize) != 0) {
      if (differ++ == 0) first = i;
    }
  }
  std::ostringstream line;
  line.precision(9);
  line << got.size() << " elements, " << differ << " not bit-identical";
  if (differ > 0) line << " (first at element " << first << ": got " << got[first] << ", want " << want[first] << ")";
  report_margin(what, line.str());
  EXPECT_EQ(differ, 0u) << what << ": " << line.str();
}

}  // namespace strata::models::testing
