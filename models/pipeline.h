// Pipeline parallelism of the decoders (strata.parallel.pipeline = P; issue 17).
//
// The P ranks of a pipeline group (plan/parallel_layout.h) each hold a contiguous range of the
// blocks: the first stage also the embedding, the last the final norm and the head. A step's A
// micro-batches flow through the stages: each stage's output, the residual stream of batch x seq x
// d_model values, goes point to point to the next stage, and its gradient comes back the same way
// (comm/communicator.h exchange: each stage's sends go with its next receives, Note [Grouped
// transfers] in models/pipeline_runner.h, since a communicator runs its calls in issue order, Note
// [Issue order]). The order of a stage's work is its
// schedule (pipeline_schedule): GPipe runs every micro-batch's forward, then every backward; 1F1B
// (PipeDream-Flush, Megatron's default) runs P - p - 1 forwards, then alternates one forward with one
// backward, then drains the backwards, so stage p holds at most P - p micro-batches in flight
// instead of A. Both run the backwards in ascending micro-batch order, so each stage's engine sees
// the same micro-batches in the same order as a run without stages.
//
// Note [Stage activations]: a stage keeps, for each micro-batch in flight, what the model keeps
// without stages: every block's activations, or with strata.model.checkpoint_activations each
// block's input (the backward then recomputes one block at a time, as usual). The decoder holds
// one such set per micro-batch in flight (PipelineStage::activation_sets: A under GPipe, at most
// P - p under 1F1B); a stage's forward fills the micro-batch's set and its backward reads it, so
// every forward runs once. The last stage's forward runs its blocks (its set also keeps their
// output), its backward the head, the loss and their backward, then the blocks'. The input of each
// micro-batch in flight is the runner's stash (the first stage's is the tokens).
//
// Note [Stage re-materialization]: with strata.parallel.stage_recompute a stage keeps only its input
// of each micro-batch in flight, and the backward of a micro-batch recomputes the stage's forward
// from it, as GPipe does: one more forward per micro-batch on every stage but the last, for
// activation memory of one micro-batch. Recompute is deterministic, so both ways give the bits of
// the plain backward. The last stage then computes its forward only within its backward (nothing
// needs it earlier).
//
// Exact mode: each stage's engine reduces its groups' gradients over the data axis exactly as
// without stages (Note [Exact gradient sums] in engine/zero_engine.h), and a stage's gradients are computed by the same
// kernels on the same values, so every P and both schedules give the single-rank run's bits. The
// gradient norm (clipping, fp16's skips) sums the stages' per-block partials in model order, as a
// run without stages does (ZeroEngine::set_pipeline_group).
//
// ZeRO stages 0-3 and offload run on the data axis of every stage (each stage's engine holds its
// groups only).
//
// Note [Tied embedding across stages]: a tied head (GPT-2, tied LLaMA) is the embedding's weight,
// and the single-rank run adds that weight's two gradient contributions sequence by sequence, head then lookup (Note
// [Tied embedding gradient order] in models/decoder.cc). Megatron keeps a copy on the last stage and
// all-reduces the two copies' gradients once per step, which adds them in another order. Here the
// first stage owns the weight (its engine holds the embedding group; the norm counts it once) and
// sends it to the last stage at the start of each step (vocabulary x d_model values, the volume of
// Megatron's all-reduce), which computes the logits and the loss with it. The last stage sends its
// final norm's output of each micro-batch (a boundary's batch x seq x d_model values) back to the
// first stage, whose backward recomputes the logits and their gradient from it (the same kernels
// on the same values: the same bits) and adds the head's and the lookup's contributions in the
// single-rank order. The price is one more head forward per micro-batch on the first stage.
//
// Checkpoints hold every stage's groups where an unpipelined run keeps them (checkpoint/checkpoint.h),
// so they resume across a change of stages.
//
// `strata estimate` plans every stage (sim/estimate_plan.cc) and `strata simulate` replays the
// stages' schedule (sim/step_sim_stages.cc, Note [Pipelined step simulation] in sim/step_sim_stages.cc). Not built yet:
// interleaved (virtual) stages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "config/config.h"
#include "plan/param_provider.h"
#include "models/decoder_params.h"
#include "models/model_config.h"

namespace strata {
class Communicator;
}

