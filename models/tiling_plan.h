// The tiling a training run uses (memory-centric tiling, models/tiling.h), decided from the config,
// the model and the device before the engine is built: the configured strata.tiling; or, when none
// is configured and the untiled run plan's largest param group in use is what does not fit the
// device (its resident state and activations do), every block tiled automatically; and "auto"
// counts sized so one tile group in use (gathered, its gradient and its reduction) fits a third of
// what the device has left after the activations and the resident state of the untiled plan. The
// bytes come from the tier planner's sum over the run plan (plan/tier_plan.h).
#pragma once

#include <cstdint>
#include <string>

#include "core/device/device.h"
#include "config/config.h"
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

// Note [Linear chunks by default]: the block linears run in `strata.tiling.chunks` pieces when the
// config sets it; else in kDefaultTileChunks, so that tiled and untiled runs give the same bits
// (Note [Tile-invariant linear layers] in models/tiling.h) — except on a cuda device outside exact mode with nothing
// tiled, where they run whole (one chunk): 16 chunks made GPT-2 1.5B's forward+backward 12,294 GEMM
// calls on an H200 (docs/MEASUREMENTS.md, "On the GPU"). There a run that is tiled (by the config
// or automatically) rounds differently from the untiled one; exact runs and every sim run keep the
// promise. Untiled, the chunk count changes only how dx = dy W is summed, not the parameter layout,
// so checkpoints move freely between the two.
std::int64_t linear_chunks(const TrainConfig& config, const TilingSpec& spec, DeviceKind device);

TilingDecision plan_tiling(const TrainConfig& config, const ModelConfig& model, bool checkpointing, int world_size,
                           std::uint64_t device_bytes, DeviceKind device = DeviceKind::Sim);

}  // namespace strata::models
