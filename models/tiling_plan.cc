// The tiling decision of a training run (see models/tiling_plan.h).
#include "models/tiling_plan.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plan/tier_plan.h"
#include "models/decoder.h"
#include "models/decoder_params.h"

namespace strata::models {

std::string TilingDecision::describe() const {
  if (!spec.tiled()) return "";
  std::string counts;
  for (std::int64_t l = 0; l < n_layers; ++l) {
    const BlockTiling b = spec.block(l);
    counts += fmt::format("{}{}:{}/{}", l == 0 ? "" : " ", l, b.attn, b.mlp);
  }
  return fmt::format("tiling (layer:attn/mlp tiles, {} chunks): {}", spec.chunks, counts);
}

std::int64_t linear_chunks(const TrainConfig& cfg, const TilingSpec& spec, DeviceKind device) {
  if (cfg.strata.tiling.is_object() && cfg.strata.tiling.contains("chunks")) return spec.chunks;
  return cfg.strata.exact || spec.tiled() || device != DeviceKind::Cuda ? kDefaultTileChunks : 1;
}

TilingDecision plan_tiling(const TrainConfig& cfg, const ModelConfig& model, bool checkpointing, int world_size,
                           std::uint64_t device_bytes, DeviceKind device) {
  TilingDecision d;
  d.n_layers = model.n_layers;
  d.spec = parse_tiling(cfg.strata.tiling, model);
  const std::uint64_t activation_bytes =
      Decoder(model, {checkpointing ? Checkpointing::Blocks : Checkpointing::Off})
          .activation_bytes(cfg.micro_batch_size, cfg.strata.data.seq_len, /*training=*/true);
  const TierPlan untiled = plan_tiers(cfg, decoder_param_groups(model), world_size, activation_bytes);
  const std::uint64_t fixed = untiled.device_state + untiled.device_weights + untiled.activations;
  // Tiling helps when the largest group is what does not fit; otherwise the planner says what does.
  if (cfg.strata.tiling.empty() && untiled.device_total() > device_bytes && fixed < device_bytes) {
    d.spec = parse_tiling(nlohmann::json{{"default", "auto"}}, model);
    d.automatic = true;
  }
  if (d.spec.has_auto()) {
    const std::uint64_t left = device_bytes > fixed ? device_bytes - fixed : 0;
    d.spec = resolve_auto_tiles(d.spec, model, left / 3);
  }
  d.spec.chunks = linear_chunks(cfg, d.spec, device);
  return d;
}

}  // namespace strata::models
