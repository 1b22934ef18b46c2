// Internal: the per-block CPU kernels of optim/, one set per instruction set (scalar, AVX2,
// AVX-512), chosen at run time by kernels_for(SimdLevel). The AVX2 and AVX-512 sets are one body
// (optim/cpu_kernels_simd.h) compiled in two files, each with a GCC target pragma (never -march). A block is at most kCpuBlockElems elements of one shard; the
// parallel drivers (adam_cpu.cc, grad_stats.cc, memory_pass.cc, unfused_passes.cc) cut the work
// into blocks and call these.
#pragma once

#include <cstddef>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "optim/optim_math.h"

namespace strata::optim::detail {

// Pointers already offset to the block's first element; `out` may be null (no low-precision copy).
struct AdamBlock {
  float* p;
  float* m;
  float* v;
  const void* g;
  DType g_dtype;
  void* out;
  DType out_dtype;
  std::size_t n;
};

// Number of double accumulators (lanes) of the sum of squares: element i of a block goes to lane
// i % kSumLanes in every path, and the lanes are added 0..15 in order at the end, so the block
// partial has the same bits on every instruction set. (double)g * g is exact, so a fused
// multiply-add and a multiply-then-add give the same bits here.
inline constexpr std::size_t kSumLanes = 16;

struct KernelSet {
  SimdLevel level;
  // One AdamW/Adam update of a block (optim/optim_math.h adam_element per element).
  void (*adam)(const AdamStepConsts& c, WeightDecayMode mode, const AdamBlock& b);
  // The Adam-shaped memory pass: the same streams as `adam` (p, m, v and g read, p, m, v written
  // in place) with trivial math: m += g, v += g, p += m. The yardstick of `strata bench adam`.
  void (*memory_pass)(const AdamBlock& b);
  // Sum of squares of a block of gradients in double (see kSumLanes); non-finite iff any element is.
  double (*sum_squares)(const void* g, DType g_dtype, std::size_t n);
  // Unfused baseline passes (optim/unfused_passes.h).
  void (*scale_inplace)(float* g, std::size_t n, float scale);
  void (*widen_scale)(const void* g, DType g_dtype, float* out, std::size_t n, float scale);
  bool (*has_nonfinite)(const float* g, std::size_t n);
  void (*pack)(const float* p, void* out, DType out_dtype, std::size_t n);
};

const KernelSet& scalar_kernels();
const KernelSet& avx2_kernels();
const KernelSet& avx512_kernels();

// The set for `level` (the caller has already capped it at what the CPU supports).
const KernelSet& kernels_for(SimdLevel level);

// Scalar tails and the scalar path share these (the same element math as the SIMD bodies).
inline float load_grad(const void* g, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(g)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const bf16*>(g)[i]);
    case DType::F16: return f16_to_f32(static_cast<const fp16*>(g)[i]);
  }
  return 0.0f;
}

inline void store_low(void* out, DType dtype, std::size_t i, float x) {
  if (dtype == DType::BF16) {
    static_cast<bf16*>(out)[i] = f32_to_bf16(x);
  } else if (dtype == DType::F16) {
    static_cast<fp16*>(out)[i] = f32_to_f16(x);
  } else {
    static_cast<float*>(out)[i] = x;
  }
}

// Scalar Adam over elements [from, n) of a block (the SIMD paths' tail).
template <WeightDecayMode kMode>
inline void adam_tail(const AdamStepConsts& c, const AdamBlock& b, std::size_t from) {
  for (std::size_t i = from; i < b.n; ++i) {
    adam_element<kMode>(b.p[i], b.m[i], b.v[i], load_grad(b.g, b.g_dtype, i), c);
    if (b.out != nullptr) store_low(b.out, b.out_dtype, i, b.p[i]);
  }
}

inline void memory_pass_tail(const AdamBlock& b, std::size_t from) {
  for (std::size_t i = from; i < b.n; ++i) {
    const float g = load_grad(b.g, b.g_dtype, i);
    b.m[i] += g;
    b.v[i] += g;
    b.p[i] += b.m[i];
  }
}

// Adds element i's square to its lane (the shared lane rule of kSumLanes).
inline void sum_squares_tail(const void* g, DType dtype, std::size_t from, std::size_t n, double* lanes) {
  for (std::size_t i = from; i < n; ++i) {
    const double x = load_grad(g, dtype, i);
    lanes[i % kSumLanes] += x * x;
  }
}

inline double combine_lanes(const double* lanes) {
  double total = 0.0;
  for (std::size_t l = 0; l < kSumLanes; ++l) total += lanes[l];
  return total;
}

}  // namespace strata::optim::detail
