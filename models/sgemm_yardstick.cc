// The sgemm yardstick (models/sgemm_yardstick.h).
#include "models/sgemm_yardstick.h"

#include <chrono>
#include <vector>

#include "core/dtype.h"
#include "models/kernels/ops.h"

namespace strata::models {

double measure_sgemm_gflops(std::int64_t m, std::int64_t n, std::int64_t k, double min_seconds) {
  std::vector<float> a(static_cast<std::size_t>(m * k), 0.5f), b(static_cast<std::size_t>(n * k), 0.25f),
      c(static_cast<std::size_t>(m * n));
  MatmulArgs args{DType::F32, Trans::No, Trans::Yes, m, n, k, a.data(), k, 0, b.data(), k, 0, c.data(), n, 0, 1};
  const KernelContext inline_ctx{};
  matmul(inline_ctx, args);  // warm up
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < min_seconds || reps < 3) {
    matmul(inline_ctx, args);
    ++reps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return 2.0 * static_cast<double>(m * n * k) * reps / elapsed / 1e9;
}

}  // namespace strata::models
