// The decoders' passes in tensor-slice mode (DecoderOptions::tensor with slices > 1;
// models/tensor_parallel.h): the column- and row-parallel stages of a block and the
// vocabulary-parallel head and cross-entropy, each split sum taken in S fixed slices on the
// deterministic tree (Note [Tensor slices] in models/tensor_parallel.h). models/decoder_pass.h calls these where the
// plain decoder runs its chunked linears (Note [Tile-invariant linear layers] in models/tiling.h); internal to models/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "plan/param_provider.h"
#include "models/kernels/ops.h"
#include "models/model_config.h"
#include "models/tensor_parallel.h"
#include "models/tiling.h"

namespace strata::models {

// A stage linear's output (forward) or output gradient (backward): pointer and row stride.
struct StageIo {
  void* p;
  std::int64_t ld;
};

// The head's buffers of one micro-batch (the decoder's workspace).
struct SlicedHead {
  const std::int32_t* targets;
  void* lnf_out;  // [rows, d_model]
  void* logits;   // [rows, this rank's vocabulary rows]; dlogits after cross_entropy in training
  float* losses;
  void* dln;  // d(lnf_out)
  float *ce_max, *ce_target;
  double *ce_sums, *ce_all;
};

struct SlicedPass {
  const ModelConfig& c;
  const KernelContext& ctx;
  std::int64_t batch, seq, chunks;
  const TensorParallel& tp;
  const std::vector<void*>& parts;  // partial sums 1..L-1 of one [rows, d_model] sum
  // See Note [Sequence parallelism] in models/tensor_parallel.h.
  // The rank's rows of one [rows, d_model] activation (the final
  // norm's output before its all-gather, a sum reduce-scattered). Unused when the rows are not split.
  void* own = nullptr;

  std::int64_t rows() const { return batch * seq; }
  // The rows of the residual stream this rank holds: all of them unless they are split.
  std::int64_t own_rows() const { return tp.split_rows() ? rows() / tp.size : rows(); }
  // This tensor rank's heads, KV heads (one, shared, when T > K: Note [Replicated KV heads] in
  // models/tensor_parallel.h) and MLP columns (all of them at T = 1).
  std::int64_t heads() const { return c.n_heads / tp.size; }
  std::int64_t kv_heads() const { return std::max<std::int64_t>(1, c.n_kv_heads / tp.size); }
  std::int64_t ffn() const { return c.ffn_hidden / tp.size; }
  // See Note [Replicated KV heads] in models/tensor_parallel.h.
  // The attention backward runs per slice with its own dK|dV partial.
  bool kv_pieces() const { return tp.sliced() && models::kv_pieces(c, tp.slices); }

  // A column-parallel linear of a stage: the whole linear has `out` rows of `in`; this rank holds
  // rows [held, held + held_rows) of them (whole KV heads where they are replicated), at row `row0`
  // of its tensor (and bias), its output at column `col0` of the stage's output buffer. `kv`: the
  // linear's output gradient is a KV head's dK (or, kv_v, dV) from KvGrads under kv_pieces.
  struct ColumnLinear {
    std::size_t weight, bias;
    std::int64_t row0, out, in, col0;
    std::int64_t held = 0, held_rows = 0;
    bool kv = false, kv_v = false;
  };
  // Where each local KV head's dK|dV ([rows, 2 head_dim], dK in the first head_dim columns) is.
  struct KvGrads {
    void* head0;
    std::int64_t head_stride;  // elements from one local KV head to the next
  };
  // A row-parallel linear: d_model rows of K whole columns, this rank holding K / T of them.
  struct RowLinear {
    std::size_t weight, bias;
    std::int64_t K;
  };
  static bool row_parallel(BlockStage stage) { return stage == BlockStage::AttnOut || stage == BlockStage::MlpOut; }
  std::vector<ColumnLinear> column_linears(BlockStage stage) const;
  RowLinear row_linear(BlockStage stage) const;

  // Local slice l of this rank as a range of [0, n): global slice first_slice + l of S.
  RowRange slice_of(std::int64_t n, std::int64_t l) const {
    const std::int64_t s = tp.first_slice() + l;
    return {s * n / tp.slices, (s + 1) * n / tp.slices};
  }
  // The first row of this rank's share of n whole rows (or columns).
  std::int64_t rank_begin(std::int64_t n) const { return tp.rank * n / tp.size; }
  void* part(void* dest, std::int64_t l) const { return l == 0 ? dest : parts[static_cast<std::size_t>(l - 1)]; }

