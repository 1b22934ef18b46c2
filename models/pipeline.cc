// Pipeline stages and schedules (see models/pipeline.h).
#include "models/pipeline.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"

namespace strata::models {

namespace {

std::int64_t group_params(const ParamGroupSpec& g) {
  std::int64_t n = 0;
  for (const auto& t : g.tensors) n += static_cast<std::int64_t>(t.elems());
  return n;
}

std::string list(std::span<const std::int64_t> v) {
  std::string s;
  for (std::int64_t x : v) s += fmt::format("{}{}", s.empty() ? "" : ", ", x);
  return "[" + s + "]";
}

}  // namespace

std::vector<std::int64_t> pipeline_stage_params(const ModelConfig& model, std::span<const std::int64_t> boundaries) {
  const std::vector<ParamGroupSpec> groups = decoder_param_groups(model);
  const std::int64_t block = group_params(groups[block_group_index(0)]);
  std::vector<std::int64_t> out;
  const auto P = boundaries.size() - 1;
  for (std::size_t p = 0; p < P; ++p) {
    std::int64_t n = (boundaries[p + 1] - boundaries[p]) * block;
    if (p == 0) n += group_params(groups[embedding_group_index()]);
    if (p + 1 == P) n += group_params(groups[head_group_index(model)]);
    out.push_back(n);
  }
  return out;
}

std::vector<std::int64_t> pipeline_boundaries(const ModelConfig& model, int stages, std::span<const std::int64_t> layers,
                                              const std::string& source) {
  const std::int64_t L = model.n_layers;
  if (stages < 1 || stages > L) {
    throw ConfigError(fmt::format("{}: strata.parallel.pipeline = {} stages for model '{}' of {} layers; each stage needs "
                                  "at least one layer: valid choices 1..{}",
                                  source, stages, model.name, L, L));
  }
  std::vector<std::int64_t> b{0};
  if (!layers.empty()) {
    std::int64_t sum = 0;
    for (std::int64_t n : layers) sum += n;
    if (static_cast<int>(layers.size()) != stages || sum != L ||
        std::any_of(layers.begin(), layers.end(), [](std::int64_t n) { return n < 1; })) {
      throw ConfigError(fmt::format("{}: strata.parallel.pipeline_layers = {} must give {} stages (strata.parallel."
                                    "pipeline) at least one layer each, summing to model '{}''s {} layers; or drop it "
                                    "to balance the stages by parameters",
                                    source, list(layers), stages, model.name, L));
    }
    for (std::int64_t n : layers) b.push_back(b.back() + n);
    return b;
  }
  // Contiguous split: first the smallest possible largest stage M (best[p][l]: the smallest
  // largest stage of blocks 0..l-1 over stages 0..p-1), then among the splits with every stage at
  // most M the one with the least sum of squares (even[p][l]). Ties: the earliest cut.
  const std::vector<ParamGroupSpec> groups = decoder_param_groups(model);
  const std::int64_t block = group_params(groups[block_group_index(0)]);
  const std::int64_t emb = group_params(groups[embedding_group_index()]);
  const std::int64_t head = group_params(groups[head_group_index(model)]);
  const auto P = static_cast<std::size_t>(stages);
  const auto cost = [&](std::size_t p, std::int64_t from, std::int64_t to) {
    return (to - from) * block + (p == 0 ? emb : 0) + (p + 1 == P ? head : 0);
  };
  constexpr std::int64_t kInf = std::numeric_limits<std::int64_t>::max();
  const auto n = static_cast<std::size_t>(L) + 1;
  std::vector<std::vector<std::int64_t>> best(P + 1, std::vector<std::int64_t>(n, kInf));
  best[0][0] = 0;
  for (std::size_t p = 1; p <= P; ++p) {
    for (std::int64_t l = static_cast<std::int64_t>(p); l <= L; ++l) {
      for (std::int64_t k = static_cast<std::int64_t>(p) - 1; k < l; ++k) {
        const std::int64_t prev = best[p - 1][static_cast<std::size_t>(k)];
        if (prev == kInf) continue;
        best[p][static_cast<std::size_t>(l)] = std::min(best[p][static_cast<std::size_t>(l)], std::max(prev, cost(p - 1, k, l)));
      }
    }
  }
  const std::int64_t largest = best[P][static_cast<std::size_t>(L)];
  constexpr double kNone = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> even(P + 1, std::vector<double>(n, kNone));
  std::vector<std::vector<std::int64_t>> cut(P + 1, std::vector<std::int64_t>(n, 0));
  even[0][0] = 0;
  for (std::size_t p = 1; p <= P; ++p) {
    for (std::int64_t l = static_cast<std::int64_t>(p); l <= L; ++l) {
      for (std::int64_t k = static_cast<std::int64_t>(p) - 1; k < l; ++k) {
        const double prev = even[p - 1][static_cast<std::size_t>(k)];
        const std::int64_t c = cost(p - 1, k, l);
        if (prev == kNone || c > largest) continue;
        const double v = prev + static_cast<double>(c) * static_cast<double>(c);
        if (v < even[p][static_cast<std::size_t>(l)]) {
          even[p][static_cast<std::size_t>(l)] = v;
          cut[p][static_cast<std::size_t>(l)] = k;
        }
      }
    }
  }
  b.assign(P + 1, 0);
  b[P] = L;
  for (std::size_t p = P; p > 0; --p) b[p - 1] = cut[p][static_cast<std::size_t>(b[p])];
  return b;
}

PipelineStage pipeline_stage(std::span<const std::int64_t> boundaries, int rank, Communicator* comm) {
  STRATA_CHECK(boundaries.size() >= 2 && rank >= 0 && static_cast<std::size_t>(rank) + 1 < boundaries.size(),
               "pipeline stage {} of {} boundaries", rank, boundaries.size());
  PipelineStage s;
  s.size = static_cast<int>(boundaries.size()) - 1;
  s.rank = rank;
  s.first_layer = boundaries[static_cast<std::size_t>(rank)];
  s.end_layer = boundaries[static_cast<std::size_t>(rank) + 1];
  s.comm = comm;
  return s;
}

PipelineStage training_pipeline_stage(std::span<const std::int64_t> boundaries, int rank, Communicator* comm,
                                      const ParallelConfig& parallel, int micro_batches) {
  PipelineStage s = pipeline_stage(boundaries, rank, comm);
  s.activation_sets = pipeline_activation_sets(s, parallel.schedule, micro_batches, parallel.stage_recompute);
  return s;
}

int pipeline_activation_sets(const PipelineStage& stage, PipelineSchedule schedule, int micro_batches, bool recompute) {
  if (!stage.split() || recompute) return 0;
  return pipeline_in_flight(pipeline_schedule(schedule, stage.size, stage.rank, micro_batches));
}

std::vector<PipelineOp> pipeline_schedule(PipelineSchedule schedule, int stages, int rank, int micro_batches) {
  STRATA_CHECK(stages >= 1 && rank >= 0 && rank < stages && micro_batches >= 1, "schedule of stage {} of {}, {} micro-batches",
               rank, stages, micro_batches);
  std::vector<PipelineOp> ops;
  if (schedule == PipelineSchedule::GPipe) {
    for (int a = 0; a < micro_batches; ++a) ops.push_back({true, a});
    for (int a = 0; a < micro_batches; ++a) ops.push_back({false, a});
    return ops;
  }
  const int warmup = std::min(stages - rank - 1, micro_batches);
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({true, f});
  while (f < micro_batches) {
    ops.push_back({true, f++});
    ops.push_back({false, b++});
  }
  while (b < micro_batches) ops.push_back({false, b++});
  return ops;
}

int pipeline_in_flight(std::span<const PipelineOp> ops) {
  int live = 0, peak = 0;
  for (const PipelineOp& op : ops) {
    live += op.forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

double pipeline_bubble_fraction(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

std::string_view pipeline_schedule_name(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::GPipe ? "gpipe" : "1f1b";
}

std::vector<int> pipeline_group_stages(const DecoderLayout& layout, std::span<const std::int64_t> boundaries) {
  const int P = static_cast<int>(boundaries.size()) - 1;
  std::vector<int> stage(layout.groups.size(), -1);
  stage[layout.embedding] = 0;
  stage[layout.head] = P - 1;
  int p = 0;
  for (std::size_t l = 0; l < layout.blocks.size(); ++l) {
    while (static_cast<std::int64_t>(l) >= boundaries[static_cast<std::size_t>(p) + 1]) ++p;
    // A block's groups: its base and the tile groups up to the next block's base (or the head).
    const std::size_t end = l + 1 < layout.blocks.size() ? layout.blocks[l + 1].base : layout.head;
    for (std::size_t g = layout.blocks[l].base; g < end; ++g) stage[g] = p;
  }
  for (std::size_t g = 0; g < stage.size(); ++g) {
    STRATA_CHECK(stage[g] >= 0, "group {} ('{}') belongs to no pipeline stage", g, layout.groups[g].name);
  }
  return stage;
}

StageGroupProvider::StageGroupProvider(ParamProvider& inner, std::span<const ParamGroupSpec> all_groups,
                                       std::vector<std::size_t> local)
    : inner_(inner), all_(all_groups), local_(std::move(local)) {
  STRATA_CHECK(local_.size() == all_.size(), "{} stage indices for {} groups", local_.size(), all_.size());
}

std::size_t StageGroupProvider::map(std::size_t group) const {
  STRATA_CHECK(group < local_.size() && local_[group] != kNotInStage, "group {} is not in this pipeline stage", group);
  return local_[group];
}

GroupViews StageGroupProvider::acquire_params(std::size_t group, ParamPhase phase, Stream* stream) {
  return inner_.acquire_params(map(group), phase, stream);
}
void StageGroupProvider::release_params(std::size_t group, Stream* stream) { inner_.release_params(map(group), stream); }
GroupViews StageGroupProvider::acquire_grads(std::size_t group, Stream* stream) {
  return inner_.acquire_grads(map(group), stream);
}
void StageGroupProvider::grads_ready(std::size_t group, Stream* stream) { inner_.grads_ready(map(group), stream); }

}  // namespace strata::models
