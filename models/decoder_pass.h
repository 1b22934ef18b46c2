// The passes behind the decoder's entry points (models/decoder.h), shared by the whole-model run
// (models/decoder.cc) and the pipeline stages' (models/decoder_stage.cc): the workspace's buffers,
// one block's forward and backward (BlockPass), one micro-batch through the model or a stage of it
// (ModelPass), and the provider the passes see. Internal to models/; nothing outside includes it.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/host_buffer.h"
#include "models/decoder.h"
#include "models/decoder_params.h"
#include "models/pipeline.h"
#include "models/sliced_pass.h"
#include "models/tensor_parallel.h"

namespace strata::models {

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
  // Note [Stage activations] (models/pipeline.h): a pipeline stage's sets of block inputs and
  // activations, one per micro-batch in flight, swapped into x and acts for its calls. A set's
  // input (on stages after the first) and output are the caller's buffers; with checkpointing its
  // acts are the one shared set.
  std::vector<std::vector<void*>> set_x;
  std::vector<std::vector<BlockActs>> set_acts;
  std::int32_t *tokens = nullptr, *targets = nullptr;
  void *tmp = nullptr, *lnf_out = nullptr, *logits = nullptr;
  float *lnf_mean = nullptr, *lnf_rstd = nullptr, *losses = nullptr;
  void *dres = nullptr, *dln = nullptr, *datt = nullptr, *dqkv = nullptr, *dff_in = nullptr, *dff_act = nullptr;
  // Tensor slices (Note [Tensor slices] in models/tensor_parallel.h): partial sums 1..L-1 of one [rows, d_model] sum
  // (partial 0 is the sum's destination), and the vocabulary-parallel cross-entropy's statistics.
  std::vector<void*> parts;
  // Note [Replicated KV heads] in models/tensor_parallel.h (training, kv_pieces): the S/T slices' [rows, 2 head_dim]
  // dK|dV partials, and the tensor group's subtrees gathered (T > K).
  void *kv_parts = nullptr, *kv_all = nullptr;
  // See Note [Sequence parallelism] in models/tensor_parallel.h.
  // This rank's rows of one activation (SlicedPass::own); the whole
  // one it gathers into or scatters from is tmp.
  void* own_rows = nullptr;
  float *ce_max = nullptr, *ce_target = nullptr;
  double *ce_sums = nullptr, *ce_all = nullptr;
};

