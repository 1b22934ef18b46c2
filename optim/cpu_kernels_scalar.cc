// The scalar (baseline x86-64) per-block kernels: the reference the SIMD paths must match bit for
// bit, and the path for CPUs without AVX2. Also kernels_for(), the run-time choice of the set.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "optim/cpu_kernels.h"

namespace strata::optim::detail {
namespace {

void adam_scalar(const AdamStepConsts& c, WeightDecayMode mode, const AdamBlock& b) {
  if (mode == WeightDecayMode::L2) {
    adam_tail<WeightDecayMode::L2>(c, b, 0);
  } else {
    adam_tail<WeightDecayMode::Decoupled>(c, b, 0);
  }
}

void memory_pass_scalar(const AdamBlock& b) { memory_pass_tail(b, 0); }

double sum_squares_scalar(const void* g, DType dtype, std::size_t n) {
  double lanes[kSumLanes] = {};
  sum_squares_tail(g, dtype, 0, n, lanes);
  return combine_lanes(lanes);
}

void scale_inplace_scalar(float* g, std::size_t n, float scale) {
  for (std::size_t i = 0; i < n; ++i) g[i] *= scale;
}

void widen_scale_scalar(const void* g, DType dtype, float* out, std::size_t n, float scale) {
  for (std::size_t i = 0; i < n; ++i) out[i] = load_grad(g, dtype, i) * scale;
}

bool has_nonfinite_scalar(const float* g, std::size_t n) {
  std::uint32_t any = 0;
  for (std::size_t i = 0; i < n; ++i) {
    any |= static_cast<std::uint32_t>((f32_bits(g[i]) & 0x7F800000u) == 0x7F800000u);
  }
  return any != 0;
}

void pack_scalar(const float* p, void* out, DType dtype, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) store_low(out, dtype, i, p[i]);
}

}  // namespace

const KernelSet& scalar_kernels() {
  static const KernelSet set{SimdLevel::Scalar,  adam_scalar,          memory_pass_scalar,
                             sum_squares_scalar, scale_inplace_scalar, widen_scale_scalar,
                             has_nonfinite_scalar, pack_scalar};
  return set;
}

const KernelSet& kernels_for(SimdLevel level) {
  // Never run an instruction set the CPU lacks, whatever the caller asked for.
  switch (simd_level_capped(level)) {
    case SimdLevel::Avx512: return avx512_kernels();
    case SimdLevel::Avx2: return avx2_kernels();
    case SimdLevel::Scalar: return scalar_kernels();
  }
  STRATA_CHECK(false, "unknown SIMD level {}", static_cast<int>(level));
  return scalar_kernels();
}

}  // namespace strata::optim::detail
