// GPT-2-style and LLaMA-style decoders, written against param groups (plan/param_provider.h).
//
// The decoder owns no parameter memory: for each group it asks the provider for views before use
// and hands them back after (embedding, blocks in order, head; then the blocks in reverse and the
// embedding for backward), and it adds its gradients into the provider's gradient views group by
// group, declaring each group ready when its last contribution is enqueued. A tied head (GPT-2,
// tied LLaMA) is the embedding's weight: the head acquires the embedding group too.
//
// Activation checkpointing keeps only each block's input and recomputes the block in backward
// (recompute is deterministic, so gradients are bit-identical to the plain backward).
//
// Tiling (DecoderOptions::tiling, models/tiling.h): a tiled block holds its base group for the whole
// block and acquires its tile groups one at a time, stage by stage, in forward, in recompute and in
// backward (ascending tiles each time); each tile group's gradients are declared ready as soon as
// its backward is enqueued, the base group's at the end of the block. Every block linear is computed
// in the spec's fixed row chunks whether tiled or not, so tiled and untiled runs give the same bits
// (Note [Tile-invariant linear layers] in models/tiling.h).
//
// Tensor parallelism (DecoderOptions::tensor, models/tensor_parallel.h): the groups are the rank's
// slices of the untiled groups; the blocks run on the rank's heads and MLP columns, with the
// all-reduces of Megatron's 1D scheme on the compute stream through the tensor group's
// communicator, and the head and the cross-entropy split by vocabulary; with sequence parallelism
// the residual stream and the norms run on the rank's rows (Note [Sequence parallelism] in models/tensor_parallel.h).
//
// Note [Micro-batch invariance]: every matmul is issued per sequence (batched over the sequences
// of the micro-batch) and every reduction over rows is a running sum in row order (see ops.h), so
// the gradients of 4 micro-batches of 2 sequences equal those of 1 micro-batch of 8, bit for bit,
// in fp32. The loss gradient is scaled by the caller's grad_scale (1 / tokens in the whole step).
//
// Note [Head one sequence at a time]: the logits are the largest activation of a small model with a
// large vocabulary (GPT-2 1.5B, 4 x 1024 tokens: 393 MiB of bf16 logits against 12.5 MiB for one
// block's input). The head therefore runs sequence by sequence through one sequence's logits
// buffer: logits, cross-entropy and its gradient in place, then that sequence's d(norm output)
// (and, untied, its weight gradient, summed over the sequences in order as the batched call sums
// them). A tied weight takes its head gradient in the embedding's backward (Note [Tied
// embedding gradient order] in decoder.cc), long after the head: the head runs the sequences last
// first, leaving sequence 0's gradient in the buffer, and the embedding's backward recomputes
// sequences 1.. with the same calls on the same values (the same bits), one more head forward for
// batch - 1 sequences (about 1 % of GPT-2 1.5B's step FLOPs at 4 sequences). Each matmul is one
// sequence's, as before, so the split changes no bits. The tensor-sliced head
// (models/sliced_pass.h) keeps the micro-batch's logits of its vocabulary rows.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/device/device.h"
#include "plan/param_provider.h"
#include "models/decoder_params.h"
#include "models/kernels/ops.h"
#include "models/model_config.h"
#include "models/pipeline.h"
#include "models/tensor_parallel.h"
#include "models/tiling.h"

namespace strata::models {

enum class Checkpointing { Off, Blocks };

struct DecoderOptions {
  DecoderOptions() = default;
  // Not explicit: `{Checkpointing::Blocks}` keeps working where options are brace-initialized.
  DecoderOptions(Checkpointing ck, TilingSpec t = {}) : checkpointing(ck), tiling(std::move(t)) {}  // NOLINT

  Checkpointing checkpointing = Checkpointing::Off;
  TilingSpec tiling;  // auto counts must be resolved (resolve_auto_tiles) before the decoder is built
  // Tensor parallelism (models/tensor_parallel.h): with slices > 1 the decoder holds this rank's
  // slices and computes the split sums in S slices (Note [Tensor slices] in models/tensor_parallel.h); tiling must be
  // off.
  TensorParallel tensor;
  // Pipeline parallelism (models/pipeline.h): with size > 1 the decoder holds one stage's groups and
  // runs through stage_forward / stage_backward only.
  PipelineStage pipeline;
};

// Where the decoder runs: kernels context, plus the device its activations live on (null: host
// memory with ctx.stream null, the inline reference run).
struct DecoderRuntime {
  KernelContext ctx;
  Device* device = nullptr;
};

struct LossSum {
  double sum = 0;           // sum of per-token cross-entropies (nats)
  std::int64_t tokens = 0;  // tokens counted (targets >= 0)
  double mean() const { return tokens > 0 ? sum / static_cast<double>(tokens) : 0.0; }
};

// A tied embedding across pipeline stages (GPT-2, tied LLaMA; Note [Tied embedding across stages] in
// models/pipeline.h): on the last stage the embedding weights' copy (`wte`) and where the final
// norm's output goes (`head_norm_out`, [batch * seq, d_model]); on the first stage that output
// (`head_norm_in`), from which it recomputes the head's logits and their gradient.
struct StageTied {
  const void* wte = nullptr;
  void* head_norm_out = nullptr;
  const void* head_norm_in = nullptr;
};

class Decoder {
 public:
  Decoder(ModelConfig config, DecoderOptions options);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  const ModelConfig& config() const { return config_; }
  // The groups the engine holds: with a pipeline, this stage's only.
  std::vector<ParamGroupSpec> param_groups() const;
  // The groups and where each block's tensors live (tiled blocks have several groups); with tensor
  // parallelism layout().groups are the physical groups, with a pipeline those of every stage.
  const DecoderLayout& layout() const { return layout_; }
  // param_groups()[i] is layout().groups[stage_groups()[i]] (the identity without a pipeline).
  const std::vector<std::size_t>& stage_groups() const { return stage_groups_; }

