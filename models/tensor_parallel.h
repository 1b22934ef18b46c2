// Megatron-style 1D tensor parallelism of the decoders (strata.parallel.tensor = T; issue 17).
//
// The T ranks of a tensor group (plan/parallel_layout.h) each hold a slice of every large weight
// and run every block on the same activations:
//   column-parallel (split by output rows): GPT-2 attn.qkv (the q, k and v rows of the rank's heads)
//     and mlp.fc with their biases; LLaMA attn.q, attn.k, attn.v, mlp.gate, mlp.up. Forward needs
//     no communication; backward all-reduces the input gradient.
//   row-parallel (split by input columns): GPT-2 attn.proj and mlp.proj, LLaMA attn.o and
//     mlp.down. Forward all-reduces the output (the bias, replicated, is added after the sum);
//     backward needs none. So a block all-reduces twice forward and twice backward.
//   vocabulary-parallel: the embedding's rows (and LLaMA's lm_head, GPT-2's tied head) are split by
//     vocabulary; the lookup all-reduces one row per token, and the cross-entropy never gathers the
//     logits (Note [Vocabulary-parallel cross-entropy]).
//   replicated: norms, the row-parallel biases and GPT-2's position embedding. Every rank computes
//     the same gradient for them from the same activations, so they stay equal without messages.
// The engine (ZeRO over the data axis) sees only the rank's slices: its groups are the untiled
// groups with every split tensor cut to its slice, under the whole tensor's name, and the
// replicated tensors of each group in a group of their own (TensorParallelLayout), so the gradient
// norm counts them once across the tensor group.
//
// Note [Tensor slices]: exact mode promises the same bits for any T. A sum that tensor parallelism
// splits across ranks (the row-parallel forward over its input columns, the column-parallel input
// gradient over output rows, the cross-entropy's sum over the vocabulary and the head's input
// gradient) is therefore always computed in S = strata.parallel.tensor_slices fixed slices, each a
// partial of its own, combined on the pairwise tree of Note [Deterministic reduction] in comm/communicator.h
// (comm/communicator.h): a rank sums the S/T slices it holds on a subtree and the tensor group's
// all-reduce adds the ranks' subtrees on the rest of the same tree. Each slice's matmuls have the
// same shapes on every T (a slice is a whole number of the tiling's row chunks, Note [Tile-invariant
// linear layers]), so runs with equal S give the same bits for every T dividing S. S must be a power
// of two dividing strata.tiling.chunks; S = 1 (T = 1) is the plain decoder.
//
// Note [Vocabulary-parallel cross-entropy]: the loss of row r is log(sum_j exp(l_j - m)) + m - l_target
// with m the row's largest logit. Each rank takes the largest of its logits (all-reduce max gives m,
// exactly), the sum of exp(l_j - m) over each of its slices in double, and its target logit (or 0);
// the slice sums are all-gathered (T x rows x S/T doubles, never the logits) and summed on the tree
// in double, and the target logits all-reduced (one value and zeros: exact). Each rank then writes
// its own columns of the logits' gradient. Memory per rank is rows x V/T logits.
//
// Note [Replicated KV heads]: with fewer KV heads K than tensor ranks T (T a multiple of K), each
// rank's query heads share one KV head, and the r = T / K ranks of a KV head each hold its k and v
// rows whole (a physical group "<block>.kv" of its own) and compute its keys and values. Their
// gradient sums over the KV head's query heads, which r ranks now hold, so for equal bits at every
// T the sum is split the same way at every T: whenever S > K (kv_pieces), slice s of the S slices
// is query heads [s H/S, (s+1) H/S), all of KV head s / (S/K); the attention backward runs once per
// slice, each slice's dK and dV a partial of its own (running sums over its query heads, as the
// whole kernel sums), added on the pairwise tree of the KV head's S/K slices: a rank adds its
// slices' subtree, then (T > K) the tensor group all-gathers the subtrees (rows x 2 head_dim values
// per rank) and each rank adds its KV head's r of them on the rest of the tree. Every copy thus
// gets the same dK and dV, computes the whole KV head's weight gradient (its input gradient only
// for the rows of its slices, so the column-parallel sum counts each row once) and stays equal to
// the others through the update; the gradient norm counts the copy of the first rank of each KV
// head (TensorParallelLayout::copies). Slices of whole query heads of one KV head need S a multiple
// of K dividing the heads; other S keep the whole kernel (and refuse T > K). The all-gather moves
// every rank's subtree though each rank adds only its KV head's r (a group per KV head would move
// T / r times less). In bf16 and fp16 each slice's dK and dV are rounded before the tree adds them,
// as every split sum of Note [Tensor slices] is.
//
// Checkpoints hold every tensor rank's physical groups (checkpoint/checkpoint.h); a resume with other
// tensor ranks and `strata ckpt export` put the slices back together (train/checkpoint_tensors.h).
//
// Note [Sequence parallelism]: with strata.parallel.sequence (Megatron's sequence parallelism) the
// stretches between a row-parallel linear and the next column-parallel one (residual adds, norms,
// the embedding's sum) run on each rank's rows only: rows [r n / T, (r + 1) n / T) of the n =
// batch x seq rows. Where plain tensor parallelism all-reduces a row-parallel output (and the
// embedding's lookup), the ranks reduce-scatter it by rows; each norm runs on its rank's rows and
// its output is all-gathered for the column-parallel linear that reads it (the final norm's for the
// head). Backward mirrors it: the residual gradient is all-gathered before a row-parallel linear's
// backward (which needs every row of it, as does the embedding's), and a column-parallel input
// gradient is reduce-scattered instead of all-reduced. The communicator's exact reduce-scatter is
// its all-reduce's first half (Note [Deterministic reduction] in comm/communicator.h), and every op between is row by
// row, so the activations have the bits of plain tensor parallelism; the residual stream, the norms'
// inputs and their statistics take 1/T of the memory (with checkpointing, every kept block input).
// A norm's weight gradient sums over all rows, in row order (models/kernels/ops.h); the ranks take
// their rows in rank order: rank r receives the running sums from rank r - 1, adds its rows and
// sends them on, and the last rank broadcasts the total, so fp32 runs (exact mode) keep the bits of
// one pass over every row. That chain costs T - 1 sends and a broadcast of d_model values per
// norm weight, one after the other, and holds each rank's backward until the ranks before it have
// passed the norm. Fast mode (TensorParallel::ordered_norm_grads false) drops the order: each rank
// sums its rows (the first rank onto the gradient so far, the others from zero) and one all-reduce
// per vector adds them, as Megatron all-reduces its sequence-parallel norm gradients. A block keeps its norms' outputs as its rank's rows too and
// gathers them again for the column-parallel backward (as Megatron does), so without checkpointing
// every activation of the norm regions is 1/T. Beside pipeline stages a stage boundary is the rank's rows
// (Decoder::boundary_elems), sent to the same tensor rank of the next stage; GPT-2's tied head
// still sends the final norm's output whole (it is gathered). T must divide batch x seq.
//
// Not built yet: tiling beside tensor parallelism, the cuda device (the vocabulary-parallel ops'
// CUDA kernels, models/kernels/cuda_vocab_parallel.cu, have not run on a GPU; train refuses cuda
// unless STRATA_CUDA_PARALLEL=1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "plan/param_provider.h"
#include "models/model_config.h"
#include "models/tiling.h"

