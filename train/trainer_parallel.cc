// Tensor and pipeline parallelism in the trainer (see train/trainer_parallel.h): the layout checks
// and the whole tensors gathered from the tensor and pipeline groups.
#include "train/trainer_parallel.h"

#include <algorithm>
#include <array>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "core/error.h"
#include "comm/communicator.h"
#include "models/pipeline.h"
#include "train/trainer.h"

namespace strata::train {

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
  if (cfg.strata.parallel.sequence && T > 1) {  // Note [Sequence parallelism] in models/tensor_parallel.h
    const std::int64_t rows = static_cast<std::int64_t>(cfg.micro_batch_size) * cfg.strata.data.seq_len;
    if (rows % T != 0) {
      throw ConfigError(fmt::format("{}: strata.parallel.sequence splits a micro-batch's {} tokens "
                                    "(train_micro_batch_size_per_gpu {} x strata.data.seq_len {}) over "
                                    "strata.parallel.tensor = {} ranks, which does not divide them; choose sizes whose "
                                    "product is a multiple of {} or set sequence to false",
                                    cfg.source, rows, cfg.micro_batch_size, cfg.strata.data.seq_len, T, T));
    }
  }
  if (T == 1 && S == 1) return layout;
  const bool tiling_set = cfg.strata.tiling.is_object() && !cfg.strata.tiling.empty();
  if (tiling_set) {
    throw ConfigError(fmt::format("{}: strata.tiling beside tensor parallelism (strata.parallel.tensor = {}, "
                                  "tensor_slices = {}) is not built yet; drop strata.tiling or set both to 1",
                                  cfg.source, T, S));
  }
  models::check_tensor_parallel(model, T, S, models::kDefaultTileChunks, cfg.source);
  return layout;
}

ParallelGroups split_parallel_groups(Communicator& world, const ParallelLayout& layout, const RankCoords& coords) {
  ParallelGroups g;
  const int T = layout.tensor(), P = layout.pipeline();
  if (T > 1) {
    g.tensor = make_counting_communicator(world.split(coords.data * P + coords.pipeline, coords.tensor), g.tensor_counts);
  }
  if (P > 1) {
    g.pipeline = make_counting_communicator(world.split(coords.tensor + T * coords.data, coords.pipeline),
                                            g.pipeline_counts);
  }
  if (T > 1 || P > 1) g.data = world.split(coords.tensor + T * coords.pipeline, coords.data);
  return g;
}

models::TensorParallelLayout stage_tensor_layout(const models::TensorParallelLayout& layout,
                                                 std::span<const std::size_t> stage_groups) {
  models::TensorParallelLayout out = layout;
  out.whole.clear();
  out.slices.clear();
  for (std::size_t g : stage_groups) {
    out.whole.push_back(layout.whole.at(g));
    out.slices.push_back(layout.slices.at(g));
  }
  return out;
}

ZeroEngine::TensorShare tensor_share(const models::TensorParallelLayout& layout, std::size_t g, int rank) {
  using Share = ZeroEngine::TensorShare;
  if (!layout.split()) return Share::Split;  // T = 1 (its groups may be tiled: not the layout's)
  const int copies = layout.copies.at(g);
  if (layout.replicated.at(g)) return Share::Replicated;
  if (copies == 1) return Share::Split;
  return rank % copies == 0 ? Share::Split : Share::Copy;
}

std::vector<std::vector<float>> gather_tensor_slices(const models::ModelConfig& model, const models::TensorParallel& tp,
                                                     std::span<const std::size_t> groups,
                                                     const std::vector<std::vector<float>>& mine, bool keep) {
  std::vector<models::TensorParallelLayout> layouts;
  for (int r = 0; r < tp.size; ++r) layouts.push_back(models::tensor_parallel_layout(model, tp.size, r));
  std::vector<std::vector<float>> whole;
  std::size_t i = 0;
  for (std::size_t g : groups) {
    for (std::size_t k = 0; k < layouts[0].whole[g].tensors.size(); ++k, ++i) {
      const ParamTensorSpec& spec = layouts[0].whole[g].tensors[k];
      std::vector<float> values(keep ? spec.elems() : 0);
      for (int r = 0; r < tp.size; ++r) {
        std::vector<float> part = r == tp.rank ? mine[i] : std::vector<float>(layouts[static_cast<std::size_t>(r)].groups[g].tensors[k].elems());
        tp.comm->broadcast_host_bytes(part.data(), part.size() * sizeof(float), r);
        if (keep) models::place_slice(spec, layouts[static_cast<std::size_t>(r)].slices[g][k], part, values);
      }
      if (keep) whole.push_back(std::move(values));
    }
  }
  return whole;
}

}  // namespace strata::train

