// The decoders' forward and backward over param groups (see models/decoder.h): the workspace, the
// passes' phases and the whole-model run; the pipeline stages' entry points are in
// models/decoder_stage.cc, the passes themselves in models/decoder_pass.h.
#include "models/decoder.h"

#include <cstring>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/host_buffer.h"
#include "comm/communicator.h"
#include "models/decoder_params.h"
#include "models/decoder_pass.h"
#include "models/sliced_pass.h"

namespace strata::models {

using namespace decoder_detail;

namespace {

// Lays out (or only measures, with base == nullptr) the workspace buffers.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  void* take(std::size_t bytes) {
    void* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += (bytes + 255) / 256 * 256;
    return p;
  }
  std::size_t used() const { return used_; }

 private:
  char* base_;
  std::size_t used_ = 0;
};

}  // namespace

namespace {

// The sizes carve_workspace cuts the workspace by (elements unless named bytes).
struct CarveSizes {
  std::size_t e = 0;     // bytes per element of the working dtype
  std::size_t n = 0;     // rows of the micro-batch
  std::size_t mine = 0;  // rows this rank holds of the residual stream
  std::size_t T = 1, C = 0, H = 0, hd = 0, qkv_w = 0, att_w = 0, F = 0, ff_in_w = 0, V = 0;
  std::int64_t l0 = 0, l1 = 0;  // the stage's blocks
  bool head = false;            // the stage holds the head's buffers
};

CarveSizes carve_sizes(const ModelConfig& c, const TensorParallel& tp, const PipelineStage& ps,
                       const Decoder::Workspace& ws) {
  CarveSizes z;
  z.e = dtype_bytes(c.dtype);
  z.n = static_cast<std::size_t>(ws.batch * ws.seq);
  z.T = static_cast<std::size_t>(tp.size);
  // See Note [Sequence parallelism] in models/tensor_parallel.h: the residual stream, its gradient and the norms' inputs, outputs
  // and statistics hold this rank's rows only.
  z.mine = tp.split_rows() ? z.n / z.T : z.n;
  // A tensor rank's activations are those of its heads, MLP columns and vocabulary rows.
  z.C = static_cast<std::size_t>(c.d_model);
  z.H = static_cast<std::size_t>(c.n_heads) / z.T;
  z.hd = static_cast<std::size_t>(c.head_dim());
  const std::size_t kv_heads = std::max<std::size_t>(1, static_cast<std::size_t>(c.n_kv_heads) / z.T);
  z.qkv_w = (z.H + 2 * kv_heads) * z.hd;
  z.att_w = z.H * z.hd;
  z.F = static_cast<std::size_t>(c.ffn_hidden) / z.T;
  z.ff_in_w = c.arch == Architecture::Gpt2 ? z.F : 2 * z.F;
  z.V = static_cast<std::size_t>(vocab_rows(c, tp.size, tp.rank).rows());
  // A pipeline stage's blocks only; a later stage's input is the caller's buffer (set per call).
  z.l0 = ps.first_layer;
  z.l1 = ps.end_layer < 0 ? c.n_layers : ps.end_layer;
  // The head's buffers: on the last stage, and on the first when the embedding is tied across
  // stages (Note [Tied embedding across stages] in models/pipeline.h).
  z.head = ps.last() || (ps.split() && ps.first() && c.tied_embeddings);
  return z;
}

std::vector<Decoder::Workspace::BlockActs> carve_acts(Carver& cv, const CarveSizes& z, std::int64_t count) {
  std::vector<Decoder::Workspace::BlockActs> acts;
  for (std::int64_t l = 0; l < count; ++l) {
    Decoder::Workspace::BlockActs a{};
    a.norm1 = cv.take(z.mine * z.C * z.e);  // gathered into tmp for its readers (Note [Sequence parallelism] in models/tensor_parallel.h)
    a.qkv = cv.take(z.n * z.qkv_w * z.e);
    a.att = cv.take(z.n * z.att_w * z.e);
    a.x_mid = cv.take(z.mine * z.C * z.e);
    a.norm2 = cv.take(z.mine * z.C * z.e);
    a.ff_in = cv.take(z.n * z.ff_in_w * z.e);
    a.ff_act = cv.take(z.n * z.F * z.e);
    a.mean1 = static_cast<float*>(cv.take(z.mine * 4));
    a.rstd1 = static_cast<float*>(cv.take(z.mine * 4));
    a.mean2 = static_cast<float*>(cv.take(z.mine * 4));
    a.rstd2 = static_cast<float*>(cv.take(z.mine * 4));
    a.lse = static_cast<float*>(cv.take(z.n * z.H * 4));
    acts.push_back(a);
  }
  return acts;
}

// See Note [Stage activations] in models/pipeline.h: set 0 is the workspace's own; each other set has its own block inputs
// (and, without checkpointing, activations), and on the last stage its blocks' output; the stage's
// input (after the first stage) and output (before the last) stay per call.
void carve_activation_sets(const PipelineStage& ps, Decoder::Workspace* ws, Carver& cv, const CarveSizes& z,
                           bool keep_all_blocks, bool training) {
  ws->set_x.clear();
  ws->set_acts.clear();
  const int sets = training && ps.split() ? ps.activation_sets : 0;
  for (int k = 0; k < sets; ++k) {
    if (k == 0) {
      ws->set_x.push_back(ws->x);
      ws->set_acts.push_back(ws->acts);
      continue;
    }
    std::vector<void*> x = ws->x;
    for (std::int64_t l = z.l0; l < z.l1; ++l) {
      if (l > z.l0 || ps.first()) x[static_cast<std::size_t>(l - z.l0)] = cv.take(z.mine * z.C * z.e);
    }
    if (ps.last()) x.back() = cv.take(z.mine * z.C * z.e);  // the head's input, read in the backward
    ws->set_x.push_back(std::move(x));
    ws->set_acts.push_back(keep_all_blocks ? carve_acts(cv, z, z.l1 - z.l0) : ws->acts);
  }
}

// Tensor parallelism's buffers: the sliced stages' parts, the replicated KV heads' pieces, and the
// sliced head's cross-entropy sums.
void carve_tensor_parallel(const ModelConfig& c, const TensorParallel& tp, Decoder::Workspace* ws, Carver& cv,
                           const CarveSizes& z, bool training) {
  const std::size_t n = z.n, C = z.C, e = z.e, hd = z.hd, T = z.T;
  ws->parts.clear();
  ws->kv_parts = ws->kv_all = nullptr;
  ws->own_rows = tp.split_rows() ? cv.take(z.mine * C * e) : nullptr;
  if (!tp.sliced()) return;
  const auto L = static_cast<std::size_t>(tp.local_slices());
  for (std::size_t l = 1; l < L; ++l) ws->parts.push_back(cv.take(n * C * e));
  if (training && kv_pieces(c, tp.slices)) {  // Note [Replicated KV heads] in models/tensor_parallel.h
    ws->kv_parts = cv.take(L * n * 2 * hd * e);
    ws->kv_all = kv_replicas(c, tp.size) > 1 ? cv.take(T * n * 2 * hd * e) : nullptr;
  }
  if (!z.head) return;
  ws->ce_max = static_cast<float*>(cv.take(n * 4));
  ws->ce_target = static_cast<float*>(cv.take(n * 4));
  ws->ce_sums = static_cast<double*>(cv.take(n * L * 8));
  ws->ce_all = static_cast<double*>(cv.take(n * L * T * 8));
}

}  // namespace

