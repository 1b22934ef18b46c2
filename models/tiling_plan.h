// The tiling a training run uses (memory-centric tiling, models/tiling.h), decided from the config,
// the model and the device before the engine is built: the configured strata.tiling; or, when none
// is configured and the untiled run plan's largest param group in use is what does not fit the
// device (its resident state and activations do), every block tiled automatically; and "auto"
// counts sized so one tile group in use (gathered, its gradient and its reduction) fits a third of
// what the device has left after the activations and the resident state of the untiled plan. The
// bytes come from the tier planner's sum over the run plan (engine/tier_plan.h).
#pragma once

#include <cstdint>
#include <string>

#include "engine/config.h"
#include "models/model_config.h"
#include "models/tiling.h"

namespace strata::models {

struct TilingDecision {
  TilingSpec spec;
  bool automatic = false;  // nothing was configured and the largest group did not fit
  std::int64_t n_layers = 0;
  // "layer:attn/mlp ..." for the log; empty when nothing is tiled.
  std::string describe() const;
};

TilingDecision plan_tiling(const TrainConfig& config, const ModelConfig& model, bool checkpointing, int world_size,
                           std::uint64_t device_bytes);

}  // namespace strata::models
