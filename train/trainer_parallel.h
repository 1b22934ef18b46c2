// Tensor and pipeline parallelism in the trainer (train/training_run.cc): the checks of strata.parallel
// before any work (check_parallel_layout, declared in train/trainer.h for estimate too), the whole
// tensors of a tensor- or pipeline-parallel run for --save-weights, and the tensor and pipeline
// groups' figures in the run's summary.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "plan/parallel_layout.h"
#include "plan/param_provider.h"
#include "engine/zero_engine.h"
#include "models/decoder.h"
#include "models/model_config.h"
#include "models/pipeline.h"
#include "models/pipeline_runner.h"
#include "models/tensor_parallel.h"

namespace strata::train {

struct TrainSummary;

// Each whole tensor of `model` (the physical groups' order of models::tensor_parallel_layout) from
// the tensor group's slices, `mine` being this rank's (collective over the group): rank r's slice
// of every tensor is broadcast from r and put in its place.
// `groups` are the physical groups this rank holds (a pipeline stage's; every group without one),
// and the result covers those groups only. Without `keep` the rank only sends its slices (and
// receives the others' into one tensor's buffer) and returns nothing.
std::vector<std::vector<float>> gather_tensor_slices(const models::ModelConfig& model, const models::TensorParallel& tp,
                                                     std::span<const std::size_t> groups,
                                                     const std::vector<std::vector<float>>& mine, bool keep);

// A rank's tensor, pipeline and data groups (plan/parallel_layout.h: tensor groups are
// consecutive ranks, pipeline groups stride by T, data groups by T x P). The tensor and pipeline
// communicators count their collectives (null where the axis has one rank); `data` is null when it
// is the whole world.
struct ParallelGroups {
  std::unique_ptr<Communicator> tensor, pipeline, data;
  std::shared_ptr<CollectiveCounts> tensor_counts = std::make_shared<CollectiveCounts>();
  std::shared_ptr<CollectiveCounts> pipeline_counts = std::make_shared<CollectiveCounts>();
};
ParallelGroups split_parallel_groups(Communicator& world, const ParallelLayout& layout, const RankCoords& coords);

// `layout` (the whole model's, T > 1: no tiles) narrowed to a pipeline stage's physical groups
// `stage_groups`: the whole tensors and slices a reslicer reads (train/checkpoint_tensors.h).
models::TensorParallelLayout stage_tensor_layout(const models::TensorParallelLayout& layout,
                                                 std::span<const std::size_t> stage_groups);

// How physical group g of `layout` is held by tensor rank `rank` among its tensor group, for the
// gradient norm (ZeroEngine::set_tensor_group): replicated KV heads count on the first rank of
// each KV head (Note [Replicated KV heads] in models/tensor_parallel.h).
ZeroEngine::TensorShare tensor_share(const models::TensorParallelLayout& layout, std::size_t g, int rank);

// The tensor group's collectives per micro-batch over the run, counted at the communicator, beside
// Megatron's count, into `summary` (T > 1).
void tensor_summary(TrainSummary& summary, const CollectiveCounts& counts, const models::TensorParallelTraffic& formula,
                    int tensor_ranks, std::int64_t micro_batches);
// The pipeline stages' figures of the run (TrainSummary::PipelineStageFigures), gathered to rank 0
// (collective over the pipeline group): this stage's from `runner`, its communicator's `counts` over
// `micro_batches`, and its compute stream's busy and spanned milliseconds over the measured steps.
void pipeline_summary(TrainSummary& summary, const TrainConfig& cfg, const models::Decoder& decoder,
                      const models::PipelineStage& stage, const models::PipelineRunner& runner,
                      const CollectiveCounts& counts, std::int64_t micro_batches, double busy_ms, double span_ms);

// Every rank's TrainSummary::RankFigures, from what tensor_summary and pipeline_summary left in
// each rank's `summary` (call them first), gathered to every rank (collective over `world`).
void rank_summary(TrainSummary& summary, Communicator& world, const RankCoords& coords);

// Every group's tensors, in `all_groups` order, from each stage's: `mine` holds the tensors of this
// stage's groups `mine_groups` (ascending indices into `all_groups`), tensor by tensor (collective
// over the pipeline group). Only a rank with `keep` keeps them; the others send theirs and return
// nothing.
std::vector<std::vector<float>> gather_pipeline_stages(Communicator& pipe, std::span<const ParamGroupSpec> all_groups,
                                                       std::span<const std::size_t> mine_groups,
                                                       const std::vector<std::vector<float>>& mine, bool keep);

}  // namespace strata::train
