// The loss scaler's state machine, step by step, against DeepSpeed's DynamicLossScaler.update_scale
// (deepspeed/runtime/fp16/loss_scaler.py): hysteresis, the scale window, consecutive hysteresis,
// the minimum scale, the static scaler and config validation.
#include <gtest/gtest.h>

#include "core/error.h"
#include "optim/loss_scaler.h"

namespace strata::optim {
namespace {

struct Expect {
  bool overflow;
  double scale_after;
  int hysteresis_after;
};

void run_steps(LossScaler& s, std::initializer_list<Expect> steps) {
  int i = 0;
  for (const Expect& e : steps) {
    s.update(e.overflow);
    EXPECT_EQ(s.scale(), e.scale_after) << "after call " << i << (e.overflow ? " (overflow)" : " (clean)");
    EXPECT_EQ(s.remaining_hysteresis(), e.hysteresis_after) << "after call " << i;
    ++i;
  }
}

TEST(LossScaler, DeepSpeedDefaults) {
  LossScaler s(LossScalerConfig{});
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 65536.0);  // 2^16
  EXPECT_EQ(s.remaining_hysteresis(), 2);
  EXPECT_EQ(s.iteration(), 0);
  EXPECT_EQ(s.last_overflow_iteration(), -1);
}

TEST(LossScaler, HysteresisThenHalvingThenGrowthAfterTheWindow) {
  LossScalerConfig c;
  c.initial_scale_power = 10;  // 1024
  c.loss_scale_window = 3;
  c.hysteresis = 2;
  LossScaler s(c);
  run_steps(s, {
                   {true, 1024, 1},   // iter 0: first overflow only uses up hysteresis
                   {true, 512, 1},    // iter 1: hysteresis is 1 -> halve; hysteresis stays 1
                   {false, 512, 1},   // iter 2: stable interval 0
                   {false, 512, 1},   // iter 3: 1
                   {false, 512, 1},   // iter 4: 2
                   {false, 1024, 2},  // iter 5: 3 = window -> double, refill hysteresis
                   {false, 1024, 2},  // iter 6: 4
                   {false, 1024, 2},  // iter 7: 5
                   {false, 2048, 2},  // iter 8: 6 -> double again
                   {true, 2048, 1},   // iter 9: overflow eats hysteresis
                   {false, 2048, 1},  // iter 10: no refill without consecutive_hysteresis
                   {true, 1024, 1},   // iter 11: halve
               });
  EXPECT_EQ(s.iteration(), 12);
  EXPECT_EQ(s.last_overflow_iteration(), 11);
}

TEST(LossScaler, FirstGrowthComesAfterWindowCleanSteps) {
  LossScalerConfig c;
  c.initial_scale_power = 4;
  c.loss_scale_window = 2;
  LossScaler s(c);
  // last_overflow starts at -1: iteration i has stable interval i, so the scale doubles at i = 2, 4.
  run_steps(s, {{false, 16, 2}, {false, 16, 2}, {false, 32, 2}, {false, 32, 2}, {false, 64, 2}});
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  LossScalerConfig c;
  c.initial_scale_power = 8;
  c.loss_scale_window = 100;
  c.hysteresis = 3;
  c.consecutive_hysteresis = true;
  LossScaler s(c);
  run_steps(s, {
                   {true, 256, 2},
                   {true, 256, 1},
                   {false, 256, 3},  // refilled at once
                   {true, 256, 2},
                   {true, 256, 1},
                   {true, 128, 1},  // only consecutive overflows reach the halving
                   {true, 64, 1},
               });
}

TEST(LossScaler, HysteresisOneHalvesOnEveryOverflow) {
  LossScalerConfig c;
  c.initial_scale_power = 3;
  c.hysteresis = 1;
  c.min_loss_scale = 2;
  c.raise_error_at_min_scale = false;
  LossScaler s(c);
  run_steps(s, {{true, 4, 1}, {true, 2, 1}, {true, 2, 1}});  // clamped at min_loss_scale
}

TEST(LossScaler, OverflowAtTheMinimumScaleStopsTheRun) {
  LossScalerConfig c;
  c.initial_scale_power = 1;  // 2
  c.hysteresis = 1;
  c.min_loss_scale = 1;
  LossScaler s(c);
  s.update(true);
  EXPECT_EQ(s.scale(), 1.0);
  try {
    s.update(true);
    FAIL() << "an overflow at min_loss_scale must stop the run";
  } catch (const LossScaleError& e) {
    EXPECT_NE(std::string(e.what()).find("min_loss_scale"), std::string::npos) << e.what();
  }
}

TEST(LossScaler, StaticScaleNeverMoves) {
  LossScalerConfig c;
  c.static_loss_scale = 128;
  LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  for (bool overflow : {true, true, false, true}) {
    s.update(overflow);
    EXPECT_EQ(s.scale(), 128.0);
  }
}

TEST(LossScaler, StateRoundTrips) {
  LossScalerConfig c;
  c.loss_scale_window = 2;
  LossScaler a(c);
  for (bool o : {true, false, false, true, false}) a.update(o);
  LossScaler b(c);
  b.restore(a.state());
  for (bool o : {false, false, true, false, false, false}) {
    a.update(o);
    b.update(o);
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.remaining_hysteresis(), b.remaining_hysteresis());
  }
  EXPECT_THROW(b.restore(LossScaler::State{-1.0, 1, 0, -1}), FormatError);
}

TEST(LossScaler, BadConfigIsRejectedByName) {
  auto expect_bad = [](LossScalerConfig c, const char* key) {
    try {
      LossScaler s(c, "fp16");
      ADD_FAILURE() << key << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("fp16"), std::string::npos) << e.what();
    }
  };
  LossScalerConfig c;
  c.initial_scale_power = -1;
  expect_bad(c, "initial_scale_power");
  c = {};
  c.loss_scale_window = 0;
  expect_bad(c, "loss_scale_window");
  c = {};
  c.hysteresis = 0;
  expect_bad(c, "hysteresis");
  c = {};
  c.min_loss_scale = 0;
  expect_bad(c, "min_loss_scale");
  c = {};
  c.static_loss_scale = -2;
  expect_bad(c, "loss_scale");
}

}  // namespace
}  // namespace strata::optim