static void carve_workspace(const ModelConfig& c, const TensorParallel& tp, const PipelineStage& ps,
                            Decoder::Workspace* ws, Carver& cv, bool keep_all_blocks, bool training) {
  const CarveSizes z = carve_sizes(c, tp, ps, *ws);
  const std::size_t n = z.n, mine = z.mine, C = z.C, e = z.e, F = z.F;
  ws->tokens = static_cast<std::int32_t*>(cv.take(n * 4));
  ws->targets = static_cast<std::int32_t*>(cv.take(n * 4));
  ws->x.clear();
  for (std::int64_t l = z.l0; l <= z.l1; ++l) {
    ws->x.push_back(l == z.l0 && !ps.first() ? nullptr : cv.take(mine * C * e));
  }
  ws->acts = carve_acts(cv, z, keep_all_blocks ? z.l1 - z.l0 : 1);
  carve_activation_sets(ps, ws, cv, z, keep_all_blocks, training);
  ws->tmp = cv.take(n * C * e);
  if (z.head) {
    ws->lnf_out = cv.take(n * C * e);
    ws->lnf_mean = static_cast<float*>(cv.take(mine * 4));
    ws->lnf_rstd = static_cast<float*>(cv.take(mine * 4));
    // See Note [Head one sequence at a time] in models/decoder.h: one sequence's logits, except for the sliced head.
    ws->logits = cv.take((tp.sliced() ? n : static_cast<std::size_t>(ws->seq)) * z.V * e);
    ws->losses = static_cast<float*>(cv.take(n * 4));
  }
  if (training) {
    // A pipeline stage's residual gradient is the caller's buffer (Decoder::stage_backward).
    ws->dres = ps.split() ? nullptr : cv.take(mine * C * e);
    ws->dln = cv.take(n * C * e);
    ws->datt = cv.take(n * z.att_w * e);
    ws->dqkv = cv.take(n * z.qkv_w * e);
    ws->dff_in = cv.take(n * z.ff_in_w * e);
    ws->dff_act = cv.take(n * F * e);
  }
  carve_tensor_parallel(c, tp, ws, cv, z, training);
}

