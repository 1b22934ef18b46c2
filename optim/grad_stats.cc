// Deterministic gradient norm and non-finite check (see optim/grad_stats.h).
#include "optim/grad_stats.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "optim/cpu_kernels.h"
#include "optim/optimizer.h"

namespace strata::optim {

bool GradStats::finite() const { return std::isfinite(sum_squares); }

GradStats grad_stats(std::span<const GradSpan> grads, const CpuExec& exec) {
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].elems > 0 && grads[i].data == nullptr) {
      throw ConfigError(fmt::format("gradient span {}: null pointer for {} elements", i, grads[i].elems));
    }
  }
  std::size_t total_blocks = 0;
  for (const GradSpan& g : grads) total_blocks += (g.elems + kCpuBlockElems - 1) / kCpuBlockElems;
  std::vector<double> partials(total_blocks, 0.0);
  const detail::KernelSet& kernels = detail::kernels_for(exec.simd);
  detail::parallel_blocks(
      exec, grads.size(), [&](std::size_t s) { return grads[s].elems; },
      [&](std::size_t s, std::size_t begin, std::size_t end, std::size_t block) {
        const GradSpan& g = grads[s];
        const auto* data = static_cast<const std::byte*>(g.data) + begin * dtype_bytes(g.dtype);
        partials[block] = kernels.sum_squares(data, g.dtype, end - begin);
      });
  GradStats stats;
  for (double partial : partials) stats.sum_squares += partial;  // block order, whatever the threads did
  return stats;
}

GradStats grad_stats(std::span<const OptimShard> shards, const CpuExec& exec) {
  std::vector<GradSpan> grads;
  grads.reserve(shards.size());
  for (const OptimShard& s : shards) grads.push_back(GradSpan{s.grad.data, s.grad.dtype, s.master.size()});
  return grad_stats(grads, exec);
}

GradStats combine(const GradStats& a, const GradStats& b) { return GradStats{a.sum_squares + b.sum_squares}; }

double unscaled_norm(const GradStats& stats, double loss_scale) {
  STRATA_CHECK(loss_scale > 0.0, "loss scale {} must be positive", loss_scale);
  return std::sqrt(stats.sum_squares) / loss_scale;
}

double clip_coefficient(double total_norm, double max_norm) {
  if (!(max_norm > 0.0) || !std::isfinite(total_norm)) return 1.0;
  const double coef = max_norm / (total_norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

}  // namespace strata::optim
