// Tensor and pipeline parallelism in the trainer (see tools/trainer_parallel.h): the layout checks
// and the whole tensors gathered from the tensor and pipeline groups.
#include "tools/trainer_parallel.h"

#include <fmt/format.h>

#include "core/error.h"
#include "engine/communicator.h"
#include "models/pipeline.h"
#include "tools/trainer.h"

namespace strata::tools {

ParallelLayout check_parallel_layout(const TrainConfig& cfg, const models::ModelConfig& model, int world) {
  const ParallelLayout layout(cfg.strata.parallel, world, cfg.source);
  models::check_parallel_shape(model, layout.tensor(), layout.pipeline(), cfg.source);
  const int P = layout.pipeline();
  if (P > 1) {
    models::pipeline_boundaries(model, P, cfg.strata.parallel.pipeline_layers, cfg.source);
  } else if (!cfg.strata.parallel.pipeline_layers.empty()) {
    models::pipeline_boundaries(model, 1, cfg.strata.parallel.pipeline_layers, cfg.source);
  }
  const int T = layout.tensor(), S = cfg.strata.parallel.slices();
  if (T == 1 && S == 1) return layout;
  const bool tiling_set = cfg.strata.tiling.is_object() && !cfg.strata.tiling.empty();
  if (tiling_set) {
    throw ConfigError(fmt::format("{}: strata.tiling beside tensor parallelism (strata.parallel.tensor = {}, "
                                  "tensor_slices = {}) is not built yet; drop strata.tiling or set both to 1",
                                  cfg.source, T, S));
  }
  models::check_tensor_parallel(model, T, S, models::kDefaultTileChunks, cfg.source);
  if (T == 1) return layout;
  const auto refuse = [&](const std::string& what, const std::string& fix) {
    throw ConfigError(fmt::format("{}: {} with strata.parallel.tensor = {} is not built yet; {}", cfg.source, what, T,
                                  fix));
  };
  if (cfg.gradient_clipping > 0 && cfg.strata.exact) {
    // The norm sums each tensor rank's blocks, so its rounding (and so the clipped weights' bits)
    // depends on T; exact mode promises the same bits for every T.
    refuse(fmt::format("gradient_clipping {} in exact mode (a norm whose bits do not depend on T)",
                       cfg.gradient_clipping),
           "set gradient_clipping to 0 or strata.exact to false");
  }
  return layout;
}

std::vector<std::vector<float>> gather_tensor_slices(const models::ModelConfig& model, const models::TensorParallel& tp,
                                                     std::span<const std::size_t> groups,
                                                     const std::vector<std::vector<float>>& mine) {
  std::vector<models::TensorParallelLayout> layouts;
  for (int r = 0; r < tp.size; ++r) layouts.push_back(models::tensor_parallel_layout(model, tp.size, r));
  std::vector<std::vector<float>> whole;
  std::size_t i = 0;
  for (std::size_t g : groups) {
    for (std::size_t k = 0; k < layouts[0].whole[g].tensors.size(); ++k, ++i) {
      const ParamTensorSpec& spec = layouts[0].whole[g].tensors[k];
      std::vector<float> values(spec.elems());
      for (int r = 0; r < tp.size; ++r) {
        std::vector<float> part = r == tp.rank ? mine[i] : std::vector<float>(layouts[static_cast<std::size_t>(r)].groups[g].tensors[k].elems());
        tp.comm->broadcast_host_bytes(part.data(), part.size() * sizeof(float), r);
        models::place_slice(spec, layouts[static_cast<std::size_t>(r)].slices[g][k], part, values);
      }
      whole.push_back(std::move(values));
    }
  }
  return whole;
}

}  // namespace strata::tools

namespace strata::tools {

std::vector<std::vector<float>> gather_pipeline_stages(Communicator& pipe, std::span<const ParamGroupSpec> all_groups,
                                                       std::span<const std::size_t> mine_groups,
                                                       const std::vector<std::vector<float>>& mine) {
  std::vector<std::vector<std::vector<float>>> by_group(all_groups.size());
  for (int q = 0; q < pipe.world_size(); ++q) {
    std::vector<std::uint64_t> held;
    if (q == pipe.rank()) held.assign(mine_groups.begin(), mine_groups.end());
    std::uint64_t count = held.size();
    pipe.broadcast_host_bytes(&count, sizeof count, q);
    held.resize(count);
    pipe.broadcast_host_bytes(held.data(), held.size() * sizeof(std::uint64_t), q);
    std::size_t i = 0;
    for (std::uint64_t g : held) {
      STRATA_CHECK(g < all_groups.size(), "stage {} holds group {} of {}", q, g, all_groups.size());
      for (const ParamTensorSpec& spec : all_groups[g].tensors) {
        std::vector<float> values = q == pipe.rank() ? mine[i] : std::vector<float>(spec.elems());
        STRATA_CHECK(values.size() == spec.elems(), "tensor '{}': {} values for {}", spec.name, values.size(),
                     spec.elems());
        pipe.broadcast_host_bytes(values.data(), values.size() * sizeof(float), q);
        by_group[g].push_back(std::move(values));
        ++i;
      }
    }
  }
  std::vector<std::vector<float>> out;
  for (std::size_t g = 0; g < by_group.size(); ++g) {
    STRATA_CHECK(by_group[g].size() == all_groups[g].tensors.size(), "group '{}' is held by no pipeline stage",
                 all_groups[g].name);
    for (auto& v : by_group[g]) out.push_back(std::move(v));
  }
  return out;
}

}  // namespace strata::tools