  // p[rows, cols] (row stride ld) = 0, and y[rows, cols] += bias: a matmul with k = 0.
  void zero_rows(void* p, std::int64_t cols, std::int64_t ld) const;
  void add_bias(void* y, std::int64_t n, std::int64_t cols, std::int64_t ld, const void* bias) const;
  // dest (partial 0, [rows, count / rows] dense) = the pairwise tree over this rank's partials,
  // then over the tensor ranks (their subtrees: the same tree over all S slices). Returns where the
  // sum is: dest, or under Note [Sequence parallelism] in models/tensor_parallel.h `own`, holding this rank's rows of
  // it.
  void* reduce_partials(void* dest, std::int64_t count) const;
  // all ([rows, count / rows]) summed over the tensor group: in place, or this rank's rows of the
  // sum into `mine` when the rows are split (returned).
  void* sum_over_ranks(void* all, void* mine, std::int64_t count) const;
  // See Note [Sequence parallelism] in models/tensor_parallel.h.
  // Every rank's rows of `mine` ([own_rows, d_model]) gathered into
  // `all`, returned; `mine` itself when the rows are not split.
  void* gather_rows(void* mine, void* all) const;
  // The architecture's norm (GPT-2: layer norm with bias; LLaMA: RMS norm, no bias, no mean) of
  // this rank's rows of x into `mine`; returns every row of it (gathered into `all` when the rows
  // are split, else `mine` itself).
  void* norm_forward(const void* x, const void* w, const void* b, void* mine, float* mean, float* rstd,
                     void* all) const;
  // dx (this rank's rows; + dx with acc) = the norm's input gradient; dw (and db) += the weight's
  // (bias's) gradient over every row in row order: with split rows, the tensor ranks' in rank order.
  void norm_backward(const void* dout, const void* x, const void* w, const float* mean, const float* rstd, void* dx,
                     void* dw, void* db, Accumulate acc) const;

  // A block's stages. `w` and `gw` are the block group's weights and gradients in the untiled
  // tensor order (models/decoder_params.h). Column-parallel outputs are columns of the first
  // output's buffer (ColumnLinear::col0); a column-parallel input gradient is dense [rows, d_model].
  void column_forward(const GroupViews& w, BlockStage stage, const void* x, std::int64_t ldx, StageIo y) const;
  // Returns where the summed input gradient is (reduce_partials).
  void* column_backward(const GroupViews& w, const GroupViews& gw, BlockStage stage, const void* x, std::int64_t ldx,
                        StageIo dy, void* dx, const KvGrads* kv = nullptr) const;
  // See Note [Replicated KV heads] in models/tensor_parallel.h.
  // The attention backward of this rank's heads (`shape`), slice by
  // slice: dq into dq, the KV heads' dK|dV summed on the tree into the returned places (kv_parts,
  // kv_all: the workspace's).
  KvGrads attention_backward_pieces(const AttentionShape& shape, const void* q, const void* k, const void* v,
                                    const void* out, const float* lse, const void* dout, void* dq, void* kv_parts,
                                    void* kv_all) const;
  // Returns where the summed output (with its bias) is (reduce_partials).
  void* row_forward(const GroupViews& w, BlockStage stage, const void* x, std::int64_t ldx, StageIo y) const;
  void row_backward(const GroupViews& w, const GroupViews& gw, BlockStage stage, const void* x, std::int64_t ldx,
                    StageIo dy, void* dx, std::int64_t lddx) const;

  // The head: the logits of this rank's vocabulary rows, slice by slice; the vocabulary-parallel
  // cross-entropy (Note [Vocabulary-parallel cross-entropy] in models/tensor_parallel.h); d(lnf_out) over the
  // vocabulary slices (and, untied, head_dw += the head weight's gradient); GPT-2's tied head gradient of sequence b.
  void logits(const void* head_w, const SlicedHead& h) const;
  void cross_entropy(const SlicedHead& h, bool training, float grad_scale) const;
  // Returns where d(lnf_out) is (reduce_partials).
  void* head_backward(const void* head_w, void* head_dw, const SlicedHead& h) const;
  void tied_head_grad(std::int64_t b, void* dwte, const SlicedHead& h) const;

 private:
  struct HeadShape {
    std::int64_t n, C, V, Vt;
    RowRange vocab;  // this rank's rows of the vocabulary
  };
  HeadShape head_shape() const;
};

}  // namespace strata::models