namespace strata {
class Communicator;
}

namespace strata::models {

struct PipelineStage;

struct TensorParallel {
  int size = 1;    // T
  int rank = 0;    // this rank's place in its tensor group
  int slices = 1;  // S (Note [Tensor slices])
  Communicator* comm = nullptr;  // the tensor group; null when T = 1
  bool sequence = false;         // Note [Sequence parallelism] (no effect at T = 1)
  // See Note [Sequence parallelism] in models/tensor_parallel.h.
  // The norms' weight gradients through the ranks' rows in rank order
  // (exact mode: one pass's bits); false: each rank's rows' part, all-reduced (fast mode).
  bool ordered_norm_grads = true;

  bool sliced() const { return slices > 1; }
  bool split_rows() const { return sequence && size > 1; }
  int local_slices() const { return slices / size; }
  int first_slice() const { return rank * local_slices(); }
};

// ConfigError naming `source`, the key and the valid choices when T or S cannot split `model`
// (T must split heads and the MLP width, and split the KV heads or be a multiple of them; S must be
// a power of two, a multiple of T, dividing `chunks`, and at most the smallest dimension it splits;
// past the KV heads, a multiple of them dividing the heads).
void check_tensor_parallel(const ModelConfig& model, int size, int slices, std::int64_t chunks,
                           const std::string& source);

// See Note [Replicated KV heads] in models/tensor_parallel.h.
// The tensor ranks holding each KV head (1 when T <= K), and whether S
// slices split the KV heads' gradient sums (S > K with grouped-query heads, S a multiple of K
// dividing the heads).
int kv_replicas(const ModelConfig& model, int size);
bool kv_pieces(const ModelConfig& model, int slices);

// How a rank's tensor is cut from the whole tensor of the untiled model.
enum class SliceKind { Whole, Rows, Columns };
struct TensorSlice {
  SliceKind kind = SliceKind::Whole;
  // Rows: the whole tensor's row ranges the rank holds, stacked in this order (GPT-2's qkv: the q,
  // k and v rows of its heads); Columns: one range of the whole tensor's columns (last dimension).
  std::vector<RowRange> ranges;
};

// A rank's groups. The decoder indexes the untiled groups (models/decoder_params.h) with each split
// tensor cut to its slice, under the whole tensor's name: the logical groups. At T > 1 the engine
// holds them as physical groups: each logical group's split tensors (named as the logical group)
// and its replicated tensors (norms, row-parallel biases, GPT-2's position embedding; "<name>.
// replicated") apart, so the gradient norm can count a replicated tensor once across the tensor
// group (ZeroEngine::set_tensor_group). At T = 1 the physical groups are the logical ones.
struct TensorLocation {
  std::size_t group = 0, tensor = 0;
};
struct TensorParallelLayout {
  std::vector<ParamGroupSpec> logical;
  std::vector<ParamGroupSpec> groups;                 // physical
  std::vector<ParamGroupSpec> whole;                  // physical, with the whole tensors' shapes
  std::vector<std::vector<TensorSlice>> slices;       // [physical group][tensor]: cut from whole
  std::vector<bool> replicated;                       // [physical group]: every tensor whole on every rank
  std::vector<int> copies;  // [physical group]: tensor ranks holding these values (1 split, T replicated, T/K KV heads)
  std::vector<std::vector<TensorLocation>> where;     // [logical group][tensor] -> physical
  bool split() const { return groups.size() != logical.size(); }
};
TensorParallelLayout tensor_parallel_layout(const ModelConfig& config, int size, int rank);

// The decoder's view of an engine holding the physical groups of `layout`: acquires, releases and
// declares ready both physical parts of a logical group and hands out views in the logical order.
class SplitGroupProvider final : public ParamProvider {
 public:
  SplitGroupProvider(ParamProvider& inner, const TensorParallelLayout& layout);
  std::span<const ParamGroupSpec> groups() const override { return layout_.logical; }
  GroupViews acquire_params(std::size_t group, ParamPhase phase, Stream* stream) override;
  void release_params(std::size_t group, Stream* stream) override;
  GroupViews acquire_grads(std::size_t group, Stream* stream) override;
  void grads_ready(std::size_t group, Stream* stream) override;