namespace strata::train {

std::vector<std::vector<float>> gather_pipeline_stages(Communicator& pipe, std::span<const ParamGroupSpec> all_groups,
                                                       std::span<const std::size_t> mine_groups,
                                                       const std::vector<std::vector<float>>& mine, bool keep) {
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
        if (keep) by_group[g].push_back(std::move(values));
        ++i;
      }
    }
  }
  std::vector<std::vector<float>> out;
  if (!keep) return out;
  for (std::size_t g = 0; g < by_group.size(); ++g) {
    STRATA_CHECK(by_group[g].size() == all_groups[g].tensors.size(), "group '{}' is held by no pipeline stage",
                 all_groups[g].name);
    for (auto& v : by_group[g]) out.push_back(std::move(v));
  }
  return out;
}

// The tensor group's collectives per micro-batch, counted over the run, beside the formula's.
void tensor_summary(TrainSummary& summary, const CollectiveCounts& counts, const models::TensorParallelTraffic& formula,
                    int tensor_ranks, std::int64_t micro_batches) {
  summary.tensor_ranks = tensor_ranks;
  if (tensor_ranks == 1 || micro_batches <= 0) return;
  const auto m = static_cast<double>(micro_batches);
  summary.tp_all_reduce_calls = static_cast<double>(counts.all_reduce_calls) / m;
  summary.tp_all_reduce_bytes = static_cast<double>(counts.all_reduce_bytes) / m;
  summary.tp_all_gather_calls = static_cast<double>(counts.all_gather_calls) / m;
  summary.tp_all_gather_bytes = static_cast<double>(counts.all_gather_bytes) / m;
  summary.tp_formula_all_reduce_calls = formula.all_reduce_calls;
  summary.tp_formula_all_reduce_bytes = formula.all_reduce_bytes;
  summary.tp_formula_all_gather_calls = formula.all_gather_calls;
  summary.tp_formula_all_gather_bytes = formula.all_gather_bytes;
  summary.tp_reduce_scatter_calls = static_cast<double>(counts.reduce_scatter_calls) / m;
  summary.tp_reduce_scatter_bytes = static_cast<double>(counts.reduce_scatter_bytes) / m;
  summary.tp_chain_calls = static_cast<double>(counts.send_calls + counts.recv_calls + counts.broadcast_calls) / m;
  summary.tp_chain_bytes = static_cast<double>(counts.send_bytes + counts.recv_bytes + counts.broadcast_bytes) / m;
  summary.tp_formula_reduce_scatter_calls = formula.reduce_scatter_calls;
  summary.tp_formula_reduce_scatter_bytes = formula.reduce_scatter_bytes;
  summary.tp_formula_chain_calls = formula.send_calls + formula.recv_calls + formula.broadcast_calls;
  summary.tp_formula_chain_bytes = formula.send_bytes + formula.recv_bytes + formula.broadcast_bytes;
}