namespace strata::models {

struct PipelineStage {
  int size = 1;  // P
  int rank = 0;  // this stage's place in its pipeline group
  std::int64_t first_layer = 0;
  std::int64_t end_layer = -1;   // one past the stage's last block; -1: every block (P = 1)
  Communicator* comm = nullptr;  // the pipeline group; null when P = 1
  // See Note [Stage activations] in models/pipeline.h.
  // Sets of block activations the decoder keeps, one per micro-batch in
  // flight (pipeline_activation_sets); 0: Note [Stage re-materialization].
  int activation_sets = 0;

  bool split() const { return size > 1; }
  bool first() const { return rank == 0; }
  bool last() const { return rank == size - 1; }
};

// The stages' block boundaries (P + 1 values, 0 first and the model's layers last): `layers` when
// given (strata.parallel.pipeline_layers: P counts, each >= 1, summing to the layers), else the
// contiguous split whose largest stage, by parameters (embedding on the first, head on the last),
// is smallest, and among those the most even (least sum of squares of the stages). ConfigError
// naming `source`, the key and the valid choices otherwise.
std::vector<std::int64_t> pipeline_boundaries(const ModelConfig& model, int stages, std::span<const std::int64_t> layers,
                                              const std::string& source);
// Parameters of each stage under `boundaries` (what the balance minimizes; reported by train).
std::vector<std::int64_t> pipeline_stage_params(const ModelConfig& model, std::span<const std::int64_t> boundaries);
// Stage `rank` of `boundaries`.
PipelineStage pipeline_stage(std::span<const std::int64_t> boundaries, int rank, Communicator* comm);
// See Note [Stage activations] in models/pipeline.h.
// The activation sets `stage` keeps under `schedule` with `micro_batches`
// per step: its micro-batches in flight, or 0 with `recompute` (strata.parallel.stage_recompute)
// and without stages.
int pipeline_activation_sets(const PipelineStage& stage, PipelineSchedule schedule, int micro_batches, bool recompute);
// Stage `rank` of `boundaries` as training runs it under `parallel` with `micro_batches` per step
// (its activation sets: what train and estimate plan alike).
PipelineStage training_pipeline_stage(std::span<const std::int64_t> boundaries, int rank, Communicator* comm,
                                      const ParallelConfig& parallel, int micro_batches);

// One unit of a stage's work: the forward or the backward of micro-batch `micro`.
struct PipelineOp {
  bool forward = true;
  int micro = 0;
  bool operator==(const PipelineOp&) const = default;
};
// Stage `rank`'s order of work for `micro_batches` micro-batches over `stages` stages.
std::vector<PipelineOp> pipeline_schedule(PipelineSchedule schedule, int stages, int rank, int micro_batches);
// The most micro-batches whose forward has run and backward has not, along `ops`: the stash slots
// the stage needs (Note [Stage re-materialization]).
int pipeline_in_flight(std::span<const PipelineOp> ops);
// The ideal bubble fraction of both schedules with equal stages: (P - 1) / (A + P - 1).
double pipeline_bubble_fraction(int stages, int micro_batches);
std::string_view pipeline_schedule_name(PipelineSchedule schedule);

// The stage each of a decoder layout's groups belongs to: the embedding to the first, block l's
// base and tile groups to the stage holding l, the head to the last.
std::vector<int> pipeline_group_stages(const DecoderLayout& layout, std::span<const std::int64_t> boundaries);

// The decoder's view of an engine holding one stage's groups: `local[g]` is the engine's index of
// the decoder's group g (kNotInStage for another stage's, which is an error to touch).
inline constexpr std::size_t kNotInStage = static_cast<std::size_t>(-1);
class StageGroupProvider final : public ParamProvider {
 public:
  StageGroupProvider(ParamProvider& inner, std::span<const ParamGroupSpec> all_groups, std::vector<std::size_t> local);
  std::span<const ParamGroupSpec> groups() const override { return all_; }
  GroupViews acquire_params(std::size_t group, ParamPhase phase, Stream* stream) override;
  void release_params(std::size_t group, Stream* stream) override;
  GroupViews acquire_grads(std::size_t group, Stream* stream) override;
  void grads_ready(std::size_t group, Stream* stream) override;

 private:
  std::size_t map(std::size_t group) const;
  ParamProvider& inner_;
  std::span<const ParamGroupSpec> all_;
  std::vector<std::size_t> local_;
};

}  // namespace strata::models
