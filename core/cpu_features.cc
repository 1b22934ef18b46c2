// Run-time CPU feature detection (see core/cpu_features.h).
#include "core/cpu_features.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace strata {

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f.f16c = __builtin_cpu_supports("f16c");
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512vl = __builtin_cpu_supports("avx512vl");
    f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
    return f;
  }();
  return features;
}

static SimdLevel hardware_level() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.f16c) return SimdLevel::Avx512;
  if (f.avx2 && f.f16c) return SimdLevel::Avx2;
  return SimdLevel::Scalar;
}

SimdLevel simd_level_capped(SimdLevel cap) {
  const SimdLevel hw = hardware_level();
  return static_cast<int>(cap) < static_cast<int>(hw) ? cap : hw;
}

SimdLevel simd_level() {
  static const SimdLevel level = [] {
    const char* env = std::getenv("STRATA_SIMD");
    if (env == nullptr || *env == '\0') return hardware_level();
    const std::string v(env);
    if (v == "scalar") return simd_level_capped(SimdLevel::Scalar);
    if (v == "avx2") return simd_level_capped(SimdLevel::Avx2);
    if (v == "avx512") return simd_level_capped(SimdLevel::Avx512);
    throw ConfigError("environment variable STRATA_SIMD='" + v +
                      "' is not a SIMD level; use scalar, avx2 or avx512 (or unset it)");
  }();
  return level;
}

std::string_view simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::Scalar: return "scalar";
    case SimdLevel::Avx2: return "avx2";
    case SimdLevel::Avx512: return "avx512";
  }
  return "?";
}

}  // namespace strata
