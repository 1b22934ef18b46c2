// The decoders' forward and backward over param groups (see models/decoder.h).
#include "models/decoder.h"

#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/host_buffer.h"
#include "engine/communicator.h"
#include "models/decoder_params.h"
#include "models/sliced_pass.h"

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
  // Tensor slices (Note [Tensor slices]): partial sums 1..L-1 of one [rows, d_model] sum (partial 0
  // is the sum's destination), and the vocabulary-parallel cross-entropy's statistics.
  std::vector<void*> parts;
  float *ce_max = nullptr, *ce_target = nullptr;
  double *ce_sums = nullptr, *ce_all = nullptr;
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

static void carve_workspace(const ModelConfig& c, const TensorParallel& tp, const PipelineStage& ps,
                            Decoder::Workspace* ws, Carver& cv, bool keep_all_blocks, bool training) {
  const DType dt = c.dtype;
  const std::size_t e = dtype_bytes(dt);
  const std::size_t n = static_cast<std::size_t>(ws->batch * ws->seq);
  const auto T = static_cast<std::size_t>(tp.size);
  // A tensor rank's activations are those of its heads, MLP columns and vocabulary rows.
  const std::size_t C = static_cast<std::size_t>(c.d_model), H = static_cast<std::size_t>(c.n_heads) / T;
  const std::size_t hd = static_cast<std::size_t>(c.head_dim());
  const std::size_t qkv_w = (H + 2 * static_cast<std::size_t>(c.n_kv_heads) / T) * hd;
  const std::size_t att_w = H * hd;
  const std::size_t F = static_cast<std::size_t>(c.ffn_hidden) / T;
  const std::size_t ff_in_w = c.arch == Architecture::Gpt2 ? F : 2 * F;
  const std::size_t V = static_cast<std::size_t>(vocab_rows(c, tp.size, tp.rank).rows());
  ws->tokens = static_cast<std::int32_t*>(cv.take(n * 4));
  ws->targets = static_cast<std::int32_t*>(cv.take(n * 4));
  // A pipeline stage's blocks only; a later stage's input is the caller's buffer (set per call).
  const std::int64_t l0 = ps.first_layer, l1 = ps.end_layer < 0 ? c.n_layers : ps.end_layer;
  // The head's buffers: on the last stage, and on the first when the embedding is tied across
  // stages (Note [Tied embedding across stages] in models/pipeline.h).
  const bool head = ps.last() || (ps.split() && ps.first() && c.arch == Architecture::Gpt2);
  ws->x.clear();
  for (std::int64_t l = l0; l <= l1; ++l) ws->x.push_back(l == l0 && !ps.first() ? nullptr : cv.take(n * C * e));
  ws->acts.clear();
  const std::int64_t sets = keep_all_blocks ? l1 - l0 : 1;
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
  if (head) {
    ws->lnf_out = cv.take(n * C * e);
    ws->lnf_mean = static_cast<float*>(cv.take(n * 4));
    ws->lnf_rstd = static_cast<float*>(cv.take(n * 4));
    ws->logits = cv.take(n * V * e);
    ws->losses = static_cast<float*>(cv.take(n * 4));
  }
  if (training) {
    // A pipeline stage's residual gradient is the caller's buffer (Decoder::stage_backward).
    ws->dres = ps.split() ? nullptr : cv.take(n * C * e);
    ws->dln = cv.take(n * C * e);
    ws->datt = cv.take(n * att_w * e);
    ws->dqkv = cv.take(n * qkv_w * e);
    ws->dff_in = cv.take(n * ff_in_w * e);
    ws->dff_act = cv.take(n * F * e);
  }
  ws->parts.clear();
  if (tp.sliced()) {
    const auto L = static_cast<std::size_t>(tp.local_slices());
    for (std::size_t l = 1; l < L; ++l) ws->parts.push_back(cv.take(n * C * e));
    if (!head) return;
    ws->ce_max = static_cast<float*>(cv.take(n * 4));
    ws->ce_target = static_cast<float*>(cv.take(n * 4));
    ws->ce_sums = static_cast<double*>(cv.take(n * L * 8));
    ws->ce_all = static_cast<double*>(cv.take(n * L * T * 8));
  }
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

namespace {

const void* at(const void* p, std::int64_t elems, DType dt) {
  return static_cast<const char*>(p) + static_cast<std::size_t>(elems) * dtype_bytes(dt);
}

// A block's parameters as one pass over it sees them: the base group's views, held for the whole
// block, and its tile groups, acquired stage by stage (see models/decoder.h).
struct BlockParams {
  ParamProvider& provider;
  const BlockGroups& groups;
  ParamPhase phase;
  Stream* stream;
  GroupViews w;  // base group weights
  GroupViews g;  // base group gradients (backward only)

  // A tensor of the base group by its untiled block index (norms, biases, untiled weights).
  const void* weight(std::size_t k) const { return w[groups.base_index[k]]; }
  void* grad(std::size_t k) const { return g[groups.base_index[k]]; }
};

// Everything one block's forward/backward needs, for either architecture; with tensor slices the
// stages run through SlicedPass (models/sliced_pass.h).
struct BlockPass : SlicedPass {
  std::int64_t qkv_w() const { return (heads() + 2 * kv_heads()) * c.head_dim(); }
  std::int64_t att_w() const { return heads() * c.head_dim(); }
  AttentionShape attn_shape() const {
    return {batch, seq, heads(), kv_heads(), c.head_dim(), qkv_w(), qkv_w(), att_w()};
  }
  void* k_of(void* qkv) const { return at(qkv, heads() * c.head_dim(), c.dtype); }
  void* v_of(void* qkv) const { return at(qkv, (heads() + kv_heads()) * c.head_dim(), c.dtype); }

  // Runs fn(tile weights, tile gradients, tile, first chunk, end chunk) over the stage: once over
  // every chunk with null tile views when the stage is untiled (its weights are in the base group),
  // else per tile with the tile group acquired (and its gradients, when `grads`, declared ready
  // after fn) and released.
  template <typename Fn>
  void for_each_tile(const BlockParams& bp, BlockStage stage, bool grads, Fn&& fn) const {
    const std::int64_t T = bp.groups.tiles(stage);
    if (T == 1) {
      fn(nullptr, nullptr, 0, 0, chunks);
      return;
    }
    const std::int64_t per_tile = chunks / T;
    for (std::int64_t t = 0; t < T; ++t) {
      const std::size_t gi = bp.groups.tile_group(stage, t);
      const GroupViews w = bp.provider.acquire_params(gi, bp.phase, bp.stream);
      GroupViews g;
      if (grads) g = bp.provider.acquire_grads(gi, bp.stream);
      fn(&w, grads ? &g : nullptr, t, t * per_tile, (t + 1) * per_tile);
      if (grads) bp.provider.grads_ready(gi, bp.stream);
      bp.provider.release_params(gi, bp.stream);
    }
  }

  // Rows `r` of linear `i` of the stage: in the tile views, or in the base group's whole tensor.
  template <typename Ptr>
  Ptr rows_of(const BlockParams& bp, BlockStage stage, const GroupViews* tile_views, Ptr base_tensor, std::size_t i,
              const StageLinear& lin, std::int64_t tile, RowRange r) const {
    if (tile_views == nullptr) return static_cast<Ptr>(at(base_tensor, r.begin * lin.in, c.dtype));
    const RowRange t = tile_rows(lin.out, chunks, bp.groups.tiles(stage), tile);
    return static_cast<Ptr>(at((*tile_views)[i], (r.begin - t.begin) * lin.in, c.dtype));
  }

  // ys[i][:, rows] = x W_i[rows]^T + b_i[rows], chunk by chunk (Note [Tile-invariant linear layers]).
  void stage_forward(const BlockParams& bp, BlockStage stage, const void* x, std::int64_t ldx,
                     std::initializer_list<StageIo> ys) const {
    if (tp.sliced()) {  // the outputs are columns of the first one's buffer (ColumnLinear::col0)
      if (row_parallel(stage)) {
        row_forward(bp.w, stage, x, ldx, ys.begin()[0]);
      } else {
        column_forward(bp.w, stage, x, ldx, ys.begin()[0]);
      }
      return;
    }
    const std::vector<StageLinear> lins = stage_linears(c, stage);
    STRATA_CHECK(lins.size() == ys.size(), "stage {} has {} linears, {} outputs given", block_stage_name(c.arch, stage),
                 lins.size(), ys.size());
    for_each_tile(bp, stage, false, [&](const GroupViews* tw, const GroupViews*, std::int64_t tile, std::int64_t c0,
                                        std::int64_t c1) {
      for (std::int64_t ch = c0; ch < c1; ++ch) {
        for (std::size_t i = 0; i < lins.size(); ++i) {
          const StageLinear& lin = lins[i];
          const StageIo& y = ys.begin()[i];
          const RowRange r = chunk_rows(lin.out, chunks, ch);
          if (r.rows() == 0) continue;
          const void* w = rows_of<const void*>(bp, stage, tw, tw ? nullptr : bp.weight(lin.weight), i, lin, tile, r);
          MatmulArgs a{c.dtype, Trans::No,  Trans::Yes, seq, r.rows(), lin.in, x, ldx, seq * ldx, w, lin.in, 0,
                       at(y.p, r.begin, c.dtype), y.ld, seq * y.ld, batch};
          a.bias = lin.bias == kNoBias ? nullptr : at(bp.weight(lin.bias), r.begin, c.dtype);
          matmul(ctx, a);
        }
      }
    });
  }

  // dx (+)= sum_i dy_i W_i, dW_i += dy_i^T x, db_i += column sums of dy_i, chunk by chunk in
  // ascending chunks, the stage's linears interleaved chunk-major (Note [Tile-invariant linear layers]).
  void stage_backward(const BlockParams& bp, BlockStage stage, const void* x, std::int64_t ldx,
                      std::initializer_list<StageIo> dys, void* dx, std::int64_t lddx, Accumulate acc) const {
    if (tp.sliced()) {
      STRATA_CHECK(acc == Accumulate::No, "a sliced stage backward writes its input gradient");
      if (row_parallel(stage)) {
        row_backward(bp.w, bp.g, stage, x, ldx, dys.begin()[0], dx, lddx);
      } else {
        STRATA_CHECK(lddx == c.d_model, "column-parallel input gradient at row stride {}", lddx);
        column_backward(bp.w, bp.g, stage, x, ldx, dys.begin()[0], dx);
      }
      return;
    }
    const std::vector<StageLinear> lins = stage_linears(c, stage);
    STRATA_CHECK(lins.size() == dys.size(), "stage {} has {} linears, {} gradients given",
                 block_stage_name(c.arch, stage), lins.size(), dys.size());
    bool started = acc == Accumulate::Yes;
    for_each_tile(bp, stage, true, [&](const GroupViews* tw, const GroupViews* tg, std::int64_t tile, std::int64_t c0,
                                       std::int64_t c1) {
      for (std::int64_t ch = c0; ch < c1; ++ch) {
        for (std::size_t i = 0; i < lins.size(); ++i) {
          const StageLinear& lin = lins[i];
          const StageIo& dy = dys.begin()[i];
          const RowRange r = chunk_rows(lin.out, chunks, ch);
          if (r.rows() == 0) continue;
          const void* w = rows_of<const void*>(bp, stage, tw, tw ? nullptr : bp.weight(lin.weight), i, lin, tile, r);
          void* dw = rows_of<void*>(bp, stage, tg, tg ? nullptr : bp.grad(lin.weight), i, lin, tile, r);
          const void* dyr = at(dy.p, r.begin, c.dtype);
          MatmulArgs d{c.dtype, Trans::No, Trans::No, seq, lin.in, r.rows(), dyr, dy.ld, seq * dy.ld, w, lin.in, 0,
                       dx, lddx, seq * lddx, batch};
          d.beta = started ? 1.0f : 0.0f;
          started = true;
          matmul(ctx, d);
          MatmulArgs g{c.dtype, Trans::Yes, Trans::No, r.rows(), lin.in, seq, dyr, dy.ld, seq * dy.ld, x, ldx,
                       seq * ldx, dw, lin.in, 0, batch};
          g.beta = 1.0f;
          matmul(ctx, g);
          if (lin.bias != kNoBias) {
            bias_grad(ctx, c.dtype, dyr, batch * seq, r.rows(), dy.ld, at(bp.grad(lin.bias), r.begin, c.dtype));
          }
        }
      }
    });
  }

  // x_out = block(x_in), filling `a`.
  void forward(const BlockParams& bp, const void* x_in, void* x_out, const Decoder::Workspace::BlockActs& a,
               void* tmp) const {
    const DType dt = c.dtype;
    const std::int64_t C = c.d_model, F = ffn(), n = rows();
    if (c.arch == Architecture::Gpt2) {
      using namespace gpt2_block;
      layernorm_forward(ctx, dt, x_in, bp.weight(kLn1W), bp.weight(kLn1B), a.norm1, a.mean1, a.rstd1, n, C, c.norm_eps);
      stage_forward(bp, BlockStage::AttnIn, a.norm1, C, {{a.qkv, qkv_w()}});
    } else {
      using namespace llama_block;
      rmsnorm_forward(ctx, dt, x_in, bp.weight(kAttnNorm), a.norm1, a.rstd1, n, C, c.norm_eps);
      const std::int64_t hd = c.head_dim();
      stage_forward(bp, BlockStage::AttnIn, a.norm1, C,
                    {{a.qkv, qkv_w()}, {k_of(a.qkv), qkv_w()}, {v_of(a.qkv), qkv_w()}});
      rope(ctx, dt, a.qkv, batch, seq, heads(), hd, qkv_w(), c.rope_theta, RopeDirection::Forward);
      rope(ctx, dt, k_of(a.qkv), batch, seq, kv_heads(), hd, qkv_w(), c.rope_theta, RopeDirection::Forward);
    }
    attention_forward(ctx, dt, attn_shape(), a.qkv, k_of(a.qkv), v_of(a.qkv), a.att, a.lse);
    stage_forward(bp, BlockStage::AttnOut, a.att, att_w(), {{tmp, C}});
    residual_add(ctx, dt, x_in, tmp, a.x_mid, n * C);
    if (c.arch == Architecture::Gpt2) {
      using namespace gpt2_block;
      layernorm_forward(ctx, dt, a.x_mid, bp.weight(kLn2W), bp.weight(kLn2B), a.norm2, a.mean2, a.rstd2, n, C,
                        c.norm_eps);
      stage_forward(bp, BlockStage::MlpIn, a.norm2, C, {{a.ff_in, F}});
      gelu_forward(ctx, dt, a.ff_in, a.ff_act, n * F);
    } else {
      using namespace llama_block;
      rmsnorm_forward(ctx, dt, a.x_mid, bp.weight(kMlpNorm), a.norm2, a.rstd2, n, C, c.norm_eps);
      stage_forward(bp, BlockStage::MlpIn, a.norm2, C, {{a.ff_in, 2 * F}, {at(a.ff_in, F, dt), 2 * F}});
      swiglu_forward(ctx, dt, a.ff_in, a.ff_act, n, F);
    }
    stage_forward(bp, BlockStage::MlpOut, a.ff_act, F, {{tmp, C}});
    residual_add(ctx, dt, a.x_mid, tmp, x_out, n * C);
  }

  // dres: dL/d(block output) on entry, dL/d(block input) on exit.
  void backward(const BlockParams& bp, const void* x_in, const Decoder::Workspace::BlockActs& a,
                const Decoder::Workspace& ws) const {
    const DType dt = c.dtype;
    const std::int64_t C = c.d_model, F = ffn(), n = rows();
    stage_backward(bp, BlockStage::MlpOut, a.ff_act, F, {{ws.dres, C}}, ws.dff_act, F, Accumulate::No);
    if (c.arch == Architecture::Gpt2) {
      using namespace gpt2_block;
      gelu_backward(ctx, dt, a.ff_in, ws.dff_act, ws.dff_in, n * F);
      stage_backward(bp, BlockStage::MlpIn, a.norm2, C, {{ws.dff_in, F}}, ws.dln, C, Accumulate::No);
      layernorm_backward(ctx, dt, ws.dln, a.x_mid, bp.weight(kLn2W), a.mean2, a.rstd2, ws.dres, bp.grad(kLn2W),
                         bp.grad(kLn2B), n, C, Accumulate::Yes);
    } else {
      using namespace llama_block;
      swiglu_backward(ctx, dt, a.ff_in, ws.dff_act, ws.dff_in, n, F);
      stage_backward(bp, BlockStage::MlpIn, a.norm2, C, {{ws.dff_in, 2 * F}, {at(ws.dff_in, F, dt), 2 * F}}, ws.dln, C,
                     Accumulate::No);
      rmsnorm_backward(ctx, dt, ws.dln, a.x_mid, bp.weight(kMlpNorm), a.rstd2, ws.dres, bp.grad(kMlpNorm), n, C,
                       Accumulate::Yes);
    }
    stage_backward(bp, BlockStage::AttnOut, a.att, att_w(), {{ws.dres, C}}, ws.datt, att_w(), Accumulate::No);
    attention_backward(ctx, dt, attn_shape(), a.qkv, k_of(a.qkv), v_of(a.qkv), a.att, a.lse, ws.datt, ws.dqkv,
                       k_of(ws.dqkv), v_of(ws.dqkv));
    if (c.arch == Architecture::Gpt2) {
      using namespace gpt2_block;
      stage_backward(bp, BlockStage::AttnIn, a.norm1, C, {{ws.dqkv, qkv_w()}}, ws.dln, C, Accumulate::No);
      layernorm_backward(ctx, dt, ws.dln, x_in, bp.weight(kLn1W), a.mean1, a.rstd1, ws.dres, bp.grad(kLn1W),
                         bp.grad(kLn1B), n, C, Accumulate::Yes);
    } else {
      using namespace llama_block;
      const std::int64_t hd = c.head_dim();
      rope(ctx, dt, ws.dqkv, batch, seq, heads(), hd, qkv_w(), c.rope_theta, RopeDirection::Inverse);
      rope(ctx, dt, k_of(ws.dqkv), batch, seq, kv_heads(), hd, qkv_w(), c.rope_theta, RopeDirection::Inverse);
      stage_backward(bp, BlockStage::AttnIn, a.norm1, C,
                     {{ws.dqkv, qkv_w()}, {k_of(ws.dqkv), qkv_w()}, {v_of(ws.dqkv), qkv_w()}}, ws.dln, C,
                     Accumulate::No);
      rmsnorm_backward(ctx, dt, ws.dln, x_in, bp.weight(kAttnNorm), a.rstd1, ws.dres, bp.grad(kAttnNorm), n, C,
                       Accumulate::Yes);
    }
  }
};

// One micro-batch through the whole model: what the phases of Decoder::run share, with the
// shorthands their kernel calls use.
struct ModelPass {
  const ModelConfig& c;
  const DecoderLayout& layout;
  const KernelContext& ctx;
  ParamProvider& provider;
  Decoder::Workspace& ws;
  const BlockPass& pass;
  std::int64_t batch, seq;
  bool training;
  bool keep_all;  // every block keeps its activations (training without checkpointing)
  const PipelineStage& stage;  // its blocks [l0, l1); the embedding on the first stage, the head on the last
  // Note [Tied embedding across stages] (models/pipeline.h): the last stage's copy of the tied
  // embedding weights, and on the first stage, whether its backward recomputes the head's logits
  // and their gradient (from ws.lnf_out, the last stage's) with this loss-gradient scale.
  const void* tied_wte = nullptr;
  bool recompute_tied_head = false;
  float tied_grad_scale = 0;
  Stream* stream = ctx.stream;
  DType dt = c.dtype;
  std::int64_t n = batch * seq, C = c.d_model, V = c.vocab_size;
  std::size_t emb = layout.embedding, head = layout.head;
  const TensorParallel& tp = pass.tp;
  RowRange vocab = vocab_rows(c, tp.size, tp.rank);  // this rank's rows of the embedding and the head
  std::int64_t l0 = stage.first_layer, l1 = stage.end_layer;

  // The residual stream at block l's input (l1: the stage's output), and block l's activations.
  void* x(std::int64_t l) const { return ws.x[static_cast<std::size_t>(l - l0)]; }
  const Decoder::Workspace::BlockActs& acts(std::int64_t l) const {
    return ws.acts[keep_all ? static_cast<std::size_t>(l - l0) : 0];
  }

  // Forward through the embedding (first stage) and the blocks.
  void forward_blocks() const;
  // Head: final norm, logits, fused softmax + cross-entropy (and, training, the head's backward).
  void run_head(float grad_scale) const;
  // Backward through the blocks, last first (recomputing a block's forward under checkpointing),
  // then the embedding's (first stage).
  void backward_blocks() const;

  // The head's buffers for the tensor-sliced head (models/sliced_pass.h).
  SlicedHead sliced_head() const {
    return {ws.targets, ws.lnf_out, ws.logits, ws.losses, ws.dln, ws.ce_max, ws.ce_target, ws.ce_sums, ws.ce_all};
  }
};

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
      embedding_forward_vocab_slice(ctx, dt, ws.tokens, w[embedding_group::kWte], vocab.begin, vocab.end, wpe, ws.x[0],
                                    batch, seq, C);
      tp.comm->all_reduce(ws.x[0], ws.x[0], static_cast<std::size_t>(n * C), dt, ReduceOp::Sum, *stream);
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

void ModelPass::run_head(float grad_scale) const {
  const GroupViews hw = provider.acquire_params(head, ParamPhase::Forward, stream);
  const bool tied = c.arch == Architecture::Gpt2;
  GroupViews ew;
  const bool acquire_emb = tied && tied_wte == nullptr;
  if (acquire_emb) ew = provider.acquire_params(emb, ParamPhase::Forward, stream);
  const void* head_w = !tied ? hw[head_group::kLmHead] : acquire_emb ? ew[embedding_group::kWte] : tied_wte;
  void* x_final = ws.x.back();
  if (tied) {
    layernorm_forward(ctx, dt, x_final, hw[head_group::kNormW], hw[head_group::kNormB], ws.lnf_out, ws.lnf_mean,
                      ws.lnf_rstd, n, C, c.norm_eps);
  } else {
    rmsnorm_forward(ctx, dt, x_final, hw[head_group::kNormW], ws.lnf_out, ws.lnf_rstd, n, C, c.norm_eps);
  }
  if (tp.sliced()) {
    pass.logits(head_w, sliced_head());
    pass.cross_entropy(sliced_head(), training, grad_scale);
  } else {
    linear_forward(ctx, dt, ws.lnf_out, C, head_w, nullptr, ws.logits, V, batch, seq, C, V);
    cross_entropy(ctx, dt, ws.logits, ws.targets, ws.losses, training ? ws.logits : nullptr, n, V, V, grad_scale);
  }
  if (training) {
    const GroupViews hg = provider.acquire_grads(head, stream);
    if (tp.sliced()) {
      pass.head_backward(head_w, tied ? nullptr : hg[head_group::kLmHead], sliced_head());
    } else if (tied) {
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
  if (recompute_tied_head) {  // the same kernels on the same values as the last stage's: the same dlogits
    const void* wte = w[embedding_group::kWte];
    if (tp.sliced()) {
      pass.logits(wte, sliced_head());
      pass.cross_entropy(sliced_head(), true, tied_grad_scale);
    } else {
      linear_forward(ctx, dt, ws.lnf_out, C, wte, nullptr, ws.logits, V, batch, seq, C, V);
      cross_entropy(ctx, dt, ws.logits, ws.targets, ws.losses, ws.logits, n, V, V, tied_grad_scale);
    }
  }
  // Note [Tied embedding gradient order]: GPT-2's wte gets two contributions per sequence, from
  // the head (dlogits^T lnf_out; the logits buffer still holds dlogits) and from the lookup. They
  // are added sequence by sequence, head then lookup, so that any split into micro-batches adds
  // them in the same order (Note [Micro-batch invariance] in decoder.h).
  for (std::int64_t b = 0; b < batch; ++b) {
    if (tp.sliced()) {
      if (c.arch == Architecture::Gpt2) pass.tied_head_grad(b, g[embedding_group::kWte], sliced_head());
      if (tp.size > 1) {
        embedding_backward_vocab_slice(ctx, dt, ws.tokens + b * seq, at(ws.dres, b * seq * C, dt),
                                       g[embedding_group::kWte], vocab.begin, vocab.end,
                                       c.arch == Architecture::Gpt2 ? g[embedding_group::kWpe] : nullptr, 1, seq, C);
        continue;
      }
    } else if (c.arch == Architecture::Gpt2) {
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

}  // namespace

namespace {

// The decoder's view of the provider: the engine's groups as the passes index them. A pipeline
// stage's engine holds the stage's groups only (models/pipeline.h); with tensor parallelism it holds
// each group's replicated tensors apart, and the passes index the logical groups
// (models/tensor_parallel.h).
struct ProviderChain {
  std::optional<StageGroupProvider> stage;
  std::optional<SplitGroupProvider> split;
  ParamProvider* top = nullptr;

  ProviderChain(ParamProvider& provider, const DecoderLayout& layout, const std::vector<std::size_t>& stage_local,
                bool pipelined, const TensorParallelLayout* tensor) {
    top = &provider;
    if (pipelined) top = &stage.emplace(*top, layout.groups, stage_local);
    if (tensor != nullptr && tensor->split()) top = &split.emplace(*top, *tensor);
  }
};

void copy_tokens(Stream* stream, std::int32_t* dst, const std::int32_t* src, std::int64_t n) {
  if (stream == nullptr) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
  } else {
    stream->copy_h2d(dst, src, static_cast<std::size_t>(n) * 4);
  }
}

}  // namespace

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
  Workspace& ws = workspace(rt, batch, seq, training);
  const KernelContext& ctx = rt.ctx;
  Stream* stream = ctx.stream;
  copy_tokens(stream, ws.tokens, tokens, n);
  copy_tokens(stream, ws.targets, targets, n);
  const bool keep_all = training && options_.checkpointing == Checkpointing::Off;
  const TensorParallel& tp = options_.tensor;
  STRATA_CHECK(tp.size == 1 || (stream != nullptr && tp.comm != nullptr),
               "tensor parallelism over {} ranks needs a device stream and the tensor group's communicator", tp.size);
  const BlockPass pass{{c, ctx, batch, seq, layout_.tiling.chunks, tp, ws.parts}};
  ProviderChain chain(provider, layout_, stage_local_, false, tensor_layout_.get());
  const ModelPass m{c, layout_, ctx, *chain.top, ws, pass, batch, seq, training, keep_all, options_.pipeline};
  m.forward_blocks();
  m.run_head(grad_scale);
  if (training) m.backward_blocks();
  return sum_losses(stream, ws, targets, n);
}

namespace {

// Points workspace buffers at the caller's for one pipeline call and puts them back on the way out,
// also when the call throws.
class BorrowedBuffers {
 public:
  void lend(void*& slot, const void* buffer) {
    saved_.emplace_back(&slot, slot);
    slot = const_cast<void*>(buffer);  // read only where the caller's buffer is const
  }
  ~BorrowedBuffers() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) *it->first = it->second;
  }

 private:
  std::vector<std::pair<void**, void*>> saved_;
};

}  // namespace

void Decoder::check_stage_call(const DecoderRuntime& rt, const char* what) const {
  const TensorParallel& tp = options_.tensor;
  STRATA_CHECK(options_.pipeline.split() && rt.ctx.stream != nullptr && (tp.size == 1 || tp.comm != nullptr),
               "{} needs a pipeline stage (strata.parallel.pipeline > 1) on a device stream", what);
}

void Decoder::stage_forward(const DecoderRuntime& rt, ParamProvider& provider, const std::int32_t* tokens,
                            std::int64_t batch, std::int64_t seq, const void* x_in, void* y_out) {
  check_stage_call(rt, "stage_forward");
  const PipelineStage& ps = options_.pipeline;
  if (ps.last()) return;  // Note [Stage re-materialization]: its forward runs in its backward
  const ModelConfig& c = config_;
  if (ps.first()) check_tokens(c, tokens, tokens, batch, seq);
  Workspace& ws = workspace(rt, batch, seq, /*training=*/true);
  Stream* stream = rt.ctx.stream;
  if (ps.first()) copy_tokens(stream, ws.tokens, tokens, batch * seq);
  STRATA_CHECK(ps.first() == (x_in == nullptr) && y_out != nullptr, "stage {} forward: input {}, output {}", ps.rank,
               x_in, y_out);
  BorrowedBuffers borrowed;
  if (!ps.first()) borrowed.lend(ws.x.front(), x_in);
  borrowed.lend(ws.x.back(), y_out);
  const BlockPass pass{{c, rt.ctx, batch, seq, layout_.tiling.chunks, options_.tensor, ws.parts}};
  ProviderChain chain(provider, layout_, stage_local_, true, tensor_layout_.get());
  // One set of block activations suffices: the backward recomputes them.
  const ModelPass m{c, layout_, rt.ctx, *chain.top, ws, pass, batch, seq, true, false, ps};
  m.forward_blocks();
}

LossSum Decoder::stage_backward(const DecoderRuntime& rt, ParamProvider& provider, const std::int32_t* tokens,
                                const std::int32_t* targets, std::int64_t batch, std::int64_t seq, float grad_scale,
                                const void* x_in, void* grad, const StageTied& tied) {
  check_stage_call(rt, "stage_backward");
  const PipelineStage& ps = options_.pipeline;
  const ModelConfig& c = config_;
  check_tokens(c, tokens, targets, batch, seq);
  const std::int64_t n = batch * seq;
  Workspace& ws = workspace(rt, batch, seq, /*training=*/true);
  Stream* stream = rt.ctx.stream;
  const bool tied_split = tied_across_stages();
  if (ps.first()) copy_tokens(stream, ws.tokens, tokens, n);
  if (ps.last() || (tied_split && ps.first())) copy_tokens(stream, ws.targets, targets, n);
  STRATA_CHECK(ps.first() == (x_in == nullptr) && grad != nullptr, "stage {} backward: input {}, gradient {}", ps.rank,
               x_in, grad);
  STRATA_CHECK(!tied_split || (ps.first() ? tied.head_norm_in != nullptr
                                          : !ps.last() || (tied.head_norm_out != nullptr && tied.wte != nullptr)),
               "stage {} of a tied embedding across stages without its buffers", ps.rank);
  BorrowedBuffers borrowed;
  if (!ps.first()) borrowed.lend(ws.x.front(), x_in);
  borrowed.lend(ws.dres, grad);
  if (tied_split && ps.first()) borrowed.lend(ws.lnf_out, tied.head_norm_in);
  const BlockPass pass{{c, rt.ctx, batch, seq, layout_.tiling.chunks, options_.tensor, ws.parts}};
  ProviderChain chain(provider, layout_, stage_local_, true, tensor_layout_.get());
  const bool keep_all = options_.checkpointing == Checkpointing::Off;
  ModelPass m{c, layout_, rt.ctx, *chain.top, ws, pass, batch, seq, true, keep_all, ps};
  if (tied_split) {
    m.tied_wte = ps.last() ? tied.wte : nullptr;
    m.recompute_tied_head = ps.first();
    m.tied_grad_scale = grad_scale;
  }
  m.forward_blocks();
  if (ps.last()) m.run_head(grad_scale);
  if (tied_split && ps.last()) {
    stream->copy_d2d(tied.head_norm_out, ws.lnf_out, static_cast<std::size_t>(n * c.d_model) * dtype_bytes(c.dtype));
  }
  m.backward_blocks();
  return ps.last() ? sum_losses(stream, ws, targets, n) : LossSum{};
}

bool Decoder::tied_across_stages() const {
  return options_.pipeline.split() && config_.arch == Architecture::Gpt2;
}

std::size_t Decoder::tied_embedding_elems() const {
  const TensorParallel& tp = options_.tensor;
  return static_cast<std::size_t>(vocab_rows(config_, tp.size, tp.rank).rows() * config_.d_model);
}

void Decoder::share_tied_embedding(const DecoderRuntime& rt, ParamProvider& provider, Stream* send_stream, void* copy) {
  check_stage_call(rt, "share_tied_embedding");
  const PipelineStage& ps = options_.pipeline;
  STRATA_CHECK(tied_across_stages(), "share_tied_embedding without a tied embedding across stages");
  Stream& compute = *rt.ctx.stream;
  const std::size_t elems = tied_embedding_elems();
  if (ps.last()) {
    STRATA_CHECK(copy != nullptr, "the last stage needs a buffer for the tied embedding");
    ps.comm->recv(copy, elems, config_.dtype, 0, compute);
    return;
  }
  if (!ps.first()) return;
  STRATA_CHECK(send_stream != nullptr, "the first stage needs a stream to send the tied embedding on");
  ProviderChain chain(provider, layout_, stage_local_, true, tensor_layout_.get());
  const GroupViews w = chain.top->acquire_params(layout_.embedding, ParamPhase::Forward, &compute);
  auto ready = rt.device->create_event();
  compute.record(*ready);
  send_stream->wait(*ready);
  ps.comm->send(w[embedding_group::kWte], elems, config_.dtype, ps.size - 1, *send_stream);
  // The weights may stay gathered (stage 3) and be freed later after the compute stream only: the
  // compute stream waits for the send before they are released there.
  auto sent = rt.device->create_event();
  send_stream->record(*sent);
  compute.wait(*sent);
  chain.top->release_params(layout_.embedding, &compute);
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
