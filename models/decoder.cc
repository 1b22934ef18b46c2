// The decoders' forward and backward over param groups (see models/decoder.h).
#include "models/decoder.h"

#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "core/host_buffer.h"
#include "models/decoder_params.h"

namespace strata::models {

namespace {

void* at(void* p, std::int64_t elems, DType dt) {
  return static_cast<char*>(p) + static_cast<std::size_t>(elems) * dtype_bytes(dt);
}

// y[B*T, out] (row stride ldy) = x[B*T, in] (ldx) W^T + bias: one matmul per sequence.
void linear_forward(const KernelContext& ctx, DType dt, const void* x, std::int64_t ldx, const void* w, const void* bias,
                    void* y, std::int64_t ldy, std::int64_t batch, std::int64_t seq, std::int64_t in, std::int64_t out) {
  MatmulArgs a{dt, Trans::No, Trans::Yes, seq, out, in, x, ldx, seq * ldx, w, in, 0, y, ldy, seq * ldy, batch};
  a.bias = bias;
  matmul(ctx, a);
}

// dx (+)= dy W; dW += dy^T x, summed over sequences in order; dbias += column sums of dy.
void linear_backward(const KernelContext& ctx, DType dt, const void* x, std::int64_t ldx, const void* w, const void* dy,
                     std::int64_t ldy, void* dx, std::int64_t lddx, Accumulate acc_dx, void* dw, void* dbias,
                     std::int64_t batch, std::int64_t seq, std::int64_t in, std::int64_t out) {
  if (dx != nullptr) {
    MatmulArgs a{dt, Trans::No, Trans::No, seq, in, out, dy, ldy, seq * ldy, w, in, 0, dx, lddx, seq * lddx, batch};
    a.beta = acc_dx == Accumulate::Yes ? 1.0f : 0.0f;
    matmul(ctx, a);
  }
  MatmulArgs g{dt, Trans::Yes, Trans::No, out, in, seq, dy, ldy, seq * ldy, x, ldx, seq * ldx, dw, in, 0, batch};
  g.beta = 1.0f;
  matmul(ctx, g);
  if (dbias != nullptr) bias_grad(ctx, dt, dy, batch * seq, out, ldy, dbias);
}

}  // namespace

// Activation memory of one micro-batch shape: one allocation carved into named buffers.
struct Decoder::Workspace {
  struct BlockActs {
    void *norm1, *qkv, *att, *x_mid, *norm2, *ff_in, *ff_act;
    float *mean1, *rstd1, *lse, *mean2, *rstd2;
  };
  std::int64_t batch = 0, seq = 0;
  bool training = false;
  Device* device = nullptr;
  DeviceMemory device_mem;
  HostBuffer host_mem;
  std::size_t bytes = 0;
  std::vector<void*> x;  // residual stream at each block input, and the final one
  std::vector<BlockActs> acts;
  std::int32_t *tokens = nullptr, *targets = nullptr;
  void *tmp = nullptr, *lnf_out = nullptr, *logits = nullptr;
  float *lnf_mean = nullptr, *lnf_rstd = nullptr, *losses = nullptr;
  void *dres = nullptr, *dln = nullptr, *datt = nullptr, *dqkv = nullptr, *dff_in = nullptr, *dff_act = nullptr;
};

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

static void carve_workspace(const ModelConfig& c, Decoder::Workspace* ws, Carver& cv, bool keep_all_blocks,
                            bool training) {
  const DType dt = c.dtype;
  const std::size_t e = dtype_bytes(dt);
  const std::size_t n = static_cast<std::size_t>(ws->batch * ws->seq);
  const std::size_t C = static_cast<std::size_t>(c.d_model), H = static_cast<std::size_t>(c.n_heads);
  const std::size_t hd = static_cast<std::size_t>(c.head_dim());
  const std::size_t qkv_w = static_cast<std::size_t>(c.n_heads + 2 * c.n_kv_heads) * hd;
  const std::size_t att_w = H * hd;
  const std::size_t F = static_cast<std::size_t>(c.ffn_hidden);
  const std::size_t ff_in_w = c.arch == Architecture::Gpt2 ? F : 2 * F;
  const std::size_t V = static_cast<std::size_t>(c.vocab_size);
  ws->tokens = static_cast<std::int32_t*>(cv.take(n * 4));
  ws->targets = static_cast<std::int32_t*>(cv.take(n * 4));
  ws->x.clear();
  for (std::int64_t l = 0; l <= c.n_layers; ++l) ws->x.push_back(cv.take(n * C * e));
  ws->acts.clear();
  const std::int64_t sets = keep_all_blocks ? c.n_layers : 1;
  for (std::int64_t l = 0; l < sets; ++l) {
    Decoder::Workspace::BlockActs a{};
    a.norm1 = cv.take(n * C * e);
    a.qkv = cv.take(n * qkv_w * e);
    a.att = cv.take(n * att_w * e);
    a.x_mid = cv.take(n * C * e);
    a.norm2 = cv.take(n * C * e);
    a.ff_in = cv.take(n * ff_in_w * e);
    a.ff_act = cv.take(n * F * e);
    a.mean1 = static_cast<float*>(cv.take(n * 4));
    a.rstd1 = static_cast<float*>(cv.take(n * 4));
    a.mean2 = static_cast<float*>(cv.take(n * 4));
    a.rstd2 = static_cast<float*>(cv.take(n * 4));
    a.lse = static_cast<float*>(cv.take(n * H * 4));
    ws->acts.push_back(a);
  }
  ws->tmp = cv.take(n * C * e);
  ws->lnf_out = cv.take(n * C * e);
  ws->lnf_mean = static_cast<float*>(cv.take(n * 4));
  ws->lnf_rstd = static_cast<float*>(cv.take(n * 4));
  ws->logits = cv.take(n * V * e);
  ws->losses = static_cast<float*>(cv.take(n * 4));
  if (training) {
    ws->dres = cv.take(n * C * e);
    ws->dln = cv.take(n * C * e);
    ws->datt = cv.take(n * att_w * e);
    ws->dqkv = cv.take(n * qkv_w * e);
    ws->dff_in = cv.take(n * ff_in_w * e);
    ws->dff_act = cv.take(n * F * e);
  }
}

Decoder::Decoder(ModelConfig config, DecoderOptions options) : config_(std::move(config)), options_(options) {
  config_.validate();
}

Decoder::~Decoder() = default;

std::vector<ParamGroupSpec> Decoder::param_groups() const { return decoder_param_groups(config_); }

std::size_t Decoder::activation_bytes(std::int64_t batch, std::int64_t seq, bool training) const {
  Workspace ws;
  ws.batch = batch;
  ws.seq = seq;
  Carver cv(nullptr);
  carve_workspace(config_, &ws, cv, training && options_.checkpointing == Checkpointing::Off, training);
  return cv.used();
}

Decoder::Workspace& Decoder::workspace(const DecoderRuntime& rt, std::int64_t batch, std::int64_t seq, bool training) {
  if (ws_ && ws_->batch == batch && ws_->seq == seq && ws_->training == training && ws_->device == rt.device) return *ws_;
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
  carve_workspace(config_, ws.get(), cv, keep, training);
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

namespace {

// Everything one block's forward/backward needs, for either architecture.
struct BlockPass {
  const ModelConfig& c;
  const KernelContext& ctx;
  std::int64_t batch, seq;

  std::int64_t rows() const { return batch * seq; }
  std::int64_t qkv_w() const { return (c.n_heads + 2 * c.n_kv_heads) * c.head_dim(); }
  std::int64_t att_w() const { return c.n_heads * c.head_dim(); }
  AttentionShape attn_shape() const {
    return {batch, seq, c.n_heads, c.n_kv_heads, c.head_dim(), qkv_w(), qkv_w(), att_w()};
  }
  void* k_of(void* qkv) const { return at(qkv, c.n_heads * c.head_dim(), c.dtype); }
  void* v_of(void* qkv) const { return at(qkv, (c.n_heads + c.n_kv_heads) * c.head_dim(), c.dtype); }

  // x_out = block(x_in), filling `a`.
  void forward(const GroupViews& w, const void* x_in, void* x_out, const Decoder::Workspace::BlockActs& a, void* tmp) const {
    const DType dt = c.dtype;
    const std::int64_t C = c.d_model, F = c.ffn_hidden, n = rows();
    if (c.arch == Architecture::Gpt2) {
      using namespace gpt2_block;
      layernorm_forward(ctx, dt, x_in, w[kLn1W], w[kLn1B], a.norm1, a.mean1, a.rstd1, n, C, c.norm_eps);
      linear_forward(ctx, dt, a.norm1, C, w[kQkvW], w[kQkvB], a.qkv, 3 * C, batch, seq, C, 3 * C);
    } else {
      using namespace llama_block;
      rmsnorm_forward(ctx, dt, x_in, w[kAttnNorm], a.norm1, a.rstd1, n, C, c.norm_eps);
      const std::int64_t hd = c.head_dim();
      linear_forward(ctx, dt, a.norm1, C, w[kQ], nullptr, a.qkv, qkv_w(), batch, seq, C, c.n_heads * hd);
      linear_forward(ctx, dt, a.norm1, C, w[kK], nullptr, k_of(a.qkv), qkv_w(), batch, seq, C, c.n_kv_heads * hd);
      linear_forward(ctx, dt, a.norm1, C, w[kV], nullptr, v_of(a.qkv), qkv_w(), batch, seq, C, c.n_kv_heads * hd);
      rope(ctx, dt, a.qkv, batch, seq, c.n_heads, hd, qkv_w(), c.rope_theta, RopeDirection::Forward);
      rope(ctx, dt, k_of(a.qkv), batch, seq, c.n_kv_heads, hd, qkv_w(), c.rope_theta, RopeDirection::Forward);
    }
    attention_forward(ctx, dt, attn_shape(), a.qkv, k_of(a.qkv), v_of(a.qkv), a.att, a.lse);
    if (c.arch == Architecture::Gpt2) {
      using namespace gpt2_block;
      linear_forward(ctx, dt, a.att, C, w[kAttnProjW], w[kAttnProjB], tmp, C, batch, seq, C, C);
      residual_add(ctx, dt, x_in, tmp, a.x_mid, n * C);
      layernorm_forward(ctx, dt, a.x_mid, w[kLn2W], w[kLn2B], a.norm2, a.mean2, a.rstd2, n, C, c.norm_eps);
      linear_forward(ctx, dt, a.norm2, C, w[kFcW], w[kFcB], a.ff_in, F, batch, seq, C, F);
      gelu_forward(ctx, dt, a.ff_in, a.ff_act, n * F);
      linear_forward(ctx, dt, a.ff_act, F, w[kMlpProjW], w[kMlpProjB], tmp, C, batch, seq, F, C);
    } else {
      using namespace llama_block;
      linear_forward(ctx, dt, a.att, att_w(), w[kO], nullptr, tmp, C, batch, seq, att_w(), C);
      residual_add(ctx, dt, x_in, tmp, a.x_mid, n * C);
      rmsnorm_forward(ctx, dt, a.x_mid, w[kMlpNorm], a.norm2, a.rstd2, n, C, c.norm_eps);
      linear_forward(ctx, dt, a.norm2, C, w[kGate], nullptr, a.ff_in, 2 * F, batch, seq, C, F);
      linear_forward(ctx, dt, a.norm2, C, w[kUp], nullptr, at(a.ff_in, F, dt), 2 * F, batch, seq, C, F);
      swiglu_forward(ctx, dt, a.ff_in, a.ff_act, n, F);
      linear_forward(ctx, dt, a.ff_act, F, w[kDown], nullptr, tmp, C, batch, seq, F, C);
    }
    residual_add(ctx, dt, a.x_mid, tmp, x_out, n * C);
  }

  // dres: dL/d(block output) on entry, dL/d(block input) on exit.
  void backward(const GroupViews& w, const GroupViews& g, const void* x_in, const Decoder::Workspace::BlockActs& a,
                const Decoder::Workspace& ws) const {
    const DType dt = c.dtype;
    const std::int64_t C = c.d_model, F = c.ffn_hidden, n = rows();
    if (c.arch == Architecture::Gpt2) {
      using namespace gpt2_block;
      linear_backward(ctx, dt, a.ff_act, F, w[kMlpProjW], ws.dres, C, ws.dff_act, F, Accumulate::No, g[kMlpProjW],
                      g[kMlpProjB], batch, seq, F, C);
      gelu_backward(ctx, dt, a.ff_in, ws.dff_act, ws.dff_in, n * F);
      linear_backward(ctx, dt, a.norm2, C, w[kFcW], ws.dff_in, F, ws.dln, C, Accumulate::No, g[kFcW], g[kFcB], batch,
                      seq, C, F);
      layernorm_backward(ctx, dt, ws.dln, a.x_mid, w[kLn2W], a.mean2, a.rstd2, ws.dres, g[kLn2W], g[kLn2B], n, C,
                         Accumulate::Yes);
      linear_backward(ctx, dt, a.att, C, w[kAttnProjW], ws.dres, C, ws.datt, C, Accumulate::No, g[kAttnProjW],
                      g[kAttnProjB], batch, seq, C, C);
    } else {
      using namespace llama_block;
      linear_backward(ctx, dt, a.ff_act, F, w[kDown], ws.dres, C, ws.dff_act, F, Accumulate::No, g[kDown], nullptr,
                      batch, seq, F, C);
      swiglu_backward(ctx, dt, a.ff_in, ws.dff_act, ws.dff_in, n, F);
      linear_backward(ctx, dt, a.norm2, C, w[kGate], ws.dff_in, 2 * F, ws.dln, C, Accumulate::No, g[kGate], nullptr,
                      batch, seq, C, F);
      linear_backward(ctx, dt, a.norm2, C, w[kUp], at(ws.dff_in, F, dt), 2 * F, ws.dln, C, Accumulate::Yes, g[kUp],
                      nullptr, batch, seq, C, F);
      rmsnorm_backward(ctx, dt, ws.dln, a.x_mid, w[kMlpNorm], a.rstd2, ws.dres, g[kMlpNorm], n, C, Accumulate::Yes);
      linear_backward(ctx, dt, a.att, att_w(), w[kO], ws.dres, C, ws.datt, att_w(), Accumulate::No, g[kO], nullptr,
                      batch, seq, att_w(), C);
    }
    attention_backward(ctx, dt, attn_shape(), a.qkv, k_of(a.qkv), v_of(a.qkv), a.att, a.lse, ws.datt, ws.dqkv,
                       k_of(ws.dqkv), v_of(ws.dqkv));
    if (c.arch == Architecture::Gpt2) {
      using namespace gpt2_block;
      linear_backward(ctx, dt, a.norm1, C, w[kQkvW], ws.dqkv, 3 * C, ws.dln, C, Accumulate::No, g[kQkvW], g[kQkvB],
                      batch, seq, C, 3 * C);
      layernorm_backward(ctx, dt, ws.dln, x_in, w[kLn1W], a.mean1, a.rstd1, ws.dres, g[kLn1W], g[kLn1B], n, C,
                         Accumulate::Yes);
    } else {
      using namespace llama_block;
      const std::int64_t hd = c.head_dim();
      rope(ctx, dt, ws.dqkv, batch, seq, c.n_heads, hd, qkv_w(), c.rope_theta, RopeDirection::Inverse);
      rope(ctx, dt, k_of(ws.dqkv), batch, seq, c.n_kv_heads, hd, qkv_w(), c.rope_theta, RopeDirection::Inverse);
      linear_backward(ctx, dt, a.norm1, C, w[kQ], ws.dqkv, qkv_w(), ws.dln, C, Accumulate::No, g[kQ], nullptr, batch,
                      seq, C, c.n_heads * hd);
      linear_backward(ctx, dt, a.norm1, C, w[kK], k_of(ws.dqkv), qkv_w(), ws.dln, C, Accumulate::Yes, g[kK], nullptr,
                      batch, seq, C, c.n_kv_heads * hd);
      linear_backward(ctx, dt, a.norm1, C, w[kV], v_of(ws.dqkv), qkv_w(), ws.dln, C, Accumulate::Yes, g[kV], nullptr,
                      batch, seq, C, c.n_kv_heads * hd);
      rmsnorm_backward(ctx, dt, ws.dln, x_in, w[kAttnNorm], a.rstd1, ws.dres, g[kAttnNorm], n, C, Accumulate::Yes);
    }
  }
};

}  // namespace

LossSum Decoder::run(const DecoderRuntime& rt, ParamProvider& provider, const std::int32_t* tokens,
                     const std::int32_t* targets, std::int64_t batch, std::int64_t seq, bool training, float grad_scale) {
  const ModelConfig& c = config_;
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
  Workspace& ws = workspace(rt, batch, seq, training);
  const KernelContext& ctx = rt.ctx;
  Stream* stream = ctx.stream;
  const DType dt = c.dtype;
  const std::int64_t C = c.d_model, V = c.vocab_size;
  if (stream == nullptr) {
    std::memcpy(ws.tokens, tokens, static_cast<std::size_t>(n) * 4);
    std::memcpy(ws.targets, targets, static_cast<std::size_t>(n) * 4);
  } else {
    stream->copy_h2d(ws.tokens, tokens, static_cast<std::size_t>(n) * 4);
    stream->copy_h2d(ws.targets, targets, static_cast<std::size_t>(n) * 4);
  }
  const bool keep_all = training && options_.checkpointing == Checkpointing::Off;
  const BlockPass pass{c, ctx, batch, seq};
  const std::size_t emb = embedding_group_index(), head = head_group_index(c);

  // Forward.
  {
    const GroupViews w = provider.acquire_params(emb, ParamPhase::Forward, stream);
    embedding_forward(ctx, dt, ws.tokens, w[embedding_group::kWte],
                      c.arch == Architecture::Gpt2 ? w[embedding_group::kWpe] : nullptr, ws.x[0], batch, seq, C);
    provider.release_params(emb, stream);
  }
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const std::size_t gi = block_group_index(l);
    const GroupViews w = provider.acquire_params(gi, ParamPhase::Forward, stream);
    pass.forward(w, ws.x[static_cast<std::size_t>(l)], ws.x[static_cast<std::size_t>(l + 1)],
                 ws.acts[keep_all ? static_cast<std::size_t>(l) : 0], ws.tmp);
    provider.release_params(gi, stream);
  }
  // Head: final norm, logits, fused softmax + cross-entropy (and, training, the head's backward).
  {
    const GroupViews hw = provider.acquire_params(head, ParamPhase::Forward, stream);
    const bool tied = c.arch == Architecture::Gpt2;
    GroupViews ew;
    if (tied) ew = provider.acquire_params(emb, ParamPhase::Forward, stream);
    const void* head_w = tied ? ew[embedding_group::kWte] : hw[head_group::kLmHead];
    void* x_final = ws.x.back();
    if (tied) {
      layernorm_forward(ctx, dt, x_final, hw[head_group::kNormW], hw[head_group::kNormB], ws.lnf_out, ws.lnf_mean,
                        ws.lnf_rstd, n, C, c.norm_eps);
    } else {
      rmsnorm_forward(ctx, dt, x_final, hw[head_group::kNormW], ws.lnf_out, ws.lnf_rstd, n, C, c.norm_eps);
    }
    linear_forward(ctx, dt, ws.lnf_out, C, head_w, nullptr, ws.logits, V, batch, seq, C, V);
    cross_entropy(ctx, dt, ws.logits, ws.targets, ws.losses, training ? ws.logits : nullptr, n, V, V, grad_scale);
    if (training) {
      const GroupViews hg = provider.acquire_grads(head, stream);
      if (tied) {
        // Only d(lnf_out) now; the tied weight's gradient is added with the embedding's, per sequence
        // (Note [Tied embedding gradient order]).
        MatmulArgs a{dt, Trans::No, Trans::No, seq, C, V, ws.logits, V, seq * V, head_w, C, 0, ws.dln, C, seq * C, batch};
        matmul(ctx, a);
      } else {
        linear_backward(ctx, dt, ws.lnf_out, C, head_w, ws.logits, V, ws.dln, C, Accumulate::No, hg[head_group::kLmHead],
                        nullptr, batch, seq, C, V);
      }
      if (tied) {
        layernorm_backward(ctx, dt, ws.dln, x_final, hw[head_group::kNormW], ws.lnf_mean, ws.lnf_rstd, ws.dres,
                           hg[head_group::kNormW], hg[head_group::kNormB], n, C, Accumulate::No);
      } else {
        rmsnorm_backward(ctx, dt, ws.dln, x_final, hw[head_group::kNormW], ws.lnf_rstd, ws.dres, hg[head_group::kNormW],
                         n, C, Accumulate::No);
      }
      provider.grads_ready(head, stream);
    }
    if (tied) provider.release_params(emb, stream);
    provider.release_params(head, stream);
  }
  if (training) {
    for (std::int64_t l = c.n_layers - 1; l >= 0; --l) {
      const std::size_t gi = block_group_index(l);
      const GroupViews w = provider.acquire_params(gi, ParamPhase::Backward, stream);
      const auto& a = ws.acts[keep_all ? static_cast<std::size_t>(l) : 0];
      const void* x_in = ws.x[static_cast<std::size_t>(l)];
      if (!keep_all) pass.forward(w, x_in, ws.x[static_cast<std::size_t>(l + 1)], a, ws.tmp);  // recompute
      const GroupViews g = provider.acquire_grads(gi, stream);
      pass.backward(w, g, x_in, a, ws);
      provider.grads_ready(gi, stream);
      provider.release_params(gi, stream);
    }
    const GroupViews w = provider.acquire_params(emb, ParamPhase::Backward, stream);
    const GroupViews g = provider.acquire_grads(emb, stream);
    // Note [Tied embedding gradient order]: GPT-2's wte gets two contributions per sequence, from
    // the head (dlogits^T lnf_out; the logits buffer still holds dlogits) and from the lookup. They
    // are added sequence by sequence, head then lookup, so that any split into micro-batches adds
    // them in the same order (Note [Micro-batch invariance] in decoder.h).
    for (std::int64_t b = 0; b < batch; ++b) {
      if (c.arch == Architecture::Gpt2) {
        MatmulArgs dw{dt, Trans::Yes, Trans::No, V, C, seq, at(ws.logits, b * seq * V, dt), V, 0,
                      at(ws.lnf_out, b * seq * C, dt), C, 0, g[embedding_group::kWte], C, 0, 1};
        dw.beta = 1.0f;
        matmul(ctx, dw);
      }
      embedding_backward(ctx, dt, ws.tokens + b * seq, at(ws.dres, b * seq * C, dt), g[embedding_group::kWte],
                         c.arch == Architecture::Gpt2 ? g[embedding_group::kWpe] : nullptr, 1, seq, C);
    }
    provider.grads_ready(emb, stream);
    provider.release_params(emb, stream);
  }
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