// The pipeline stages' figures (collective over the pipeline group; rank 0 keeps them).
void pipeline_summary(TrainSummary& summary, const TrainConfig& cfg, const models::Decoder& decoder,
                      const models::PipelineStage& stage, const models::PipelineRunner& runner,
                      const CollectiveCounts& counts, std::int64_t micro_batches, double busy_ms, double span_ms) {
  const models::ModelConfig& model = decoder.config();
  const bool tied = decoder.tied_across_stages();
  const std::size_t tied_bytes = tied ? decoder.tied_embedding_elems() * dtype_bytes(model.dtype) : 0;
  const std::vector<std::int64_t> b =
      models::pipeline_boundaries(model, stage.size, cfg.strata.parallel.pipeline_layers, cfg.source);
  const std::vector<std::int64_t> params = models::pipeline_stage_params(model, b);
  summary.pipeline_stages = stage.size;
  summary.pipeline_schedule = std::string(models::pipeline_schedule_name(cfg.strata.parallel.schedule));
  summary.pipeline_ideal_bubble = models::pipeline_bubble_fraction(stage.size, cfg.gradient_accumulation_steps);
  const double m = static_cast<double>(std::max<std::int64_t>(1, micro_batches));
  for (int q = 0; q < stage.size; ++q) {
    std::array<double, 9> v{};
    if (q == stage.rank) {
      v = {static_cast<double>(runner.last_step().peak_in_flight), static_cast<double>(runner.stash_slots()),
           static_cast<double>(runner.buffer_bytes()), static_cast<double>(summary.peak_device_bytes),
           static_cast<double>(counts.send_bytes) / m, static_cast<double>(counts.recv_bytes) / m,
           span_ms > 0 ? 1.0 - busy_ms / span_ms : -1.0, static_cast<double>(stage.activation_sets),
           static_cast<double>(decoder.activation_bytes(cfg.micro_batch_size, cfg.strata.data.seq_len, true))};
    }
    stage.comm->broadcast_host_bytes(v.data(), sizeof v, q);
    TrainSummary::PipelineStageFigures f;
    f.first_layer = b[static_cast<std::size_t>(q)];
    f.end_layer = b[static_cast<std::size_t>(q) + 1];
    f.parameters = params[static_cast<std::size_t>(q)];
    f.peak_in_flight = static_cast<int>(v[0]);
    f.stash_slots = static_cast<int>(v[1]);
    f.buffer_bytes = static_cast<std::uint64_t>(v[2]);
    f.peak_device_bytes = static_cast<std::uint64_t>(v[3]);
    f.sent_bytes = v[4];
    f.received_bytes = v[5];
    f.measured_bubble = v[6];
    f.activation_sets = static_cast<int>(v[7]);
    f.activation_bytes = static_cast<std::uint64_t>(v[8]);
    // b x s x d_model values each way per neighbour (the rank's rows of them under sequence
    // parallelism: Decoder::boundary_elems), and with a tied embedding the final norm's output
    // (every row) to the first stage.
    const auto boundary = static_cast<double>(runner.boundary_bytes());
    const auto head = static_cast<double>(runner.head_bytes());
    const int neighbours = (q > 0 ? 1 : 0) + (q + 1 < stage.size ? 1 : 0);
    f.formula_sent_bytes = f.formula_received_bytes = boundary * neighbours;
    if (tied) {
      const double weights = static_cast<double>(tied_bytes) / cfg.gradient_accumulation_steps;
      const bool first = q == 0, last = q + 1 == stage.size;
      f.formula_sent_bytes += (first ? weights : 0) + (last ? head : 0);
      f.formula_received_bytes += (first ? head : 0) + (last ? weights : 0);
    }
    summary.stages.push_back(f);
  }
}

void rank_summary(TrainSummary& summary, Communicator& world, const RankCoords& coords) {
  if (world.world_size() <= 1) return;
  const TrainSummary& s = summary;
  TrainSummary::RankFigures mine;
  mine.rank = world.rank();
  mine.data = coords.data;
  mine.tensor = coords.tensor;
  mine.pipeline = coords.pipeline;
  mine.model_state_bytes = s.model_state_bytes;
  mine.peak_device_bytes = s.peak_device_bytes;
  if (s.tensor_ranks > 1) {
    mine.tensor_calls = s.tp_all_reduce_calls + s.tp_all_gather_calls + s.tp_reduce_scatter_calls + s.tp_chain_calls;
    mine.tensor_bytes = s.tp_all_reduce_bytes + s.tp_all_gather_bytes + s.tp_reduce_scatter_bytes + s.tp_chain_bytes;
    mine.formula_tensor_calls = static_cast<double>(s.tp_formula_all_reduce_calls + s.tp_formula_all_gather_calls +
                                                    s.tp_formula_reduce_scatter_calls + s.tp_formula_chain_calls);
    mine.formula_tensor_bytes = static_cast<double>(s.tp_formula_all_reduce_bytes + s.tp_formula_all_gather_bytes +
                                                    s.tp_formula_reduce_scatter_bytes + s.tp_formula_chain_bytes);
  }
  const auto q = static_cast<std::size_t>(coords.pipeline);
  if (q < s.stages.size()) {  // pipeline_summary gave every rank every stage's figures
    mine.sent_bytes = s.stages[q].sent_bytes;
    mine.received_bytes = s.stages[q].received_bytes;
    mine.formula_sent_bytes = s.stages[q].formula_sent_bytes;
    mine.formula_received_bytes = s.stages[q].formula_received_bytes;
  }
  static_assert(std::is_trivially_copyable_v<TrainSummary::RankFigures>);
  summary.ranks.clear();
  for (int r = 0; r < world.world_size(); ++r) {
    TrainSummary::RankFigures f = mine;
    world.broadcast_host_bytes(&f, sizeof f, r);
    summary.ranks.push_back(f);
  }
}

}  // namespace strata::train
