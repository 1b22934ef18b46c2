// Learning-rate schedules (see config/lr_schedule.h).
#include "config/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace strata {
namespace {

// Warmup fraction in [0, 1) while iteration < warmup steps (DeepSpeed clamps those to >= 2).
double warmup_gamma(const SchedulerConfig& s, std::int64_t iteration, std::int64_t warmup) {
  if (s.warmup_type == "linear") return static_cast<double>(iteration) / static_cast<double>(warmup);
  return std::log(static_cast<double>(iteration + 1)) / std::log(static_cast<double>(warmup));
}

}  // namespace

double schedule_lr(const SchedulerConfig& s, double base_lr, std::int64_t iteration) {
  if (s.type.empty()) return base_lr;
  const std::int64_t warmup = std::max<std::int64_t>(2, s.warmup_num_steps);
  if (s.type == "WarmupCosineLR") {
    if (iteration < 0) return 0.0;
    double ratio;
    if (iteration < warmup) {
      ratio = s.warmup_min_ratio + warmup_gamma(s, iteration, warmup) * (1.0 - s.warmup_min_ratio);
    } else {
      const double done = static_cast<double>(iteration - warmup + 1);
      const double span = static_cast<double>(std::max<std::int64_t>(1, s.total_num_steps - warmup));
      const double progress = std::min(1.0, done / span);
      ratio = std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * (1.0 + std::cos(std::numbers::pi * progress)) / 2.0);
    }
    return base_lr * ratio;
  }
  const double min_lr = s.warmup_min_lr;
  const double delta = s.warmup_max_lr - s.warmup_min_lr;
  if (iteration < 0) return min_lr;
  double gamma = 1.0;
  if (iteration < warmup) {
    gamma = warmup_gamma(s, iteration, warmup);
  } else if (s.type == "WarmupDecayLR") {
    gamma = std::max(0.0, static_cast<double>(s.total_num_steps - iteration) /
                              std::max(1.0, static_cast<double>(s.total_num_steps - warmup)));
  }
  return min_lr + delta * gamma;
}

}  // namespace strata
