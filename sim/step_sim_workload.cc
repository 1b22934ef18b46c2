// One step's work as the step simulator sees it (sim/step_sim.h, Note [Step simulator] in sim/step_sim.h): the
// run plan of rank 0 over the decoder's param groups, as `strata train` makes it, and the
// decoder's sequence of acquisitions, ops and gradient hand-overs for one micro-batch with each
// op's FLOPs; with pipeline stages, each stage's (its forward's and its backward's, as
// models/decoder_stage.cc runs them).
#include <algorithm>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "models/decoder.h"
#include "models/pipeline.h"
#include "models/tensor_parallel.h"
#include "models/tiling_plan.h"
#include "sim/step_sim.h"
#include "train/trainer.h"

namespace strata::sim {
namespace {

// Elements of the group's matrices (2-D tensors): what a token's matmuls multiply by.
double matmul_elems(const ParamGroupSpec& group) {
  double n = 0;
  for (const ParamTensorSpec& t : group.tensors) {
    if (t.shape.size() == 2) n += static_cast<double>(t.elems());
  }
  return n;
}

// The part of the model a ProgramBuilder emits: every block (P = 1), or a pipeline stage's blocks
// [l0, l1), with the embedding on the first stage and the head on the last.
struct StageSpan {
  std::int64_t l0 = 0, l1 = 0;
  bool split = false;          // P > 1
  bool first = true, last = true;
  bool rematerialize = false;  // see Note [Stage re-materialization] in models/pipeline.h: the stage's forward again in its backward
  // The decoder's group index -> the stage engine's (models::kNotInStage: another stage's); empty:
  // the identity.
  std::vector<std::size_t> local;
};

// Emits the actions of models/decoder.cc for one micro-batch (forward_blocks, run_head,
// backward_blocks), with FLOPs per Note [Step simulator] in sim/step_sim.h; for a pipeline stage, those of its
// stage_forward and stage_backward (models/decoder_stage.cc).
// With tensor parallelism (`tensor` non-null) the decoder's groups are logical and the engine's
// physical (models/tensor_parallel.h): an action on a logical group acts on each of its parts, each
// rank computes its slices' FLOPs, and the tensor group's collectives are emitted where the decoder
// issues them (models::tensor_parallel_traffic counts the same).
class ProgramBuilder {
 public:
  ProgramBuilder(const models::ModelConfig& model, const models::DecoderLayout& layout,
                 const models::TensorParallelLayout* tensor, int tensor_ranks, int slices, bool checkpointing,
                 double tokens, double seq, StageSpan span, bool sequence)
      : model_(model), layout_(layout), tensor_(tensor), T_(tensor_ranks), slices_(slices),
        checkpointing_(checkpointing), sequence_(sequence), tokens_(tokens), seq_(seq), span_(std::move(span)) {}

  // The whole model's micro-batch.
  std::vector<SimAction> build() {
    forward_blocks(Pass::Forward);
    head();
    backward_blocks();
    return std::move(actions_);
  }

  // A pipeline stage's micro-batch: its stage_forward's actions (none on the last stage when
  // re-materialized: its forward runs in its backward), then its stage_backward's; returns the
  // number of the forward's.
  std::size_t build_stage(std::vector<SimAction>* out) {
    if (!(span_.last && span_.rematerialize)) forward_blocks(Pass::Forward);
    const std::size_t forward = actions_.size();
    if (span_.rematerialize) forward_blocks(Pass::Rematerialize);
    if (span_.last) head();
    backward_blocks();
    *out = std::move(actions_);
    return forward;
  }

 private:
  enum class Pass { Forward, Rematerialize, Recompute, Backward };

  bool tied() const { return model_.tied_embeddings; }
  double vocab_matmul() const {
    return 2.0 * static_cast<double>(model_.vocab_size * model_.d_model) * tokens_ / T_;
  }