 private:
  std::vector<std::size_t> parts(std::size_t logical) const;  // its physical groups, ascending
  GroupViews merge(std::size_t logical, const std::vector<GroupViews>& views) const;
  ParamProvider& inner_;
  const TensorParallelLayout& layout_;
};

// The rank's rows of the vocabulary: [rank * V / size, (rank + 1) * V / size).
RowRange vocab_rows(const ModelConfig& config, int size, int rank);

// out = the rank's slice of `whole` (the whole tensor's values, row-major).
void cut_slice(const ParamTensorSpec& whole_spec, const TensorSlice& slice, std::span<const float> whole,
               std::span<float> out);
// The inverse: writes `part` (a rank's slice) into its place in `whole`.
void place_slice(const ParamTensorSpec& whole_spec, const TensorSlice& slice, std::span<const float> part,
                 std::span<float> whole);

// Megatron's count of one micro-batch's collectives in a tensor group (what each rank passes in,
// T > 1; zeros at T = 1), from the model's shape alone. All-reduces of rows x d_model activations:
// the embedding's lookup; 2 per block forward (attention-out, MLP-down), and with `training` 2 per
// block backward (the column-parallel input gradients of QKV and MLP-in), 2 more per block when
// `checkpointing` recomputes the forward, and the head's input gradient. The loss's: 2 all-reduces
// of rows fp32 (row maxima, target logits) and 1 all-gather of rows x S/T doubles (slice sums).
// With sequence parallelism (Note [Sequence parallelism]) each activation all-reduce is a
// reduce-scatter (rows x d_model passed in), and all-gathers of the rank's rows (rows / T x
// d_model) feed the readers of every row: the norms' outputs (2 per block forward, the final
// norm's, and in training the 2 per block again for the column-parallel backward) and the
// residual gradient (2 per block backward, the embedding's): 2 more per block in training than
// reduce-scatters. The norms' weight gradients (2 per block and
// the final one; GPT-2's with their biases) travel as the rank-order chain's receives (ranks after
// the first), sends (ranks before the last) and the last rank's broadcasts, d_model values each;
// without ordered_norm_grads as one all-reduce of d_model values each.
struct TensorParallelTraffic {
  std::uint64_t all_reduce_calls = 0, all_reduce_bytes = 0;
  std::uint64_t all_gather_calls = 0, all_gather_bytes = 0;
  std::uint64_t reduce_scatter_calls = 0, reduce_scatter_bytes = 0;
  std::uint64_t broadcast_calls = 0, broadcast_bytes = 0;
  std::uint64_t send_calls = 0, send_bytes = 0, recv_calls = 0, recv_bytes = 0;
};
// With pipeline stages (`stage` split), the stage's own: its blocks' collectives, the embedding's
// on the first stage, the head's on the last; with GPT-2's tied embedding the first stage's
// recomputed loss (Note [Tied embedding across stages] in models/pipeline.h); a re-materialized stage before the last
// runs its forward twice (Note [Stage re-materialization] in models/pipeline.h).
TensorParallelTraffic tensor_parallel_traffic(const ModelConfig& config, const TensorParallel& tp, std::int64_t rows,
                                              bool training, bool checkpointing, const PipelineStage* stage = nullptr);

}  // namespace strata::models
