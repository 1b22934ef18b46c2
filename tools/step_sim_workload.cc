// One step's work as the step simulator sees it (tools/step_sim.h, Note [Step simulator]): the
// run plan of rank 0 over the decoder's param groups, as `strata train` makes it, and the
// decoder's sequence of acquisitions, ops and gradient hand-overs for one micro-batch with each
// op's FLOPs.
#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "models/decoder.h"
#include "models/tensor_parallel.h"
#include "models/tiling_plan.h"
#include "tools/step_sim.h"
#include "tools/trainer.h"

namespace strata::tools {
namespace {

// Elements of the group's matrices (2-D tensors): what a token's matmuls multiply by.
double matmul_elems(const ParamGroupSpec& group) {
  double n = 0;
  for (const ParamTensorSpec& t : group.tensors) {
    if (t.shape.size() == 2) n += static_cast<double>(t.elems());
  }
  return n;
}

// Emits the actions of models/decoder.cc for one micro-batch (forward_blocks, run_head,
// backward_blocks), with FLOPs per Note [Step simulator].
// With tensor parallelism (`tensor` non-null) the decoder's groups are logical and the engine's
// physical (models/tensor_parallel.h): an action on a logical group acts on each of its parts, each
// rank computes its slices' FLOPs, and the tensor group's collectives are emitted where the decoder
// issues them (models::tensor_parallel_traffic counts the same).
class ProgramBuilder {
 public:
  ProgramBuilder(const models::ModelConfig& model, const models::DecoderLayout& layout,
                 const models::TensorParallelLayout* tensor, int tensor_ranks, int slices, bool checkpointing,
                 double tokens, double seq)
      : model_(model), layout_(layout), tensor_(tensor), T_(tensor_ranks), slices_(slices),
        checkpointing_(checkpointing), tokens_(tokens), seq_(seq) {}

  std::vector<SimAction> build() {
    const std::size_t emb = layout_.embedding;
    const bool tied = model_.arch == models::Architecture::Gpt2;
    const double vocab_matmul = 2.0 * static_cast<double>(model_.vocab_size * model_.d_model) * tokens_ / T_;
    simple(emb, "embedding forward", 0, false);
    activations_all_reduce("embedding");
    for (std::size_t l = 0; l < layout_.blocks.size(); ++l) block(l, Pass::Forward);
    // The head: logits and d(final norm input); an untied head also its weight gradient; GPT-2's
    // tied weight gets that gradient in the embedding's backward.
    const std::size_t head = layout_.head;
    act(SimAction::Acquire, head);
    if (tied) act(SimAction::Acquire, emb);
    compute("head", tied ? 2 * vocab_matmul : 3 * vocab_matmul, ComputeClass::Head);
    if (T_ > 1) {  // the loss's statistics (Note [Vocabulary-parallel cross-entropy]), then d(final norm input)
      tensor_collective("tensor all_reduce row maxima", tokens_ * 4, 2);
      tensor_collective("tensor all_gather slice sums", tokens_ * (slices_ / T_) * 8, 1);
      tensor_collective("tensor all_reduce target logits", tokens_ * 4, 2);
      activations_all_reduce("head input gradient");
    }
    act(SimAction::GradsReady, head);
    if (tied) act(SimAction::Release, emb);
    act(SimAction::Release, head);
    for (std::size_t l = layout_.blocks.size(); l-- > 0;) {
      if (checkpointing_) block(l, Pass::Recompute);
      block(l, Pass::Backward);
    }
    simple(emb, "embedding backward", tied ? vocab_matmul : 0, true);
    return std::move(actions_);
  }

 private:
  enum class Pass { Forward, Recompute, Backward };

  void act(SimAction::Kind kind, std::size_t g) {
    if (tensor_ == nullptr || !tensor_->split()) {
      actions_.push_back(SimAction{kind, g, {}, 0, ComputeClass::Block});
      return;
    }
    std::vector<std::size_t> parts;  // the logical group's physical groups, ascending
    for (const models::TensorLocation& at : tensor_->where[g]) parts.push_back(at.group);
    std::sort(parts.begin(), parts.end());
    parts.erase(std::unique(parts.begin(), parts.end()), parts.end());
    for (std::size_t p : parts) actions_.push_back(SimAction{kind, p, {}, 0, ComputeClass::Block});
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
    const char* verb = pass == Pass::Forward ? "forward" : pass == Pass::Recompute ? "recompute" : "backward";
    const double factor = pass == Pass::Backward ? 2.0 : 1.0;
    act(SimAction::Acquire, base);
    compute(fmt::format("{} {}", verb, group(base).name), factor * forward_flops(base, true), ComputeClass::Block);
    // Megatron's 2 all-reduces per block and pass: the row-parallel outputs forward, the
    // column-parallel input gradients backward.
    activations_all_reduce(fmt::format("{} {} (1 of 2)", verb, group(base).name));
    activations_all_reduce(fmt::format("{} {} (2 of 2)", verb, group(base).name));
    if (pass == Pass::Backward && models::kv_replicas(model_, T_) > 1) {  // Note [Replicated KV heads]
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
  double tokens_;
  double seq_;
  std::vector<SimAction> actions_;
};

}  // namespace

StepWorkload make_step_workload(const TrainConfig& config, int world_size, std::uint64_t device_bytes) {
  bool checkpointing = false;
  const models::ModelConfig model = training_model_config(config, &checkpointing);
  // Tensor parallelism: the last tensor rank (the most vocabulary rows), sharded over the data ranks.
  const int T = config.strata.parallel.tensor, data_world = world_size / T;
  const models::TensorParallel tp{T, T - 1, config.strata.parallel.slices(), nullptr};
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
  StepWorkload w;
  w.source = config.source;
  w.plan = make_run_plan(config, groups, data_world, 0);
  w.tensor_ranks = T;
  for (const ParamGroupSpec& g : groups) w.group_names.push_back(g.name);
  w.micro_batch = ProgramBuilder(model, decoder.layout(), tensor ? &*tensor : nullptr, T, tp.slices, checkpointing,
                                 static_cast<double>(micro * seq), static_cast<double>(seq))
                      .build();
  w.micro_batches = config.gradient_accumulation_steps;
  // Note [Overlapped update]'s condition (TieredStateHome::prepare_step).
  w.overlap_update = w.plan.optimizer_offloaded() && config.strata.offload.overlap_optimizer &&
                     !(config.gradient_clipping > 0) && config.precision != Precision::Fp16;
  w.exact = config.strata.exact;
  w.prefetch_bucket_elems = config.zero.prefetch_bucket_size_elems;
  w.max_live_elems = config.zero.max_live_parameters_elems;
  w.tokens_per_step = micro * seq * config.gradient_accumulation_steps * data_world;
  w.activation_bytes = decoder.activation_bytes(micro, seq, /*training=*/true);
  w.parameters = static_cast<std::uint64_t>(models::param_count(model));
  return w;
}

}  // namespace strata::tools