  // ModelPass::forward_blocks: the embedding on the first stage, then the span's blocks.
  void forward_blocks(Pass pass) {
    if (span_.first) {
      simple(layout_.embedding, pass == Pass::Forward ? "embedding forward" : "rematerialize embedding", 0, false);
      activations_all_reduce("embedding");
    }
    for (auto l = static_cast<std::size_t>(span_.l0); l < static_cast<std::size_t>(span_.l1); ++l) block(l, pass);
  }

  // ModelPass::run_head: logits and d(final norm input); an untied head also its weight gradient;
  // GPT-2's tied weight gets that gradient in the embedding's backward. Across stages the last
  // stage computes with the first stage's copy of the tied weight, not the embedding group.
  void head() {
    const std::size_t emb = layout_.embedding, head = layout_.head;
    const bool acquire_emb = tied() && !span_.split;
    act(SimAction::Acquire, head);
    if (acquire_emb) act(SimAction::Acquire, emb);
    compute("head", tied() ? 2 * vocab_matmul() : 3 * vocab_matmul(), ComputeClass::Head);
    if (T_ > 1) {
      loss_statistics();
      activations_all_reduce("head input gradient");
    }
    act(SimAction::GradsReady, head);
    if (acquire_emb) act(SimAction::Release, emb);
    act(SimAction::Release, head);
  }

  // The vocabulary-parallel loss's statistics (Note [Vocabulary-parallel cross-entropy] in models/tensor_parallel.h).
  void loss_statistics() {
    tensor_collective("tensor all_reduce row maxima", tokens_ * 4, 2);
    tensor_collective("tensor all_gather slice sums", tokens_ * (slices_ / T_) * 8, 1);
    tensor_collective("tensor all_reduce target logits", tokens_ * 4, 2);
  }

  // ModelPass::backward_blocks: the span's blocks last to first, then on the first stage the
  // embedding's backward (GPT-2: the tied weight's head gradient; across stages after recomputing
  // the logits from the last stage's final-norm output, Note [Tied embedding across stages] in models/pipeline.h;
  // without stages after recomputing sequences 1.., Note [Head one sequence at a time] in models/decoder.h).
  void backward_blocks() {
    for (auto l = static_cast<std::size_t>(span_.l1); l-- > static_cast<std::size_t>(span_.l0);) {
      if (checkpointing_) block(l, Pass::Recompute);
      block(l, Pass::Backward);
    }
    if (!span_.first) return;
    const std::size_t emb = layout_.embedding;
    act(SimAction::Acquire, emb);
    if (tied() && span_.split) {
      compute("head logits for the tied gradient", vocab_matmul(), ComputeClass::Head);
      if (T_ > 1) loss_statistics();
    } else if (tied() && slices_ == 1 && tokens_ > seq_) {
      // See Note [Head one sequence at a time] in models/decoder.h.
      // Sequences 1.. recomputed.
      compute("head logits for the tied gradient", vocab_matmul() * (tokens_ - seq_) / tokens_, ComputeClass::Head);
    }
    compute("embedding backward", tied() ? vocab_matmul() : 0, ComputeClass::Head);
    act(SimAction::GradsReady, emb);
    act(SimAction::Release, emb);
  }

