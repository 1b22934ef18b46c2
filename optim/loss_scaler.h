// The fp16 loss scaler, with DeepSpeed's semantics and knobs (the `fp16` config section):
// initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis, min_loss_scale, and a
// static scale when loss_scale > 0.
//
// The state machine follows deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler.update_scale,
// called once per step with whether the step's gradients overflowed:
//  * overflow: if hysteresis is 1 (configured) or the remaining hysteresis is 1, the scale is
//    halved, not below min_loss_scale (and if it already sits at min_loss_scale the run fails with
//    LossScaleError, DeepSpeed's raise_error_at_min_scale); otherwise only the remaining hysteresis
//    drops by one. Either way the step is skipped and remembered as the last overflow.
//  * no overflow: with consecutive_hysteresis the remaining hysteresis is refilled at once; and when
//    (iteration - last_overflow_iteration - 1) is a positive multiple of loss_scale_window the
//    scale doubles (and without consecutive_hysteresis the hysteresis is refilled then).
//  * the iteration counter advances on every call.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/error.h"

namespace strata::optim {

// The loss scale cannot go lower and gradients still overflow: training cannot continue.
class LossScaleError : public Error {
 public:
  using Error::Error;
};

// DeepSpeed's `fp16` section defaults.
struct LossScalerConfig {
  double static_loss_scale = 0.0;  // fp16.loss_scale: > 0 fixes the scale, 0 means dynamic
  int initial_scale_power = 16;    // the dynamic scale starts at 2^initial_scale_power
  std::int64_t loss_scale_window = 1000;
  int hysteresis = 2;              // DeepSpeed's delayed_shift
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
  bool raise_error_at_min_scale = true;
};

// Throws ConfigError naming `where` and the key: initial_scale_power in [0, 126],
// loss_scale_window >= 1, hysteresis >= 1, min_loss_scale > 0 and <= the initial scale,
// static_loss_scale >= 0 and finite.
void validate(const LossScalerConfig& config, std::string_view where);

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& config, std::string_view where = "fp16");

  bool dynamic() const { return dynamic_; }
  double scale() const { return scale_; }
  // The remaining hysteresis (overflows tolerated before the scale drops, counting this one).
  int remaining_hysteresis() const { return cur_hysteresis_; }
  std::int64_t iteration() const { return cur_iter_; }
  std::int64_t last_overflow_iteration() const { return last_overflow_iter_; }

  // Records one step's outcome; see the header comment. A static scaler never changes.
  void update(bool overflow);

  // Checkpoint support: the full state.
  struct State {
    double scale;
    int cur_hysteresis;
    std::int64_t cur_iter;
    std::int64_t last_overflow_iter;
  };
  State state() const { return State{scale_, cur_hysteresis_, cur_iter_, last_overflow_iter_}; }
  void restore(const State& state);

 private:
  LossScalerConfig config_;
  bool dynamic_;
  double scale_;
  int cur_hysteresis_;
  std::int64_t cur_iter_ = 0;
  std::int64_t last_overflow_iter_ = -1;
};

}  // namespace strata::optim
