// The decoders' passes in tensor-slice mode (DecoderOptions::tensor with slices > 1;
// models/tensor_parallel.h): the column- and row-parallel stages of a block and the
// vocabulary-parallel head and cross-entropy, each split sum taken in S fixed slices on the
// deterministic tree (Note [Tensor slices]). models/decoder_pass.h calls these where the plain decoder
// runs its chunked linears (Note [Tile-invariant linear layers]); internal to models/.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/param_provider.h"
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

  std::int64_t rows() const { return batch * seq; }
  // This tensor rank's heads, KV heads and MLP columns (all of them at T = 1).
  std::int64_t heads() const { return c.n_heads / tp.size; }
  std::int64_t kv_heads() const { return c.n_kv_heads / tp.size; }
  std::int64_t ffn() const { return c.ffn_hidden / tp.size; }

  // A column-parallel linear of a stage: the whole linear has `out` rows of `in`; this rank's rows
  // start at row `row0` of its tensor (and bias), and its output at column `col0` of the stage's
  // output buffer.
  struct ColumnLinear {
    std::size_t weight, bias;
    std::int64_t row0, out, in, col0;
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
  void add_bias(void* y, std::int64_t cols, std::int64_t ld, const void* bias) const;
  // dest (partial 0, [rows, count / rows] dense) = the pairwise tree over this rank's partials,
  // then over the tensor ranks (their subtrees: the same tree over all S slices).
  void reduce_partials(void* dest, std::int64_t count) const;

  // A block's stages. `w` and `gw` are the block group's weights and gradients in the untiled
  // tensor order (models/decoder_params.h). Column-parallel outputs are columns of the first
  // output's buffer (ColumnLinear::col0); a column-parallel input gradient is dense [rows, d_model].
  void column_forward(const GroupViews& w, BlockStage stage, const void* x, std::int64_t ldx, StageIo y) const;
  void column_backward(const GroupViews& w, const GroupViews& gw, BlockStage stage, const void* x, std::int64_t ldx,
                       StageIo dy, void* dx) const;
  void row_forward(const GroupViews& w, BlockStage stage, const void* x, std::int64_t ldx, StageIo y) const;
  void row_backward(const GroupViews& w, const GroupViews& gw, BlockStage stage, const void* x, std::int64_t ldx,
                    StageIo dy, void* dx, std::int64_t lddx) const;

  // The head: the logits of this rank's vocabulary rows, slice by slice; the vocabulary-parallel
  // cross-entropy (Note [Vocabulary-parallel cross-entropy]); d(lnf_out) over the vocabulary slices
  // (and, untied, head_dw += the head weight's gradient); GPT-2's tied head gradient of sequence b.
  void logits(const void* head_w, const SlicedHead& h) const;
  void cross_entropy(const SlicedHead& h, bool training, float grad_scale) const;
  void head_backward(const void* head_w, void* head_dw, const SlicedHead& h) const;
  void tied_head_grad(std::int64_t b, void* dwte, const SlicedHead& h) const;

 private:
  struct HeadShape {
    std::int64_t n, C, V, Vt;
    RowRange vocab;  // this rank's rows of the vocabulary
  };
  HeadShape head_shape() const;
};

}  // namespace strata::models