  // The engine's index of the decoder's group g.
  std::size_t engine_group(std::size_t g) const {
    if (span_.local.empty()) return g;
    STRATA_CHECK(g < span_.local.size() && span_.local[g] != models::kNotInStage,
                 "group {} is not in pipeline stage [{}, {})", g, span_.l0, span_.l1);
    return span_.local[g];
  }
  void act(SimAction::Kind kind, std::size_t g) {
    if (tensor_ == nullptr || !tensor_->split()) {
      actions_.push_back(SimAction{kind, engine_group(g), {}, 0, ComputeClass::Block});
      return;
    }
    std::vector<std::size_t> parts;  // the logical group's physical groups, ascending
    for (const models::TensorLocation& at : tensor_->where[g]) parts.push_back(at.group);
    std::sort(parts.begin(), parts.end());
    parts.erase(std::unique(parts.begin(), parts.end()), parts.end());
    for (std::size_t p : parts) actions_.push_back(SimAction{kind, engine_group(p), {}, 0, ComputeClass::Block});
  }
  const ParamGroupSpec& group(std::size_t g) const { return tensor_ != nullptr ? tensor_->logical[g] : layout_.groups[g]; }
  void tensor_collective(std::string name, double bytes, double passes) {
    SimAction a{SimAction::TensorCollective, 0, std::move(name), 0, ComputeClass::Block};
    a.bytes = bytes;
    a.passes = passes;
    actions_.push_back(std::move(a));
  }
  // An all-reduce of the rows x d_model activations (or their gradient) over the tensor group.
  void activations_all_reduce(const std::string& what) {
    if (T_ == 1) return;
    tensor_collective("tensor all_reduce " + what,
                      tokens_ * static_cast<double>(model_.d_model) * static_cast<double>(dtype_bytes(model_.dtype)), 2);
  }
  void compute(std::string name, double flops, ComputeClass cls) {
    actions_.push_back(SimAction{SimAction::Compute, 0, std::move(name), flops, cls});
  }
  void simple(std::size_t g, std::string name, double flops, bool ready) {
    act(SimAction::Acquire, g);
    compute(std::move(name), flops, ComputeClass::Head);
    if (ready) act(SimAction::GradsReady, g);
    act(SimAction::Release, g);
  }

  // Group g's share of its block's forward FLOPs: its matrices, and for the base group the
  // attention products (4 x seq x d_attn per token).
  double forward_flops(std::size_t g, bool base) const {
    double flops = 2.0 * matmul_elems(group(g)) * tokens_;
    if (base) flops += 4.0 * seq_ * static_cast<double>(model_.n_heads / T_ * model_.head_dim()) * tokens_;
    return flops;
  }

  // A block's pass: the base group held throughout, its tile groups (laid out right after it) one
  // at a time; backward hands each group's gradients over as soon as its part has run.
  void block(std::size_t l, Pass pass) {
    const std::size_t base = layout_.blocks[l].base;
    const std::size_t end = l + 1 < layout_.blocks.size() ? layout_.blocks[l + 1].base : layout_.head;
    const char* verb = pass == Pass::Forward         ? "forward"
                       : pass == Pass::Rematerialize ? "rematerialize"
                       : pass == Pass::Recompute     ? "recompute"
                                                     : "backward";
    const double factor = pass == Pass::Backward ? 2.0 : 1.0;
    act(SimAction::Acquire, base);
    compute(fmt::format("{} {}", verb, group(base).name), factor * forward_flops(base, true), ComputeClass::Block);
    // Megatron's 2 all-reduces per block and pass: the row-parallel outputs forward, the
    // column-parallel input gradients backward.
    activations_all_reduce(fmt::format("{} {} (1 of 2)", verb, group(base).name));
    activations_all_reduce(fmt::format("{} {} (2 of 2)", verb, group(base).name));
    if (pass == Pass::Backward && sequence_ && T_ > 1) {  // Note [Sequence parallelism] in models/tensor_parallel.h: the norms' outputs again
      for (int i = 1; i <= 2; ++i) {
        tensor_collective(fmt::format("tensor all_gather {} norm output ({} of 2)", group(base).name, i),
                          tokens_ * static_cast<double>(model_.d_model) * static_cast<double>(dtype_bytes(model_.dtype)),
                          1);
      }
    }
    if (pass == Pass::Backward && models::kv_replicas(model_, T_) > 1) {  // Note [Replicated KV heads] in models/tensor_parallel.h
      tensor_collective(fmt::format("tensor all_gather {} KV head gradients", group(base).name),
                        tokens_ * 2.0 * static_cast<double>(model_.head_dim() * dtype_bytes(model_.dtype)), 1);
    }
    for (std::size_t t = base + 1; t < end; ++t) {
      act(SimAction::Acquire, t);
      compute(fmt::format("{} {}", verb, group(t).name), factor * forward_flops(t, false), ComputeClass::Block);
      if (pass == Pass::Backward) act(SimAction::GradsReady, t);
      act(SimAction::Release, t);
    }
    if (pass == Pass::Backward) act(SimAction::GradsReady, base);
    act(SimAction::Release, base);
  }

