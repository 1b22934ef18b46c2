// Learning-rate schedules against values worked out by hand from DeepSpeed's formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "config/lr_schedule.h"

namespace strata {
namespace {

TEST(LrSchedule, ConstantWithoutScheduler) {
  SchedulerConfig s;
  EXPECT_EQ(lr_for_step(s, 3e-4, 0), 3e-4);
  EXPECT_EQ(lr_for_step(s, 3e-4, 1000), 3e-4);
}

TEST(LrSchedule, WarmupLrLogAndLinear) {
  SchedulerConfig s;
  s.type = "WarmupLR";
  s.warmup_min_lr = 0.0;
  s.warmup_max_lr = 1.0;
  s.warmup_num_steps = 10;
  // Step 0 runs at iteration -1: the minimum, as DeepSpeed's constructor sets it.
  EXPECT_EQ(lr_for_step(s, 9.9, 0), 0.0);
  EXPECT_DOUBLE_EQ(schedule_lr(s, 9.9, 4), std::log(5.0) / std::log(10.0));
  EXPECT_DOUBLE_EQ(schedule_lr(s, 9.9, 10), 1.0);
  s.warmup_type = "linear";
  EXPECT_DOUBLE_EQ(schedule_lr(s, 9.9, 4), 0.4);
  EXPECT_DOUBLE_EQ(schedule_lr(s, 9.9, 500), 1.0);
}

TEST(LrSchedule, WarmupDecayGoesLinearlyToZero) {
  SchedulerConfig s;
  s.type = "WarmupDecayLR";
  s.warmup_max_lr = 2.0;
  s.warmup_num_steps = 10;
  s.total_num_steps = 110;
  s.warmup_type = "linear";
  EXPECT_DOUBLE_EQ(schedule_lr(s, 0, 10), 2.0);
  EXPECT_DOUBLE_EQ(schedule_lr(s, 0, 60), 1.0);
  EXPECT_DOUBLE_EQ(schedule_lr(s, 0, 110), 0.0);
  EXPECT_DOUBLE_EQ(schedule_lr(s, 0, 200), 0.0);
}

TEST(LrSchedule, WarmupCosineUsesRatiosOfBaseLr) {
  SchedulerConfig s;
  s.type = "WarmupCosineLR";
  s.warmup_num_steps = 10;
  s.total_num_steps = 110;
  s.cos_min_ratio = 0.1;
  s.warmup_type = "linear";
  EXPECT_DOUBLE_EQ(schedule_lr(s, 2.0, 5), 1.0);  // halfway through warmup
  // One step after warmup starts the cosine: progress 1/100.
  EXPECT_NEAR(schedule_lr(s, 2.0, 10), 2.0 * (0.1 + 0.9 * (1 + std::cos(std::numbers::pi * 0.01)) / 2), 1e-12);
  EXPECT_NEAR(schedule_lr(s, 2.0, 109), 0.2, 1e-12);
  EXPECT_NEAR(schedule_lr(s, 2.0, 1000), 0.2, 1e-12);  // stays at the floor
}

}  // namespace
}  // namespace strata