Decoder::Decoder(ModelConfig config, DecoderOptions options)
    : config_(std::move(config)), options_(std::move(options)) {
  config_.validate();
  layout_ = decoder_layout(config_, options_.tiling);
  const TensorParallel& tp = options_.tensor;
  if (tp.sliced() || tp.size > 1) {
    STRATA_CHECK(tp.size >= 1 && tp.slices % tp.size == 0 && tp.rank >= 0 && tp.rank < tp.size,
                 "tensor rank {} of {} with {} slices", tp.rank, tp.size, tp.slices);
    if (options_.tiling.tiled()) {
      throw ConfigError("strata.tiling beside tensor parallelism (strata.parallel.tensor, tensor_slices) is not built "
                        "yet: set strata.tiling to {} or strata.parallel.tensor and tensor_slices to 1");
    }
    check_tensor_parallel(config_, tp.size, tp.slices, options_.tiling.chunks, "the decoder's options");
    tensor_layout_ = std::make_unique<TensorParallelLayout>(tensor_parallel_layout(config_, tp.size, tp.rank));
    layout_.groups = tensor_layout_->groups;
  }
  PipelineStage& ps = options_.pipeline;
  if (ps.end_layer < 0) ps.end_layer = config_.n_layers;
  STRATA_CHECK(ps.size >= 1 && ps.rank >= 0 && ps.rank < ps.size && 0 <= ps.first_layer &&
                   ps.first_layer < ps.end_layer && ps.end_layer <= config_.n_layers &&
                   (ps.size > 1 || (ps.first_layer == 0 && ps.end_layer == config_.n_layers)),
               "pipeline stage {} of {} over layers [{}, {}) of {}", ps.rank, ps.size, ps.first_layer, ps.end_layer,
               config_.n_layers);
  // The stage's groups: those of the logical groups on this stage (with tensor parallelism each
  // logical group's physical parts).
  std::vector<std::int64_t> bounds;
  for (int p = 0; p <= ps.size; ++p) {
    bounds.push_back(p == ps.rank ? ps.first_layer : p == ps.rank + 1 ? ps.end_layer : p < ps.rank ? 0 : config_.n_layers);
  }
  DecoderLayout logical = layout_;
  if (tensor_layout_) logical.groups = tensor_layout_->logical;
  const std::vector<int> logical_stage = pipeline_group_stages(logical, bounds);
  std::vector<int> stage(layout_.groups.size(), -1);
  for (std::size_t g = 0; g < logical_stage.size(); ++g) {
    if (!tensor_layout_) {
      stage[g] = logical_stage[g];
      continue;
    }
    for (const TensorLocation& loc : tensor_layout_->where[g]) stage[loc.group] = logical_stage[g];
  }
  stage_local_.assign(layout_.groups.size(), kNotInStage);
  for (std::size_t g = 0; g < stage.size(); ++g) {
    if (stage[g] != ps.rank) continue;
    stage_local_[g] = stage_groups_.size();
    stage_groups_.push_back(g);
  }
}