  const models::ModelConfig& model_;
  const models::DecoderLayout& layout_;
  const models::TensorParallelLayout* tensor_;
  int T_;
  int slices_;
  bool checkpointing_;
  bool sequence_;  // Note [Sequence parallelism] in models/tensor_parallel.h
  double tokens_;
  double seq_;
  StageSpan span_;
  std::vector<SimAction> actions_;
};

// The workload's fields that come from the config and the rank's groups alone.
StepWorkload plan_workload(const TrainConfig& config, const std::vector<ParamGroupSpec>& groups, int data_world,
                           int tensor_ranks, const models::ModelConfig& model) {
  const std::int64_t micro = config.micro_batch_size, seq = config.strata.data.seq_len;
  StepWorkload w;
  w.source = config.source;
  w.plan = make_run_plan(config, groups, data_world, 0);
  w.tensor_ranks = tensor_ranks;
  for (const ParamGroupSpec& g : groups) w.group_names.push_back(g.name);
  w.micro_batches = config.gradient_accumulation_steps;
  // Note [Overlapped update] in engine/state_home_tiered.cc's condition (TieredStateHome::prepare_step).
  w.overlap_update = w.plan.optimizer_offloaded() && config.strata.offload.overlap_optimizer &&
                     !(config.gradient_clipping > 0) && config.precision != Precision::Fp16;
  w.exact = config.strata.exact;
  w.prefetch_bucket_elems = config.zero.prefetch_bucket_size_elems;
  w.max_live_elems = config.zero.max_live_parameters_elems;
  w.tokens_per_step = micro * seq * config.gradient_accumulation_steps * data_world;
  w.parameters = static_cast<std::uint64_t>(models::param_count(model));
  return w;
}

}  // namespace

StepWorkload make_step_workload(const TrainConfig& config, int world_size, std::uint64_t device_bytes) {
  STRATA_CHECK(config.strata.parallel.pipeline == 1,
               "make_step_workload of {} pipeline stages: make_stage_workloads plans each stage",
               config.strata.parallel.pipeline);
  bool checkpointing = false;
  const models::ModelConfig model = train::training_model_config(config, &checkpointing);
  // Tensor parallelism: the last tensor rank (the most vocabulary rows), sharded over the data ranks.
  const int T = config.strata.parallel.tensor, data_world = world_size / T;
  const models::TensorParallel tp{T, T - 1, config.strata.parallel.slices(), nullptr, config.strata.parallel.sequence,
                                  config.strata.exact};
  models::TilingDecision tiling;
  if (!tp.sliced()) tiling = models::plan_tiling(config, model, checkpointing, world_size, device_bytes);
  const models::Checkpointing ck = checkpointing ? models::Checkpointing::Blocks : models::Checkpointing::Off;
  models::DecoderOptions options(ck, tiling.spec);
  options.tensor = tp;
  const models::Decoder decoder(model, options);
  const std::vector<ParamGroupSpec> groups = decoder.param_groups();
  const std::optional<models::TensorParallelLayout> tensor =
      T > 1 ? std::optional(models::tensor_parallel_layout(model, T, T - 1)) : std::nullopt;
  const std::int64_t micro = config.micro_batch_size, seq = config.strata.data.seq_len;
  StepWorkload w = plan_workload(config, groups, data_world, T, model);
  StageSpan whole;
  whole.l1 = static_cast<std::int64_t>(decoder.layout().blocks.size());
  w.micro_batch = ProgramBuilder(model, decoder.layout(), tensor ? &*tensor : nullptr, T, tp.slices, checkpointing,
                                 static_cast<double>(micro * seq), static_cast<double>(seq), std::move(whole),
                                 tp.split_rows())
                      .build();
  w.activation_bytes = decoder.activation_bytes(micro, seq, /*training=*/true);
  return w;
}

std::vector<StepWorkload> make_stage_workloads(const TrainConfig& config, int world_size, std::uint64_t device_bytes) {
  const ParallelConfig& par = config.strata.parallel;
  if (par.pipeline == 1) return {make_step_workload(config, world_size, device_bytes)};
  bool checkpointing = false;
  const models::ModelConfig model = train::training_model_config(config, &checkpointing);
  // As the trainer splits the world (plan/parallel_layout.h) and its stages (models/pipeline.h).
  const int T = par.tensor, P = par.pipeline;
  STRATA_CHECK(world_size % (T * P) == 0, "a world of {} ranks for tensor {} x pipeline {}", world_size, T, P);
  const int data_world = world_size / (T * P);
  const std::vector<std::int64_t> bounds = models::pipeline_boundaries(model, P, par.pipeline_layers, config.source);
  const models::TensorParallel tp{T, T - 1, par.slices(), nullptr, par.sequence, config.strata.exact};
  models::TilingDecision tiling;
  if (!tp.sliced()) tiling = models::plan_tiling(config, model, checkpointing, world_size, device_bytes);
  const models::Checkpointing ck = checkpointing ? models::Checkpointing::Blocks : models::Checkpointing::Off;
  const std::optional<models::TensorParallelLayout> tensor =
      T > 1 ? std::optional(models::tensor_parallel_layout(model, T, T - 1)) : std::nullopt;
  const std::int64_t micro = config.micro_batch_size, seq = config.strata.data.seq_len;
  const int m = config.gradient_accumulation_steps;
  std::vector<StepWorkload> out;
  for (int p = 0; p < P; ++p) {
    models::DecoderOptions options(ck, tiling.spec);
    options.tensor = tp;
    options.pipeline = models::training_pipeline_stage(bounds, p, nullptr, par, m);
    const models::Decoder decoder(model, options);
    const models::PipelineStage& ps = options.pipeline;
    const std::vector<ParamGroupSpec> groups = decoder.param_groups();
    StepWorkload w = plan_workload(config, groups, data_world, T, model);
    StageSpan span{ps.first_layer, ps.end_layer, true, ps.first(), ps.last(), par.stage_recompute, {}};
    span.local.assign(decoder.layout().groups.size(), models::kNotInStage);
    for (std::size_t i = 0; i < decoder.stage_groups().size(); ++i) span.local[decoder.stage_groups()[i]] = i;
    const std::size_t embedding = ps.first() ? span.local[decoder.layout().embedding] : 0;
    StageWork& S = w.stage;
    S.forward_actions = ProgramBuilder(model, decoder.layout(), tensor ? &*tensor : nullptr, T, tp.slices,
                                       checkpointing, static_cast<double>(micro * seq), static_cast<double>(seq),
                                       std::move(span), tp.split_rows())
                            .build_stage(&w.micro_batch);
    S.stages = P;
    S.rank = p;
    S.first_layer = ps.first_layer;
    S.end_layer = ps.end_layer;
    S.schedule = par.schedule;
    S.ops = models::pipeline_schedule(par.schedule, P, p, m);
    S.activation_sets = ps.activation_sets;
    S.boundary_bytes = static_cast<double>(decoder.boundary_elems(micro, seq)) * static_cast<double>(dtype_bytes(model.dtype));
    S.head_bytes = static_cast<double>(micro * seq * model.d_model) * static_cast<double>(dtype_bytes(model.dtype));
    if (decoder.tied_across_stages()) {
      S.tied_bytes = static_cast<double>(decoder.tied_embedding_elems()) * static_cast<double>(dtype_bytes(model.dtype));
      if (ps.first()) {
        S.share_tied = {SimAction{SimAction::Acquire, embedding, {}, 0, ComputeClass::Head},
                        SimAction{SimAction::Release, embedding, {}, 0, ComputeClass::Head}};
      }
    }
    for (const ParamGroupSpec& g : groups) {
      for (const ParamTensorSpec& t : g.tensors) S.parameters += t.elems();
    }
    w.activation_bytes = decoder.activation_bytes(micro, seq, /*training=*/true);
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace strata::sim
