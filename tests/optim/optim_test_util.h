// Shared helpers of the optim/ tests: typed gradient buffers, seeded random fills, bitwise
// comparison that prints the worst element, the SIMD levels this CPU can run, and the plain
// scalar references (a loop over the STRATA_HD element functions of optim/optim_math.h, which
// the scalar path, the SIMD tails and the CUDA kernel share).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "optim/optim_math.h"
#include "optim/optimizer.h"

namespace strata::optim::testing {

// A gradient (or low-precision output) buffer in fp32, bf16 or fp16.
class TypedBuffer {
 public:
  TypedBuffer(DType dtype, std::size_t n) : dtype_(dtype), n_(n), bytes_(n * dtype_bytes(dtype) + 1) {}
  DType dtype() const { return dtype_; }
  std::size_t size() const { return n_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  float get(std::size_t i) const {
    switch (dtype_) {
      case DType::F32: {
        float f;
        std::memcpy(&f, bytes_.data() + 4 * i, 4);
        return f;
      }
      case DType::BF16: return bf16_to_f32(bf16{bits16(i)});
      case DType::F16: return f16_to_f32(fp16{bits16(i)});
    }
    return 0.0f;
  }
  // Stores x rounded to the buffer's type.
  void set(std::size_t i, float x) {
    switch (dtype_) {
      case DType::F32: std::memcpy(bytes_.data() + 4 * i, &x, 4); break;
      case DType::BF16: set_bits16(i, f32_to_bf16(x).bits); break;
      case DType::F16: set_bits16(i, f32_to_f16(x).bits); break;
    }
  }
  std::uint16_t bits16(std::size_t i) const {
    std::uint16_t b;
    std::memcpy(&b, bytes_.data() + 2 * i, 2);
    return b;
  }
  void set_bits16(std::size_t i, std::uint16_t b) { std::memcpy(bytes_.data() + 2 * i, &b, 2); }
  bool operator==(const TypedBuffer& o) const { return dtype_ == o.dtype_ && bytes_ == o.bytes_; }

 private:
  DType dtype_;
  std::size_t n_;
  std::vector<std::uint8_t> bytes_;
};

// fp32 master weights and two moments plus a typed gradient: one shard's worth of state.
struct ShardData {
  std::vector<float> p, m, v;
  TypedBuffer g;
  TypedBuffer out;
  bool with_out;

  ShardData(std::size_t n, DType g_dtype, DType out_dtype, bool out_enabled)
      : p(n), m(n), v(n), g(g_dtype, n), out(out_dtype, n), with_out(out_enabled) {}

  // Random state: p ~ N(0,1), m ~ N(0, 1e-2), v = |N(0, 1e-4)|, g ~ N(0, grad_sigma) (rounded to g's type).
  void fill(std::uint32_t seed, float grad_sigma = 1e-2f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] = n01(rng);
      m[i] = 1e-2f * n01(rng);
      v[i] = std::fabs(1e-4f * n01(rng));
      g.set(i, grad_sigma * n01(rng));
    }
  }

  OptimShard shard() {
    OptimShard s;
    s.master = p;
    s.moment1 = m;
    s.moment2 = v;
    s.grad = GradRef{g.data(), g.dtype()};
    if (with_out) s.out = LowPrecisionOut{out.data(), out.dtype()};
    return s;
  }
};

// Bitwise equality of two float arrays; on failure names the first differing element and the count.
inline ::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b,
                                            const char* what) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  std::size_t bad = 0;
  std::size_t first = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (f32_bits(a[i]) != f32_bits(b[i])) {
      if (bad == 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  // AssertionResult streams each piece through its own Message, so format the hex here.
  std::ostringstream text;
  text << what << ": " << bad << " of " << a.size() << " elements differ; first at " << first << ": "
       << a[first] << " (0x" << std::hex << f32_bits(a[first]) << std::dec << ") vs " << b[first] << " (0x"
       << std::hex << f32_bits(b[first]) << ")";
  return ::testing::AssertionFailure() << text.str();
}

// The SIMD levels of this CPU above scalar (the tests sweep each).
inline std::vector<SimdLevel> simd_levels_available() {
  std::vector<SimdLevel> levels;
  if (simd_level_capped(SimdLevel::Avx2) == SimdLevel::Avx2) levels.push_back(SimdLevel::Avx2);
  if (simd_level_capped(SimdLevel::Avx512) == SimdLevel::Avx512) levels.push_back(SimdLevel::Avx512);
  return levels;
}

// The plain scalar reference of AdamW/Adam: the shared element function over every element, then
// the core/dtype.h scalar rounding for the low-precision copy.
template <WeightDecayMode kMode>
void reference_adam(const AdamStepConsts& c, ShardData& d) {
  for (std::size_t i = 0; i < d.p.size(); ++i) {
    adam_element<kMode>(d.p[i], d.m[i], d.v[i], d.g.get(i), c);
    if (d.with_out) d.out.set(i, d.p[i]);
  }
}

inline void reference_adam(const AdamStepConsts& c, WeightDecayMode mode, ShardData& d) {
  if (mode == WeightDecayMode::L2) {
    reference_adam<WeightDecayMode::L2>(c, d);
  } else {
    reference_adam<WeightDecayMode::Decoupled>(c, d);
  }
}

}  // namespace strata::optim::testing