Decoder::~Decoder() = default;

std::vector<ParamGroupSpec> Decoder::param_groups() const {
  std::vector<ParamGroupSpec> out;
  for (std::size_t g : stage_groups_) out.push_back(layout_.groups[g]);
  return out;
}

std::size_t Decoder::activation_bytes(std::int64_t batch, std::int64_t seq, bool training) const {
  Workspace ws;
  ws.batch = batch;
  ws.seq = seq;
  Carver cv(nullptr);
  carve_workspace(config_, options_.tensor, options_.pipeline, &ws, cv,
                  training && options_.checkpointing == Checkpointing::Off, training);
  return cv.used();
}

Decoder::Workspace& Decoder::workspace(const DecoderRuntime& rt, std::int64_t batch, std::int64_t seq, bool training) {
  if (ws_ && ws_->batch == batch && ws_->seq == seq && ws_->training == training && ws_->device == rt.device) return *ws_;
  const TensorParallel& tp = options_.tensor;
  if (tp.split_rows() && batch * seq % tp.size != 0) {
    throw ConfigError(fmt::format("sequence parallelism (strata.parallel.sequence) splits the {} x {} = {} tokens of a "
                                  "micro-batch over {} tensor ranks, which does not divide them: make the batch x "
                                  "sequence length a multiple of strata.parallel.tensor or set sequence to false",
                                  batch, seq, batch * seq, tp.size));
  }

  ws_.reset();
  auto ws = std::make_unique<Workspace>();
  ws->batch = batch;
  ws->seq = seq;
  ws->training = training;
  ws->device = rt.device;
  const bool keep = training && options_.checkpointing == Checkpointing::Off;
  ws->bytes = activation_bytes(batch, seq, training);
  char* base = nullptr;
  if (rt.device != nullptr) {
    ws->device_mem = rt.device->allocate(ws->bytes, "activations");
    base = ws->device_mem.as<char>();
  } else {
    ws->host_mem = HostBuffer::allocate(ws->bytes);
    base = static_cast<char*>(ws->host_mem.data());
  }
  Carver cv(base);
  carve_workspace(config_, options_.tensor, options_.pipeline, ws.get(), cv, keep, training);
  ws_ = std::move(ws);
  return *ws_;
}

LossSum Decoder::forward_backward(const DecoderRuntime& rt, ParamProvider& provider, const std::int32_t* tokens,
                                  const std::int32_t* targets, std::int64_t batch, std::int64_t seq, float grad_scale) {
  return run(rt, provider, tokens, targets, batch, seq, true, grad_scale);
}

LossSum Decoder::forward_loss(const DecoderRuntime& rt, ParamProvider& provider, const std::int32_t* tokens,
                              const std::int32_t* targets, std::int64_t batch, std::int64_t seq) {
  return run(rt, provider, tokens, targets, batch, seq, false, 0.0f);
}
namespace decoder_detail {

// The shape and the tokens of a micro-batch, before anything runs.
void check_tokens(const ModelConfig& c, const std::int32_t* tokens, const std::int32_t* targets, std::int64_t batch,
                  std::int64_t seq) {
  if (seq < 1 || seq > c.max_seq_len) {
    throw ConfigError(fmt::format("sequence length {} is outside 1..{} (model '{}' max_seq_len)", seq, c.max_seq_len, c.name));
  }
  STRATA_CHECK(batch >= 1, "batch {} must be positive", batch);
  const std::int64_t n = batch * seq;
  for (std::int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size || targets[i] >= c.vocab_size) {
      throw ConfigError(fmt::format("token {} (target {}) at position {} is outside model '{}' vocabulary of {}",
                                    tokens[i], targets[i], i, c.name, c.vocab_size));
    }
  }
}

