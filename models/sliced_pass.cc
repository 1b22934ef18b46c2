// The tensor-sliced passes of the decoders' linear layers and head (see models/sliced_pass.h).
#include "models/sliced_pass.h"

#include "core/error.h"
#include "comm/communicator.h"
#include "models/decoder_params.h"

namespace strata::models {

namespace {

const void* at(const void* p, std::int64_t elems, DType dt) {
  return static_cast<const char*>(p) + static_cast<std::size_t>(elems) * dtype_bytes(dt);
}
void* at(void* p, std::int64_t elems, DType dt) {
  return static_cast<char*>(p) + static_cast<std::size_t>(elems) * dtype_bytes(dt);
}

}  // namespace

SlicedPass::HeadShape SlicedPass::head_shape() const {
  const RowRange vocab = vocab_rows(c, tp.size, tp.rank);
  return {rows(), c.d_model, c.vocab_size, vocab.rows(), vocab};
}

std::vector<SlicedPass::ColumnLinear> SlicedPass::column_linears(BlockStage stage) const {
  const std::int64_t C = c.d_model, hd = c.head_dim(), T = tp.size;
  std::vector<ColumnLinear> v;
  if (c.arch == Architecture::Gpt2) {
    using namespace gpt2_block;
    if (stage == BlockStage::AttnIn) {  // q, k and v: the rank's rows of each third of attn.qkv
      for (std::int64_t k = 0; k < 3; ++k) v.push_back({kQkvW, kQkvB, k * C / T, C, C, k * C / T});
    } else {
      v.push_back({kFcW, kFcB, 0, c.ffn_hidden, C, 0});
    }
  } else {
    using namespace llama_block;
    if (stage == BlockStage::AttnIn) {
      const bool b = c.qkv_bias;
      v = {{kQ, b ? kQBias : kNoBias, 0, c.n_heads * hd, C, 0},
           {kK, b ? kKBias : kNoBias, 0, c.n_kv_heads * hd, C, heads() * hd},
           {kV, b ? kVBias : kNoBias, 0, c.n_kv_heads * hd, C, (heads() + kv_heads()) * hd}};
    } else {
      v = {{kGate, kNoBias, 0, c.ffn_hidden, C, 0}, {kUp, kNoBias, 0, c.ffn_hidden, C, ffn()}};
    }
  }
  const int r = kv_replicas(c, tp.size);
  for (ColumnLinear& lin : v) {
    lin.held = rank_begin(lin.out);
    lin.held_rows = lin.out / T;
    const bool kv = c.arch == Architecture::Llama && stage == BlockStage::AttnIn && lin.weight != llama_block::kQ;
    if (kv && r > 1) {  // Note [Replicated KV heads] in models/tensor_parallel.h: the whole KV head of the rank's queries
      lin.held = tp.rank / r * hd;
      lin.held_rows = hd;
    }
    lin.kv = kv && kv_pieces();
    lin.kv_v = lin.kv && lin.weight == llama_block::kV;
  }
  return v;
}

SlicedPass::RowLinear SlicedPass::row_linear(BlockStage stage) const {
  const std::int64_t K = stage == BlockStage::AttnOut ? c.n_heads * c.head_dim() : c.ffn_hidden;
  if (c.arch == Architecture::Gpt2) {
    using namespace gpt2_block;
    return stage == BlockStage::AttnOut ? RowLinear{kAttnProjW, kAttnProjB, K} : RowLinear{kMlpProjW, kMlpProjB, K};
  }
  using namespace llama_block;
  return {stage == BlockStage::AttnOut ? kO : kDown, kNoBias, K};
}

void SlicedPass::zero_rows(void* p, std::int64_t cols, std::int64_t ld) const {
  MatmulArgs z{c.dtype, Trans::No, Trans::No, rows(), cols, 0, p, 1, 0, p, 1, 0, p, ld, 0, 1};
  matmul(ctx, z);
}
void SlicedPass::add_bias(void* y, std::int64_t n, std::int64_t cols, std::int64_t ld, const void* bias) const {
  MatmulArgs z{c.dtype, Trans::No, Trans::No, n, cols, 0, y, 1, 0, y, 1, 0, y, ld, 0, 1};
  z.bias = bias;
  z.beta = 1.0f;
  matmul(ctx, z);
}

void* SlicedPass::reduce_partials(void* dest, std::int64_t count) const {
  const std::int64_t L = tp.local_slices();
  for (std::int64_t stride = 1; stride < L; stride *= 2) {
    for (std::int64_t i = 0; i + stride < L; i += 2 * stride) {
      residual_add(ctx, c.dtype, part(dest, i), part(dest, i + stride), part(dest, i), count);
    }
  }
  return sum_over_ranks(dest, own, count);
}

void* SlicedPass::sum_over_ranks(void* all, void* mine, std::int64_t count) const {
  if (tp.size == 1) return all;
  if (!tp.split_rows()) {
    tp.comm->all_reduce(all, all, static_cast<std::size_t>(count), c.dtype, ReduceOp::Sum, *ctx.stream);
    return all;
  }
  STRATA_CHECK(mine != nullptr && rows() % tp.size == 0 && count % rows() == 0,
               "a sum of {} values in {} rows split by rows over {} ranks", count, rows(), tp.size);
  tp.comm->reduce_scatter(all, mine, static_cast<std::size_t>(count / tp.size), c.dtype, ReduceOp::Sum, *ctx.stream);
  return mine;
}

void* SlicedPass::gather_rows(void* mine, void* all) const {
  if (!tp.split_rows()) return mine;
  STRATA_CHECK(all != nullptr && rows() % tp.size == 0, "gathering {} rows from {} ranks into {}", rows(), tp.size,
               all);
  tp.comm->all_gather(mine, all, static_cast<std::size_t>(own_rows() * c.d_model), c.dtype, *ctx.stream);
  return all;
}

void* SlicedPass::norm_forward(const void* x, const void* w, const void* b, void* mine, float* mean, float* rstd,
                               void* all) const {
  if (c.arch == Architecture::Gpt2) {
    layernorm_forward(ctx, c.dtype, x, w, b, mine, mean, rstd, own_rows(), c.d_model, c.norm_eps);
  } else {
    rmsnorm_forward(ctx, c.dtype, x, w, mine, rstd, own_rows(), c.d_model, c.norm_eps);
  }
  return gather_rows(mine, all);
}

void SlicedPass::norm_backward(const void* dout, const void* x, const void* w, const float* mean, const float* rstd,
                               void* dx, void* dw, void* db, Accumulate acc) const {
  const bool gpt2 = c.arch == Architecture::Gpt2;
  const auto kernel = [&] {
    if (gpt2) {
      layernorm_backward(ctx, c.dtype, dout, x, w, mean, rstd, dx, dw, db, own_rows(), c.d_model, acc);
    } else {
      rmsnorm_backward(ctx, c.dtype, dout, x, w, rstd, dx, dw, own_rows(), c.d_model, acc);
    }
  };
  if (!tp.split_rows()) {
    kernel();
    return;
  }
  // See Note [Sequence parallelism] in models/tensor_parallel.h.
  // The weight's gradient runs through the ranks' rows in rank order,
  // or in fast mode is the all-reduce of each rank's part (the first rank's on the sum so far).
  std::vector<void*> sums{dw};
  if (gpt2) sums.push_back(db);
  const auto C = static_cast<std::size_t>(c.d_model);
  Stream& s = *ctx.stream;
  if (!tp.ordered_norm_grads) {
    if (tp.rank > 0) {
      for (void* p : sums) s.memset(p, 0, C * dtype_bytes(c.dtype));
    }
    kernel();
    for (void* p : sums) tp.comm->all_reduce(p, p, C, c.dtype, ReduceOp::Sum, s);
    return;
  }
  if (tp.rank > 0) {
    for (void* p : sums) tp.comm->recv(p, C, c.dtype, tp.rank - 1, s);
  }
  kernel();
  if (tp.rank + 1 < tp.size) {
    for (void* p : sums) tp.comm->send(p, C, c.dtype, tp.rank + 1, s);
  }
  for (void* p : sums) tp.comm->broadcast(p, C, c.dtype, tp.size - 1, s);
}

// Column-parallel forward: this rank's rows of every linear, chunk by chunk. No sum is split.
void SlicedPass::column_forward(const GroupViews& w, BlockStage stage, const void* x, std::int64_t ldx,
                                StageIo y) const {
  const DType dt = c.dtype;
  for (const ColumnLinear& lin : column_linears(stage)) {
    for (std::int64_t ch = lin.held * chunks / lin.out; ch < (lin.held + lin.held_rows) * chunks / lin.out; ++ch) {
      const RowRange r = chunk_rows(lin.out, chunks, ch);
      if (r.rows() == 0) continue;
      const std::int64_t local = r.begin - lin.held;
      MatmulArgs a{dt, Trans::No, Trans::Yes, seq, r.rows(), lin.in, x, ldx, seq * ldx,
                   at(w[lin.weight], (lin.row0 + local) * lin.in, dt), lin.in, 0,
                   at(y.p, lin.col0 + local, dt), y.ld, seq * y.ld, batch};
      a.bias = lin.bias == kNoBias ? nullptr : at(w[lin.bias], lin.row0 + local, dt);
      matmul(ctx, a);
    }
  }
}

// Column-parallel backward: dx (dense [rows, in]) is split over output rows: one partial per
// slice (its chunks in ascending order, the linears interleaved chunk-major), then the tree. The
// weight and bias gradients, one matmul per chunk of the rows the rank holds, follow.
void* SlicedPass::column_backward(const GroupViews& w, const GroupViews& gw, BlockStage stage, const void* x,
                                  std::int64_t ldx, StageIo dy, void* dx, const KvGrads* kv) const {
  const DType dt = c.dtype;
  const std::vector<ColumnLinear> lins = column_linears(stage);
  const std::int64_t in = lins.front().in, hd = c.head_dim();
  const auto dy_of = [&](const ColumnLinear& lin, std::int64_t local) -> StageIo {
    if (!lin.kv) return {at(dy.p, lin.col0 + local, dt), dy.ld};
    STRATA_CHECK(kv != nullptr, "the KV heads' gradients are not given");
    return {at(kv->head0, local / hd * kv->head_stride + (lin.kv_v ? hd : 0) + local % hd, dt), 2 * hd};
  };
  const std::int64_t per_slice = chunks / tp.slices;
  for (std::int64_t l = 0; l < tp.local_slices(); ++l) {
    void* p = part(dx, l);
    bool started = false;
    const std::int64_t s = tp.first_slice() + l;
    for (std::int64_t ch = s * per_slice; ch < (s + 1) * per_slice; ++ch) {
      for (const ColumnLinear& lin : lins) {
        const RowRange r = chunk_rows(lin.out, chunks, ch);
        if (r.rows() == 0) continue;
        const std::int64_t local = r.begin - lin.held;
        const StageIo d_y = dy_of(lin, local);
        MatmulArgs d{dt, Trans::No, Trans::No, seq, in, r.rows(), d_y.p, d_y.ld, seq * d_y.ld,
                     at(w[lin.weight], (lin.row0 + local) * in, dt), in, 0, p, in, seq * in, batch};
        d.beta = started ? 1.0f : 0.0f;
        started = true;
        matmul(ctx, d);
      }
    }
    if (!started) zero_rows(p, in, in);
  }
  for (const ColumnLinear& lin : lins) {
    for (std::int64_t ch = lin.held * chunks / lin.out; ch < (lin.held + lin.held_rows) * chunks / lin.out; ++ch) {
      const RowRange r = chunk_rows(lin.out, chunks, ch);
      if (r.rows() == 0) continue;
      const std::int64_t local = r.begin - lin.held, row = lin.row0 + local;
      const StageIo d_y = dy_of(lin, local);
      MatmulArgs g{dt, Trans::Yes, Trans::No, r.rows(), in, seq, d_y.p, d_y.ld, seq * d_y.ld, x, ldx, seq * ldx,
                   at(gw[lin.weight], row * in, dt), in, 0, batch};
      g.beta = 1.0f;
      matmul(ctx, g);
      if (lin.bias != kNoBias) bias_grad(ctx, dt, d_y.p, batch * seq, r.rows(), d_y.ld, at(gw[lin.bias], row, dt));
    }
  }
  return reduce_partials(dx, rows() * in);
}

SlicedPass::KvGrads SlicedPass::attention_backward_pieces(const AttentionShape& shape, const void* q, const void* k,
                                                          const void* v, const void* out, const float* lse,
                                                          const void* dout, void* dq, void* kv_parts,
                                                          void* kv_all) const {
  const DType dt = c.dtype;
  const std::int64_t hd = c.head_dim(), L = tp.local_slices(), per_piece = c.n_heads / tp.slices;
  const std::int64_t pieces_per_kv = L / kv_heads();  // this rank's slices of each of its KV heads
  const std::int64_t piece = rows() * 2 * hd;
  STRATA_CHECK(kv_pieces() && shape.q_heads == L * per_piece && shape.kv_heads == kv_heads(),
               "attention in {} slices of {} heads for {} heads, {} KV heads", L, per_piece, shape.q_heads,
               shape.kv_heads);
  for (std::int64_t l = 0; l < L; ++l) {  // slice l: query heads [l per_piece, (l + 1) per_piece), all of one KV head
    const std::int64_t h0 = l * per_piece, g = l / pieces_per_kv;
    AttentionShape s = shape;
    s.q_heads = per_piece;
    s.kv_heads = 1;
    s.lse_heads = shape.lse_heads_or_q();
    s.dkv_row_stride = 2 * hd;
    void* dkv = at(kv_parts, l * piece, dt);
    attention_backward(ctx, dt, s, at(q, h0 * hd, dt), at(k, g * hd, dt), at(v, g * hd, dt), at(out, h0 * hd, dt),
                       lse + h0 * shape.seq, at(dout, h0 * hd, dt), at(dq, h0 * hd, dt), dkv, at(dkv, hd, dt));
  }
  // Each KV head's slices on the pairwise tree (Note [Deterministic reduction] in comm/communicator.h), into its first.
  const auto tree = [&](void* base, std::int64_t first, std::int64_t n) {
    for (std::int64_t stride = 1; stride < n; stride *= 2) {
      for (std::int64_t i = 0; i + stride < n; i += 2 * stride) {
        void* a = at(base, (first + i) * piece, dt);
        residual_add(ctx, dt, a, at(base, (first + i + stride) * piece, dt), a, piece);
      }
    }
  };
  for (std::int64_t g = 0; g < kv_heads(); ++g) tree(kv_parts, g * pieces_per_kv, pieces_per_kv);
  const int r = kv_replicas(c, tp.size);
  if (r == 1) return {kv_parts, pieces_per_kv * piece};
  // The KV head's other slices are on the other r - 1 ranks of it: their subtrees, on the rest of the tree.
  tp.comm->all_gather(kv_parts, kv_all, static_cast<std::size_t>(piece), dt, *ctx.stream);
  const std::int64_t first = tp.rank / r * r;
  tree(kv_all, first, r);
  return {at(kv_all, first * piece, dt), 0};
}

// Row-parallel forward: y (dense [rows, d_model]) is split over the input columns: one partial
// per slice of columns (each chunk of output rows a matmul), the tree, then the bias.
void* SlicedPass::row_forward(const GroupViews& w, BlockStage stage, const void* x, std::int64_t ldx, StageIo y) const {
  const DType dt = c.dtype;
  const RowLinear lin = row_linear(stage);
  const std::int64_t out = c.d_model, Kt = lin.K / tp.size;
  STRATA_CHECK(y.ld == out, "row-parallel output of {} columns at row stride {}", out, y.ld);
  const void* wt = w[lin.weight];
  for (std::int64_t l = 0; l < tp.local_slices(); ++l) {
    void* p = part(y.p, l);
    const RowRange cols = slice_of(lin.K, l);
    if (cols.rows() == 0) {
      zero_rows(p, out, out);
      continue;
    }
    const std::int64_t c0 = cols.begin - rank_begin(lin.K);
    for (std::int64_t ch = 0; ch < chunks; ++ch) {
      const RowRange r = chunk_rows(out, chunks, ch);
      if (r.rows() == 0) continue;
      MatmulArgs a{dt, Trans::No, Trans::Yes, seq, r.rows(), cols.rows(), at(x, c0, dt), ldx, seq * ldx,
                   at(wt, r.begin * Kt + c0, dt), Kt, 0, at(p, r.begin, dt), out, seq * out, batch};
      matmul(ctx, a);
    }
  }
  void* sum = reduce_partials(y.p, rows() * out);
  if (lin.bias != kNoBias) add_bias(sum, own_rows(), out, out, w[lin.bias]);
  return sum;
}

// Row-parallel backward: no sum is split; dx's columns and dW's are computed per slice so each
// matmul has the same shape for every T.
void SlicedPass::row_backward(const GroupViews& w, const GroupViews& gw, BlockStage stage, const void* x,
                              std::int64_t ldx, StageIo dy, void* dx, std::int64_t lddx) const {
  const DType dt = c.dtype;
  const RowLinear lin = row_linear(stage);
  const std::int64_t out = c.d_model, Kt = lin.K / tp.size;
  const void* wt = w[lin.weight];
  void* dw = gw[lin.weight];
  for (std::int64_t l = 0; l < tp.local_slices(); ++l) {
    const RowRange cols = slice_of(lin.K, l);
    if (cols.rows() == 0) continue;
    const std::int64_t c0 = cols.begin - rank_begin(lin.K), cn = cols.rows();
    bool started = false;
    for (std::int64_t ch = 0; ch < chunks; ++ch) {
      const RowRange r = chunk_rows(out, chunks, ch);
      if (r.rows() == 0) continue;
      const void* dyr = at(dy.p, r.begin, dt);
      MatmulArgs d{dt, Trans::No, Trans::No, seq, cn, r.rows(), dyr, dy.ld, seq * dy.ld, at(wt, r.begin * Kt + c0, dt),
                   Kt, 0, at(dx, c0, dt), lddx, seq * lddx, batch};
      d.beta = started ? 1.0f : 0.0f;
      started = true;
      matmul(ctx, d);
      MatmulArgs g{dt, Trans::Yes, Trans::No, r.rows(), cn, seq, dyr, dy.ld, seq * dy.ld, at(x, c0, dt), ldx,
                   seq * ldx, at(dw, r.begin * Kt + c0, dt), Kt, 0, batch};
      g.beta = 1.0f;
      matmul(ctx, g);
    }
    if (!started) zero_rows(at(dx, c0, dt), cn, lddx);
  }
  if (lin.bias == kNoBias) return;
  for (std::int64_t ch = 0; ch < chunks; ++ch) {  // the bias is replicated: every rank sums all of dy
    const RowRange r = chunk_rows(out, chunks, ch);
    if (r.rows() == 0) continue;
    bias_grad(ctx, dt, at(dy.p, r.begin, dt), batch * seq, r.rows(), dy.ld, at(gw[lin.bias], r.begin, dt));
  }
}


void SlicedPass::logits(const void* head_w, const SlicedHead& h) const {
  const HeadShape s = head_shape();
  const DType dt = c.dtype;
  for (std::int64_t l = 0; l < tp.local_slices(); ++l) {
    const RowRange sl = slice_of(s.V, l);
    const std::int64_t b = sl.begin - s.vocab.begin;
    if (sl.rows() == 0) continue;
    MatmulArgs a{dt, Trans::No, Trans::Yes, seq, sl.rows(), s.C, h.lnf_out, s.C, seq * s.C, at(head_w, b * s.C, dt),
                 s.C, 0, at(h.logits, b, dt), s.Vt, seq * s.Vt, batch};
    matmul(ctx, a);
  }
}

void SlicedPass::cross_entropy(const SlicedHead& h, bool training, float grad_scale) const {
  const HeadShape s = head_shape();
  const DType dt = c.dtype;
  const std::int64_t S = tp.slices, L = tp.local_slices(), first = tp.first_slice();
  cross_entropy_row_max(ctx, dt, h.logits, s.n, s.Vt, s.Vt, h.ce_max);
  const auto rows_n = static_cast<std::size_t>(s.n);
  if (tp.size > 1) tp.comm->all_reduce(h.ce_max, h.ce_max, rows_n, DType::F32, ReduceOp::Max, *ctx.stream);
  cross_entropy_slice_sums(ctx, dt, h.logits, h.targets, s.n, s.Vt, s.V, S, first, L, h.ce_max, h.ce_sums, h.ce_target);
  if (tp.size > 1) {
    // The doubles travel as pairs of fp32 words: an all-gather moves bytes and never adds them.
    tp.comm->all_gather(h.ce_sums, h.ce_all, static_cast<std::size_t>(s.n * L * 2), DType::F32, *ctx.stream);
    tp.comm->all_reduce(h.ce_target, h.ce_target, rows_n, DType::F32, ReduceOp::Sum, *ctx.stream);
  }
  cross_entropy_finish(ctx, dt, h.logits, h.targets, h.losses, training ? h.logits : nullptr, s.n, s.Vt, s.V, S, first,
                       L, h.ce_max, tp.size > 1 ? h.ce_all : h.ce_sums, h.ce_target, grad_scale);
}

void* SlicedPass::head_backward(const void* head_w, void* head_dw, const SlicedHead& h) const {
  const HeadShape s = head_shape();
  const DType dt = c.dtype;
  for (std::int64_t l = 0; l < tp.local_slices(); ++l) {
    void* p = part(h.dln, l);
    const RowRange sl = slice_of(s.V, l);
    const std::int64_t b = sl.begin - s.vocab.begin;
    if (sl.rows() == 0) {
      zero_rows(p, s.C, s.C);
      continue;
    }
    MatmulArgs a{dt, Trans::No, Trans::No, seq, s.C, sl.rows(), at(h.logits, b, dt), s.Vt, seq * s.Vt,
                 at(head_w, b * s.C, dt), s.C, 0, p, s.C, seq * s.C, batch};
    matmul(ctx, a);
    if (head_dw != nullptr) {
      MatmulArgs g{dt, Trans::Yes, Trans::No, sl.rows(), s.C, seq, at(h.logits, b, dt), s.Vt, seq * s.Vt,
                   h.lnf_out, s.C, seq * s.C, at(head_dw, b * s.C, dt), s.C, 0, batch};
      g.beta = 1.0f;
      matmul(ctx, g);
    }
  }
  return reduce_partials(h.dln, s.n * s.C);
}

void SlicedPass::tied_head_grad(std::int64_t b, void* dwte, const SlicedHead& h) const {
  const HeadShape s = head_shape();
  const DType dt = c.dtype;
  for (std::int64_t l = 0; l < tp.local_slices(); ++l) {
    const RowRange sl = slice_of(s.V, l);
    const std::int64_t v = sl.begin - s.vocab.begin;
    if (sl.rows() == 0) continue;
    MatmulArgs dw{dt, Trans::Yes, Trans::No, sl.rows(), s.C, seq, at(h.logits, b * seq * s.Vt + v, dt), s.Vt, 0,
                  at(h.lnf_out, b * seq * s.C, dt), s.C, 0, at(dwte, v * s.C, dt), s.C, 0, 1};
    dw.beta = 1.0f;
    matmul(ctx, dw);
  }
}

}  // namespace strata::models
