// Run-time CPU feature detection and the SIMD level kernels dispatch on.
//
// Kernels (dtype bulk conversions, CPU Adam, model ops) are compiled for several instruction sets
// with GCC target attributes and choose one at run time, never at compile time (DeepSpeed's
// cpu_adam picks at compile time; a binary built on one machine then runs slowly or crashes on
// another). STRATA_SIMD=scalar|avx2|avx512 in the environment caps the level, for tests and
// benchmarks; it can lower the level, never raise it past what the CPU has.
#pragma once

#include <string_view>

namespace strata {

enum class SimdLevel : int { Scalar = 0, Avx2 = 1, Avx512 = 2 };

struct CpuFeatures {
  bool avx2 = false;      // with FMA
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512bf16 = false;
};

// What the CPU supports (cached).
const CpuFeatures& cpu_features();

// The best level the CPU supports, lowered by STRATA_SIMD when set. Avx2 implies AVX2+FMA+F16C;
// Avx512 implies AVX-512 F+BW+VL.
SimdLevel simd_level();

// The best level the CPU supports, capped at `cap` (for tests sweeping every path).
SimdLevel simd_level_capped(SimdLevel cap);

std::string_view simd_level_name(SimdLevel level);

}  // namespace strata