void ModelPass::forward_blocks() const {
  if (stage.first()) {
    const GroupViews w = provider.acquire_params(emb, ParamPhase::Forward, stream);
    const void* wpe = c.arch == Architecture::Gpt2 ? w[embedding_group::kWpe] : nullptr;
    if (tp.size > 1) {  // each token's row from the rank that holds it, zeros from the others
      // See Note [Sequence parallelism] in models/tensor_parallel.h.
      // Every row looked up, this rank's rows of the sum kept.
      void* all = tp.split_rows() ? ws.tmp : ws.x[0];
      embedding_forward_vocab_slice(ctx, dt, ws.tokens, w[embedding_group::kWte], vocab.begin, vocab.end, wpe, all,
                                    batch, seq, C);
      pass.sum_over_ranks(all, ws.x[0], n * C);
    } else {
      embedding_forward(ctx, dt, ws.tokens, w[embedding_group::kWte], wpe, ws.x[0], batch, seq, C);
    }
    provider.release_params(emb, stream);
  }
  for (std::int64_t l = l0; l < l1; ++l) {
    const BlockGroups& bg = layout.blocks[static_cast<std::size_t>(l)];
    const BlockParams bp{provider, bg, ParamPhase::Forward, stream,
                         provider.acquire_params(bg.base, ParamPhase::Forward, stream), {}};
    pass.forward(bp, x(l), x(l + 1), acts(l), ws.tmp);
    provider.release_params(bg.base, stream);
  }
}

void ModelPass::head_logits(const void* head_w, std::int64_t b, bool with_grad, float grad_scale) const {
  linear_forward(ctx, dt, at(ws.lnf_out, b * seq * C, dt), C, head_w, nullptr, ws.logits, V, 1, seq, C, V);
  cross_entropy(ctx, dt, ws.logits, ws.targets + b * seq, ws.losses + b * seq, with_grad ? ws.logits : nullptr, seq, V,
                V, grad_scale);
}

void ModelPass::run_head(float grad_scale) const {
  const GroupViews hw = provider.acquire_params(head, ParamPhase::Forward, stream);
  const bool tied = c.tied_embeddings, norm_bias = c.arch == Architecture::Gpt2;
  GroupViews ew;
  const bool acquire_emb = tied && tied_wte == nullptr;
  if (acquire_emb) ew = provider.acquire_params(emb, ParamPhase::Forward, stream);
  const void* head_w = !tied ? hw[head_group::kLmHead] : acquire_emb ? ew[embedding_group::kWte] : tied_wte;
  void* x_final = ws.x.back();
  // Every row of the final norm's output: the logits (and the tied head's gradient) read them all.
  pass.norm_forward(x_final, hw[head_group::kNormW], norm_bias ? hw[head_group::kNormB] : nullptr,
                    tp.split_rows() ? ws.own_rows : ws.lnf_out, ws.lnf_mean, ws.lnf_rstd, ws.lnf_out);
  if (tp.sliced()) {
    pass.logits(head_w, sliced_head());
    pass.cross_entropy(sliced_head(), training, grad_scale);
  }
  GroupViews hg;
  if (training) hg = provider.acquire_grads(head, stream);
  if (!tp.sliced()) {
    // Note [Head one sequence at a time] in models/decoder.h. Tied: last sequence first, so that sequence 0's dlogits
    // are what the buffer holds when the embedding's backward starts.
    for (std::int64_t i = 0; i < batch; ++i) {
      const std::int64_t b = tied ? batch - 1 - i : i;
      head_logits(head_w, b, training, grad_scale);
      if (!training) continue;
      if (tied) {
        // Only d(lnf_out) now; the tied weight's gradient is added with the embedding's, per
        // sequence (Note [Tied embedding gradient order]).
        MatmulArgs a{dt, Trans::No, Trans::No, seq, C, V, ws.logits, V, 0, head_w, C, 0,
                     at(ws.dln, b * seq * C, dt), C, 0, 1};
        matmul(ctx, a);
      } else {  // dW summed over the sequences in order, as one batched call sums them
        linear_backward(ctx, dt, at(ws.lnf_out, b * seq * C, dt), C, head_w, ws.logits, V, at(ws.dln, b * seq * C, dt),
                        C, Accumulate::No, hg[head_group::kLmHead], nullptr, 1, seq, C, V);
      }
    }
  }
  if (training) {
    const void* dln = ws.dln;
    if (tp.sliced()) dln = pass.head_backward(head_w, tied ? nullptr : hg[head_group::kLmHead], sliced_head());
    pass.norm_backward(dln, x_final, hw[head_group::kNormW], ws.lnf_mean, ws.lnf_rstd, ws.dres, hg[head_group::kNormW],
                       norm_bias ? hg[head_group::kNormB] : nullptr, Accumulate::No);
    provider.grads_ready(head, stream);
  }
  if (acquire_emb) provider.release_params(emb, stream);
  provider.release_params(head, stream);
}