  // Pipeline stages (options.pipeline, Notes [Stage activations] and [Stage re-materialization] in
  // models/pipeline.h). The stage's input and output are [batch * seq, d_model] values of the
  // model's dtype on the device. Forward of the stage's blocks: from the tokens (first stage) or
  // `x_in`, into `y_out` (null on the last stage, whose blocks' output stays in the set for the
  // head), keeping its activations in set `set` (< activation_sets); without sets the last stage
  // does nothing here (its forward runs in its backward). Enqueued on rt.ctx.stream; `tokens` must
  // stay valid until that work has run.
  void stage_forward(const DecoderRuntime& rt, ParamProvider& provider, const std::int32_t* tokens, std::int64_t batch,
                     std::int64_t seq, const void* x_in, void* y_out, int set = 0);
  // The stage's backward, from the activations of set `set` that the micro-batch's forward kept
  // (without sets: its forward recomputed from `x_in`, the tokens on the first stage): `grad` holds
  // the gradient of the stage's output on entry (ignored on the last stage, which runs the head and
  // the loss) and the gradient of its input on exit (not on the first stage, which ends in the
  // embedding). Gradients are added to the provider's as by forward_backward. Returns the loss on
  // the last stage (after waiting for the stream), zero elsewhere (without waiting). A tied
  // embedding across stages needs `tied` (StageTied).
  LossSum stage_backward(const DecoderRuntime& rt, ParamProvider& provider, const std::int32_t* tokens,
                         const std::int32_t* targets, std::int64_t batch, std::int64_t seq, float grad_scale,
                         const void* x_in, void* grad, const StageTied& tied = {}, int set = 0);
  // Whether this is a stage of a pipeline that splits a tied embedding from its head.
  bool tied_across_stages() const;
  // Elements of this rank's slice of the tied embedding weights (the last stage's copy).
  std::size_t tied_embedding_elems() const;
  // Elements of a stage boundary (a stage's output, its input gradient): the micro-batch's rows this
  // rank holds (all of them, or 1/T under Note [Sequence parallelism] in models/tensor_parallel.h) x d_model.
  std::size_t boundary_elems(std::int64_t batch, std::int64_t seq) const;
  // The step's embedding weights to the last stage: the first stage sends them (on `send_stream`,
  // after the compute stream's acquisition), the last receives them into `copy` on the compute
  // stream; other stages do nothing (both pointers may be null there). Before the step's first
  // backward.
  void share_tied_embedding(const DecoderRuntime& rt, ParamProvider& provider, Stream* send_stream, void* copy);

  // Forward, loss and backward of one micro-batch of `batch` sequences of `seq` tokens (host int32
  // arrays [batch*seq]; a negative target is ignored). Gradients are added into the provider's
  // gradient views with d(loss)/d(per-token loss) = grad_scale. Returns after the work has run.
  LossSum forward_backward(const DecoderRuntime& rt, ParamProvider& provider, const std::int32_t* tokens,
                           const std::int32_t* targets, std::int64_t batch, std::int64_t seq, float grad_scale);

  // Forward and loss only (evaluation).
  LossSum forward_loss(const DecoderRuntime& rt, ParamProvider& provider, const std::int32_t* tokens,
                       const std::int32_t* targets, std::int64_t batch, std::int64_t seq);

  // Activation bytes this decoder allocates for a micro-batch of this shape.
  std::size_t activation_bytes(std::int64_t batch, std::int64_t seq, bool training) const;

  // Activation buffers of one micro-batch shape (defined in models/decoder_pass.h; opaque to users).
  struct Workspace;

 private:
  LossSum run(const DecoderRuntime& rt, ParamProvider& provider, const std::int32_t* tokens,
              const std::int32_t* targets, std::int64_t batch, std::int64_t seq, bool training, float grad_scale);
  void check_stage_call(const DecoderRuntime& rt, const char* what) const;
  Workspace& workspace(const DecoderRuntime& rt, std::int64_t batch, std::int64_t seq, bool training);

  ModelConfig config_;
  DecoderOptions options_;
  DecoderLayout layout_;  // layout_.groups: what param_groups() declares (tensor parallelism: physical)
  std::unique_ptr<TensorParallelLayout> tensor_layout_;  // with tensor parallelism
  std::vector<std::size_t> stage_groups_;                // this stage's groups in layout_.groups
  std::vector<std::size_t> stage_local_;                 // layout_.groups index -> stage index (kNotInStage)
  std::unique_ptr<Workspace> ws_;
};

// Gradients of one optimizer step over `micro_batches` micro-batches of `micro_batch` sequences
// each, taken in order from tokens/targets ([micro_batches * micro_batch * seq]); grad_scale is
// 1 / (targets counted in the whole step), so the result is the gradient of the step's mean loss.
// The provider's gradients must be zero (or hold what should be added to). Returns the loss sum.
LossSum accumulate_step_gradients(Decoder& decoder, const DecoderRuntime& rt, ParamProvider& provider,
                                  const std::int32_t* tokens, const std::int32_t* targets,
                                  std::int64_t micro_batches, std::int64_t micro_batch, std::int64_t seq);

}  // namespace strata::models
