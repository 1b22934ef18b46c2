// Learning-rate schedules with DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py): WarmupLR,
// WarmupDecayLR, WarmupCosineLR, or a constant lr when no scheduler is configured.
//
// DeepSpeed sets the scheduler's lr at construction (iteration -1: the warmup minimum) and steps
// the scheduler after each optimizer step, so optimizer step k (0-based) runs with the schedule's
// value at iteration k - 1. lr_for_step reproduces that, so loss curves line up with DeepSpeed runs
// of the same config.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace strata {

// The schedule's value at DeepSpeed iteration `iteration` (>= -1); `base_lr` is optimizer.params.lr.
double schedule_lr(const SchedulerConfig& schedule, double base_lr, std::int64_t iteration);

// The lr optimizer step `step` (0-based) runs with.
inline double lr_for_step(const SchedulerConfig& schedule, double base_lr, std::int64_t step) {
  return schedule_lr(schedule, base_lr, step - 1);
}

}  // namespace strata