void ModelPass::backward_blocks() const {
  for (std::int64_t l = l1 - 1; l >= l0; --l) {
    const BlockGroups& bg = layout.blocks[static_cast<std::size_t>(l)];
    BlockParams bp{provider, bg, ParamPhase::Backward, stream,
                   provider.acquire_params(bg.base, ParamPhase::Backward, stream), {}};
    const auto& a = acts(l);
    const void* x_in = x(l);
    if (!keep_all) pass.forward(bp, x_in, x(l + 1), a, ws.tmp);  // recompute
    bp.g = provider.acquire_grads(bg.base, stream);
    pass.backward(bp, x_in, a, ws);
    provider.grads_ready(bg.base, stream);
    provider.release_params(bg.base, stream);
  }
  if (!stage.first()) return;  // the input's gradient (ws.dres) goes to the previous stage
  const GroupViews w = provider.acquire_params(emb, ParamPhase::Backward, stream);
  const GroupViews g = provider.acquire_grads(emb, stream);
  const void* wte = w[embedding_group::kWte];
  if (recompute_tied_head && tp.sliced()) {  // the same kernels on the same values as the last stage's: the same dlogits
    pass.logits(wte, sliced_head());
    pass.cross_entropy(sliced_head(), true, tied_grad_scale);
  }
  // See Note [Sequence parallelism] in models/tensor_parallel.h.
  // The lookup's gradient reads every row of the residual gradient.
  const void* dres = pass.gather_rows(ws.dres, ws.tmp);
  // Note [Tied embedding gradient order]: a tied wte gets two contributions per sequence, from
  // the head (dlogits^T lnf_out; the logits buffer still holds dlogits) and from the lookup. They
  // are added sequence by sequence, head then lookup, so that any split into micro-batches adds
  // them in the same order (Note [Micro-batch invariance] in models/decoder.h).
  for (std::int64_t b = 0; b < batch; ++b) {
    if (tp.sliced()) {
      if (c.tied_embeddings) pass.tied_head_grad(b, g[embedding_group::kWte], sliced_head());
      if (tp.size > 1) {
        embedding_backward_vocab_slice(ctx, dt, ws.tokens + b * seq, at(dres, b * seq * C, dt),
                                       g[embedding_group::kWte], vocab.begin, vocab.end,
                                       c.arch == Architecture::Gpt2 ? g[embedding_group::kWpe] : nullptr, 1, seq, C);
        continue;
      }
    } else if (c.tied_embeddings) {
      // See Note [Head one sequence at a time] in models/decoder.h.
      // The head left sequence 0's dlogits in the buffer (a
      // pipeline's first stage has none); the others are recomputed, by the same calls on the same
      // values, so with the same bits.
      if (recompute_tied_head || b > 0) head_logits(wte, b, true, tied_grad_scale);
      MatmulArgs dw{dt, Trans::Yes, Trans::No, V, C, seq, ws.logits, V, 0,
                    at(ws.lnf_out, b * seq * C, dt), C, 0, g[embedding_group::kWte], C, 0, 1};
      dw.beta = 1.0f;
      matmul(ctx, dw);
    }
    embedding_backward(ctx, dt, ws.tokens + b * seq, at(dres, b * seq * C, dt), g[embedding_group::kWte],
                       c.arch == Architecture::Gpt2 ? g[embedding_group::kWpe] : nullptr, 1, seq, C);
  }
  provider.grads_ready(emb, stream);
  provider.release_params(emb, stream);
}

