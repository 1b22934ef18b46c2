// The DeepSpeed-compatible loss scaler (see optim/loss_scaler.h).
#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace strata::optim {

namespace {
constexpr double kScaleFactor = 2.0;  // DeepSpeed's fixed scale_factor
}

void validate(const LossScalerConfig& c, std::string_view where) {
  if (!std::isfinite(c.static_loss_scale) || c.static_loss_scale < 0.0) {
    throw ConfigError(fmt::format("{}: loss_scale = {} is out of range; use 0 for dynamic loss scaling or a "
                                  "positive static scale",
                                  where, c.static_loss_scale));
  }
  if (c.initial_scale_power < 0 || c.initial_scale_power > 126) {
    throw ConfigError(fmt::format("{}: initial_scale_power = {} is out of range; it must be in [0, 126] "
                                  "(DeepSpeed's default is 16)",
                                  where, c.initial_scale_power));
  }
  if (c.loss_scale_window < 1) {
    throw ConfigError(fmt::format("{}: loss_scale_window = {} is out of range; it must be >= 1 (default 1000)",
                                  where, c.loss_scale_window));
  }
  if (c.hysteresis < 1) {
    throw ConfigError(
        fmt::format("{}: hysteresis = {} is out of range; it must be >= 1 (default 2)", where, c.hysteresis));
  }
  const double initial = std::ldexp(1.0, c.initial_scale_power);
  if (!std::isfinite(c.min_loss_scale) || c.min_loss_scale <= 0.0 || c.min_loss_scale > initial) {
    throw ConfigError(fmt::format("{}: min_loss_scale = {} is out of range; it must be > 0 and <= the initial "
                                  "scale 2^{} (default 1)",
                                  where, c.min_loss_scale, c.initial_scale_power));
  }
}

LossScaler::LossScaler(const LossScalerConfig& config, std::string_view where)
    : config_(config),
      dynamic_(config.static_loss_scale == 0.0),
      scale_(0.0),
      cur_hysteresis_(config.hysteresis) {
  validate(config, where);
  scale_ = dynamic_ ? std::ldexp(1.0, config.initial_scale_power) : config.static_loss_scale;
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) {
    ++cur_iter_;
    if (overflow) last_overflow_iter_ = cur_iter_ - 1;
    return;
  }
  if (overflow) {
    if (config_.hysteresis == 1 || cur_hysteresis_ == 1) {
      if (scale_ == config_.min_loss_scale && config_.raise_error_at_min_scale) {
        throw LossScaleError(fmt::format(
            "fp16 gradients overflowed at iteration {} with the loss scale already at min_loss_scale = {}; the "
            "run cannot continue: lower the learning rate, look for bad samples, use bf16, or lower "
            "fp16.min_loss_scale",
            cur_iter_, config_.min_loss_scale));
      }
      const double next = std::max(scale_ / kScaleFactor, config_.min_loss_scale);
      spdlog::info("fp16 gradient overflow: skipping step {}, loss scale {} -> {}", cur_iter_, scale_, next);
      scale_ = next;
    } else {
      spdlog::info("fp16 gradient overflow: skipping step {} at loss scale {}; hysteresis {} -> {}", cur_iter_,
                   scale_, cur_hysteresis_, cur_hysteresis_ - 1);
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (config_.consecutive_hysteresis) cur_hysteresis_ = config_.hysteresis;
    const std::int64_t stable_interval = cur_iter_ - last_overflow_iter_ - 1;
    if (stable_interval > 0 && stable_interval % config_.loss_scale_window == 0) {
      if (!config_.consecutive_hysteresis) cur_hysteresis_ = config_.hysteresis;
      scale_ *= kScaleFactor;
    }
  }
  ++cur_iter_;
}

void LossScaler::restore(const State& state) {
  if (!(state.scale > 0.0) || !std::isfinite(state.scale) || state.cur_hysteresis < 0 || state.cur_iter < 0 ||
      state.last_overflow_iter < -1) {
    throw FormatError(fmt::format("loss scaler state (scale {}, hysteresis {}, iteration {}, last overflow {}) is "
                                  "not valid; the checkpoint is damaged",
                                  state.scale, state.cur_hysteresis, state.cur_iter, state.last_overflow_iter));
  }
  scale_ = state.scale;
  cur_hysteresis_ = state.cur_hysteresis;
  cur_iter_ = state.cur_iter;
  last_overflow_iter_ = state.last_overflow_iter;
}

}  // namespace strata::optim