namespace decoder_detail {


inline void* at(void* p, std::int64_t elems, DType dt) {
  return static_cast<char*>(p) + static_cast<std::size_t>(elems) * dtype_bytes(dt);
}

// y[B*T, out] (row stride ldy) = x[B*T, in] (ldx) W^T + bias: one matmul per sequence.
inline void linear_forward(const KernelContext& ctx, DType dt, const void* x, std::int64_t ldx, const void* w, const void* bias,
                    void* y, std::int64_t ldy, std::int64_t batch, std::int64_t seq, std::int64_t in, std::int64_t out) {
  MatmulArgs a{dt, Trans::No, Trans::Yes, seq, out, in, x, ldx, seq * ldx, w, in, 0, y, ldy, seq * ldy, batch};
  a.bias = bias;
  matmul(ctx, a);
}

// dx (+)= dy W; dW += dy^T x, summed over sequences in order; dbias += column sums of dy.
inline void linear_backward(const KernelContext& ctx, DType dt, const void* x, std::int64_t ldx, const void* w, const void* dy,
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



inline const void* at(const void* p, std::int64_t elems, DType dt) {
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

  // ys[i][:, rows] = x W_i[rows]^T + b_i[rows], chunk by chunk (Note [Tile-invariant linear layers] in
  // models/tiling.h). Returns where the first output is: ys[0], or a row-parallel sum's rows of this rank (`own`,
  // Note [Sequence parallelism] in models/tensor_parallel.h).
  void* stage_forward(const BlockParams& bp, BlockStage stage, const void* x, std::int64_t ldx,
                      std::initializer_list<StageIo> ys) const {
    if (tp.sliced()) {  // the outputs are columns of the first one's buffer (ColumnLinear::col0)
      if (row_parallel(stage)) return row_forward(bp.w, stage, x, ldx, ys.begin()[0]);
      column_forward(bp.w, stage, x, ldx, ys.begin()[0]);
      return ys.begin()[0].p;
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
    return ys.begin()[0].p;
  }

  // dx (+)= sum_i dy_i W_i, dW_i += dy_i^T x, db_i += column sums of dy_i, chunk by chunk in
  // ascending chunks, the stage's linears interleaved chunk-major (Note [Tile-invariant linear layers] in
  // models/tiling.h). Returns where dx is: dx, or a column-parallel sum's rows of this rank (`own`, Note [Sequence
  // parallelism]).
  void* stage_backward(const BlockParams& bp, BlockStage stage, const void* x, std::int64_t ldx,
                       std::initializer_list<StageIo> dys, void* dx, std::int64_t lddx, Accumulate acc) const {
    if (tp.sliced()) {
      STRATA_CHECK(acc == Accumulate::No, "a sliced stage backward writes its input gradient");
      if (row_parallel(stage)) {
        row_backward(bp.w, bp.g, stage, x, ldx, dys.begin()[0], dx, lddx);
        return dx;
      }
      STRATA_CHECK(lddx == c.d_model, "column-parallel input gradient at row stride {}", lddx);
      return column_backward(bp.w, bp.g, stage, x, ldx, dys.begin()[0], dx);
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
    return dx;
  }

  // x_out = block(x_in), filling `a`. Under Note [Sequence parallelism] in models/tensor_parallel.h x_in, x_out, x_mid,
  // the norms' outputs and statistics are this rank's rows; a norm's output is gathered into tmp for the
  // column-parallel stage that reads every row.
  void forward(const BlockParams& bp, const void* x_in, void* x_out, const Decoder::Workspace::BlockActs& a,
               void* tmp) const {
    const DType dt = c.dtype;
    const std::int64_t C = c.d_model, F = ffn(), n = rows(), mine = own_rows();
    if (c.arch == Architecture::Gpt2) {
      using namespace gpt2_block;
      const void* x1 = norm_forward(x_in, bp.weight(kLn1W), bp.weight(kLn1B), a.norm1, a.mean1, a.rstd1, tmp);
      stage_forward(bp, BlockStage::AttnIn, x1, C, {{a.qkv, qkv_w()}});
    } else {
      using namespace llama_block;
      const void* x1 = norm_forward(x_in, bp.weight(kAttnNorm), nullptr, a.norm1, nullptr, a.rstd1, tmp);
      const std::int64_t hd = c.head_dim();
      stage_forward(bp, BlockStage::AttnIn, x1, C,
                    {{a.qkv, qkv_w()}, {k_of(a.qkv), qkv_w()}, {v_of(a.qkv), qkv_w()}});
      rope(ctx, dt, a.qkv, batch, seq, heads(), hd, qkv_w(), c.rope, RopeDirection::Forward);
      rope(ctx, dt, k_of(a.qkv), batch, seq, kv_heads(), hd, qkv_w(), c.rope, RopeDirection::Forward);
    }
    attention_forward(ctx, dt, attn_shape(), a.qkv, k_of(a.qkv), v_of(a.qkv), a.att, a.lse);
    const void* y = stage_forward(bp, BlockStage::AttnOut, a.att, att_w(), {{tmp, C}});
    residual_add(ctx, dt, x_in, y, a.x_mid, mine * C);
    if (c.arch == Architecture::Gpt2) {
      using namespace gpt2_block;
      const void* x2 = norm_forward(a.x_mid, bp.weight(kLn2W), bp.weight(kLn2B), a.norm2, a.mean2, a.rstd2, tmp);
      stage_forward(bp, BlockStage::MlpIn, x2, C, {{a.ff_in, F}});
      gelu_forward(ctx, dt, a.ff_in, a.ff_act, n * F);
    } else {
      using namespace llama_block;
      const void* x2 = norm_forward(a.x_mid, bp.weight(kMlpNorm), nullptr, a.norm2, nullptr, a.rstd2, tmp);
      stage_forward(bp, BlockStage::MlpIn, x2, C, {{a.ff_in, 2 * F}, {at(a.ff_in, F, dt), 2 * F}});
      swiglu_forward(ctx, dt, a.ff_in, a.ff_act, n, F);
    }
    y = stage_forward(bp, BlockStage::MlpOut, a.ff_act, F, {{tmp, C}});
    residual_add(ctx, dt, a.x_mid, y, x_out, mine * C);
  }

  // dres: dL/d(block output) on entry, dL/d(block input) on exit (this rank's rows of them under
  // Note [Sequence parallelism] in models/tensor_parallel.h; the row-parallel stages read every row, gathered into
  // ws.tmp).
  void backward(const BlockParams& bp, const void* x_in, const Decoder::Workspace::BlockActs& a,
                const Decoder::Workspace& ws) const {
    const DType dt = c.dtype;
    const std::int64_t C = c.d_model, F = ffn(), n = rows();
    const bool gpt2 = c.arch == Architecture::Gpt2;
    void* dy = gather_rows(ws.dres, ws.tmp);
    stage_backward(bp, BlockStage::MlpOut, a.ff_act, F, {{dy, C}}, ws.dff_act, F, Accumulate::No);
    const void* dln = nullptr;
    // The column-parallel stages read every row of their norm's output: gathered again into ws.tmp
    // (free once the row-parallel stage before has read the gathered gradient).
    const void* x2 = nullptr;
    if (gpt2) {
      gelu_backward(ctx, dt, a.ff_in, ws.dff_act, ws.dff_in, n * F);
      x2 = gather_rows(a.norm2, ws.tmp);
      dln = stage_backward(bp, BlockStage::MlpIn, x2, C, {{ws.dff_in, F}}, ws.dln, C, Accumulate::No);
      norm_backward(dln, a.x_mid, bp.weight(gpt2_block::kLn2W), a.mean2, a.rstd2, ws.dres,
                    bp.grad(gpt2_block::kLn2W), bp.grad(gpt2_block::kLn2B), Accumulate::Yes);
    } else {
      swiglu_backward(ctx, dt, a.ff_in, ws.dff_act, ws.dff_in, n, F);
      x2 = gather_rows(a.norm2, ws.tmp);
      dln = stage_backward(bp, BlockStage::MlpIn, x2, C, {{ws.dff_in, 2 * F}, {at(ws.dff_in, F, dt), 2 * F}},
                           ws.dln, C, Accumulate::No);
      norm_backward(dln, a.x_mid, bp.weight(llama_block::kMlpNorm), nullptr, a.rstd2, ws.dres,
                    bp.grad(llama_block::kMlpNorm), nullptr, Accumulate::Yes);
    }
    dy = gather_rows(ws.dres, ws.tmp);
    stage_backward(bp, BlockStage::AttnOut, a.att, att_w(), {{dy, C}}, ws.datt, att_w(), Accumulate::No);
    if (kv_pieces()) {  // Note [Replicated KV heads] in models/tensor_parallel.h: dK and dV summed over the slices, apart from dqkv
      using namespace llama_block;
      const std::int64_t hd = c.head_dim();
      const KvGrads kv = attention_backward_pieces(attn_shape(), a.qkv, k_of(a.qkv), v_of(a.qkv), a.att, a.lse,
                                                   ws.datt, ws.dqkv, ws.kv_parts, ws.kv_all);
      rope(ctx, dt, ws.dqkv, batch, seq, heads(), hd, qkv_w(), c.rope, RopeDirection::Inverse);
      for (std::int64_t g = 0; g < kv_heads(); ++g) {
        rope(ctx, dt, at(kv.head0, g * kv.head_stride, dt), batch, seq, 1, hd, 2 * hd, c.rope,
             RopeDirection::Inverse);
      }
      dln = column_backward(bp.w, bp.g, BlockStage::AttnIn, gather_rows(a.norm1, ws.tmp), C, {ws.dqkv, qkv_w()},
                            ws.dln, &kv);
      norm_backward(dln, x_in, bp.weight(kAttnNorm), nullptr, a.rstd1, ws.dres, bp.grad(kAttnNorm), nullptr,
                    Accumulate::Yes);
      return;
    }
    attention_backward(ctx, dt, attn_shape(), a.qkv, k_of(a.qkv), v_of(a.qkv), a.att, a.lse, ws.datt, ws.dqkv,
                       k_of(ws.dqkv), v_of(ws.dqkv));
    if (gpt2) {
      using namespace gpt2_block;
      dln = stage_backward(bp, BlockStage::AttnIn, gather_rows(a.norm1, ws.tmp), C, {{ws.dqkv, qkv_w()}}, ws.dln, C,
                           Accumulate::No);
      norm_backward(dln, x_in, bp.weight(kLn1W), a.mean1, a.rstd1, ws.dres, bp.grad(kLn1W), bp.grad(kLn1B),
                    Accumulate::Yes);
    } else {
      using namespace llama_block;
      const std::int64_t hd = c.head_dim();
      rope(ctx, dt, ws.dqkv, batch, seq, heads(), hd, qkv_w(), c.rope, RopeDirection::Inverse);
      rope(ctx, dt, k_of(ws.dqkv), batch, seq, kv_heads(), hd, qkv_w(), c.rope, RopeDirection::Inverse);
      dln = stage_backward(bp, BlockStage::AttnIn, gather_rows(a.norm1, ws.tmp), C,
                           {{ws.dqkv, qkv_w()}, {k_of(ws.dqkv), qkv_w()}, {v_of(ws.dqkv), qkv_w()}}, ws.dln, C,
                           Accumulate::No);
      norm_backward(dln, x_in, bp.weight(kAttnNorm), nullptr, a.rstd1, ws.dres, bp.grad(kAttnNorm), nullptr,
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
  // and their gradient (from ws.lnf_out, the last stage's) with this loss-gradient scale. Without
  // stages the scale is the head's: the embedding's backward recomputes sequences 1.. (Note [Head
  // one sequence at a time]).
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
  // Sequence b's logits from ws.lnf_out into ws.logits (one sequence's buffer), its losses, and
  // with_grad their gradient in place (Note [Head one sequence at a time] in models/decoder.h).
  void head_logits(const void* head_w, std::int64_t b, bool with_grad, float grad_scale) const;
  // Backward through the blocks, last first (recomputing a block's forward under checkpointing),
  // then the embedding's (first stage).
  void backward_blocks() const;

  // The head's buffers for the tensor-sliced head (models/sliced_pass.h).
  SlicedHead sliced_head() const {
    return {ws.targets, ws.lnf_out, ws.logits, ws.losses, ws.dln, ws.ce_max, ws.ce_target, ws.ce_sums, ws.ce_all};
  }
};

// The shape and the tokens of a micro-batch, before anything runs (ConfigError naming the token).
void check_tokens(const ModelConfig& c, const std::int32_t* tokens, const std::int32_t* targets, std::int64_t batch,
                  std::int64_t seq);
// The micro-batch's loss: the per-token losses back on the host, summed over counted targets.
LossSum sum_losses(Stream* stream, const Decoder::Workspace& ws, const std::int32_t* targets, std::int64_t n);


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

inline void copy_tokens(Stream* stream, std::int32_t* dst, const std::int32_t* src, std::int64_t n) {
  if (stream == nullptr) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
  } else {
    stream->copy_h2d(dst, src, static_cast<std::size_t>(n) * 4);
  }
}


}  // namespace decoder_detail
}  // namespace strata::models
