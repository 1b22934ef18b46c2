// Test helpers for the op set: buffers of any dtype filled from doubles, a dtype-aware comparison
// that prints the worst element, and central finite differences in double over a reference
// function (the gradient check every op's backward is held to).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
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

}  // namespace strata::models::testing