// The micro-batch's loss: the per-token losses back on the host, summed over counted targets.
LossSum sum_losses(Stream* stream, const Decoder::Workspace& ws, const std::int32_t* targets, std::int64_t n) {
  std::vector<float> losses(static_cast<std::size_t>(n));
  if (stream == nullptr) {
    std::memcpy(losses.data(), ws.losses, losses.size() * 4);
  } else {
    stream->copy_d2h(losses.data(), ws.losses, losses.size() * 4);
    stream->synchronize();  // the caller needs the loss, and the host token arrays may die after return
  }
  LossSum out;
  for (std::int64_t i = 0; i < n; ++i) {
    if (targets[i] < 0) continue;
    out.sum += losses[static_cast<std::size_t>(i)];
    ++out.tokens;
  }
  return out;
}

}  // namespace decoder_detail


LossSum Decoder::run(const DecoderRuntime& rt, ParamProvider& provider, const std::int32_t* tokens,
                     const std::int32_t* targets, std::int64_t batch, std::int64_t seq, bool training, float grad_scale) {
  const ModelConfig& c = config_;
  if (options_.pipeline.split()) {
    throw ConfigError(fmt::format("model '{}' is split into {} pipeline stages: it runs through the pipeline "
                                  "(models/pipeline_runner.h), not as a whole",
                                  c.name, options_.pipeline.size));
  }
  check_tokens(c, tokens, targets, batch, seq);
  const std::int64_t n = batch * seq;
  const TensorParallel& tp = options_.tensor;
  Workspace& ws = workspace(rt, batch, seq, training);
  const KernelContext& ctx = rt.ctx;
  Stream* stream = ctx.stream;
  copy_tokens(stream, ws.tokens, tokens, n);
  copy_tokens(stream, ws.targets, targets, n);
  const bool keep_all = training && options_.checkpointing == Checkpointing::Off;
  STRATA_CHECK(tp.size == 1 || (stream != nullptr && tp.comm != nullptr),
               "tensor parallelism over {} ranks needs a device stream and the tensor group's communicator", tp.size);
  const BlockPass pass{{c, ctx, batch, seq, layout_.tiling.chunks, tp, ws.parts, ws.own_rows}};
  ProviderChain chain(provider, layout_, stage_local_, false, tensor_layout_.get());
  ModelPass m{c, layout_, ctx, *chain.top, ws, pass, batch, seq, training, keep_all, options_.pipeline};
  m.tied_grad_scale = grad_scale;
  m.forward_blocks();
  m.run_head(grad_scale);
  if (training) m.backward_blocks();
  return sum_losses(stream, ws, targets, n);
}

LossSum accumulate_step_gradients(Decoder& decoder, const DecoderRuntime& rt, ParamProvider& provider,
                                  const std::int32_t* tokens, const std::int32_t* targets, std::int64_t micro_batches,
                                  std::int64_t micro_batch, std::int64_t seq) {
  const std::int64_t per_micro = micro_batch * seq;
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < micro_batches * per_micro; ++i) counted += targets[i] >= 0 ? 1 : 0;
  const float grad_scale = counted > 0 ? 1.0f / static_cast<float>(counted) : 0.0f;
  LossSum total;
  for (std::int64_t m = 0; m < micro_batches; ++m) {
    const LossSum s = decoder.forward_backward(rt, provider, tokens + m * per_micro, targets + m * per_micro,
                                               micro_batch, seq, grad_scale);
    total.sum += s.sum;
    total.tokens += s.tokens;
  }
  return total;
}

}  // namespace strata::models
