// The op set of the models: what a decoder enqueues on a device stream.
//
// Every op takes a KernelContext (device kind, stream, BLAS handles; passed explicitly, no globals)
// and raw device pointers plus a DType for the tensor elements (fp32, bf16 or fp16; statistics such
// as layer-norm means, log-sum-exps and losses are always fp32, token ids int32). Arithmetic is fp32.
//
//  * sim device: the op is enqueued as a sim kernel (core/device/sim_kernel.h) and runs the CPU kernel of
//    models/kernels/cpu_kernels.h (OpenBLAS sgemm, oneTBB row/element kernels).
//  * cuda device: the op launches the kernels of models/kernels/cuda_kernels.h (cuBLAS for matmul)
//    on the stream's cudaStream_t; matmul needs one CublasHandles bound to that stream. The
//    per-element math they share with the CPU path is in models/kernels/op_math.h (STRATA_HD).
//    Checked against the CPU kernels on a GPU by tests/models/ops_cuda_test.cc (label gpu).
//  * stream == nullptr: the CPU kernel runs inline on the calling thread over host memory. This is
//    the plain in-memory reference run that docs/DESIGN.md compares the sim device against.
//
// Determinism (exact mode): every CPU kernel gives the same bits run to run and for any thread
// count: rows are independent tasks, and reductions across rows (bias, norm weights, embeddings,
// attention dK/dV) run in a fixed row order with a running sum, so accumulating in several calls
// equals accumulating in one (micro-batches give the gradients of one big batch, bit for bit,
// when the model issues per-sequence calls; see models/decoder.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/dtype.h"
#include "models/kernels/rope_spec.h"

namespace strata::models {

class CublasHandles;  // models/kernels/cuda_kernels.h

// Note [Modeled compute]: on a sim stream with modeled_flops_per_s > 0, a matmul or attention op
// takes at least its FLOPs (2 m n k per matmul item; causal attention 2 b h s^2 d forward, 5 b h
// s^2 d backward) at that rate: its kernel runs as usual, then the stream's worker sleeps out the
// rest, leaving the host's cores to other work. The other ops run at the host's speed (their FLOPs
// are not the step's). So P ranks on a machine of fewer cores each compute like a device of that
// rate, as far as the host keeps up (strata.device.compute_tflops; a pipeline's bubble is then
// measurable on a small host). Results are unchanged: only time is added.
class OpProfile;  // below

struct KernelContext {
  DeviceKind kind = DeviceKind::Sim;
  Stream* stream = nullptr;         // null: run inline on the calling thread over host memory
  CublasHandles* cublas = nullptr;  // cuda: the handle bound to `stream` (matmul)
  double modeled_flops_per_s = 0;   // sim streams: Note [Modeled compute]; 0: the host's speed
  OpProfile* profile = nullptr;     // with a stream: each op's time between events (strata bench model --profile)
};

// Device time per op name: every op enqueued with a KernelContext carrying this profile is
// bracketed by two events on its stream, and report() sums their elapsed times per op. A
// benchmark's tool (it adds two event records per op), never on in training.
class OpProfile {
 public:
  struct Row {
    std::string op;
    std::int64_t calls = 0;
    double ms = 0;
  };
  void add(const char* op, std::unique_ptr<Event> start, std::unique_ptr<Event> end);
  // Synchronizes the recorded events and returns the rows, most time first; clears the records.
  std::vector<Row> report();

 private:
  struct Pending {
    const char* op;
    std::unique_ptr<Event> start, end;
  };
  std::vector<Pending> pending_;
  std::vector<Row> rows_;
};

enum class Trans { No, Yes };

// C[m,n] (ldc) = alpha * op(A)[m,k] * op(B)[k,n] + beta * C + bias[n], row-major, for `batch` items
// at the given element strides. A stride_c of 0 with beta = 1 accumulates every item into one C,
// in item order (how weight gradients are summed over sequences).
struct MatmulArgs {
  DType dtype = DType::F32;
  Trans trans_a = Trans::No;
  Trans trans_b = Trans::No;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  std::int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  std::int64_t ldc = 0, stride_c = 0;
  std::int64_t batch = 1;
  const void* bias = nullptr;  // [n] in dtype, or null
  float alpha = 1.0f;
  float beta = 0.0f;
};
void matmul(const KernelContext& ctx, const MatmulArgs& args);

// dbias[cols] += sum over rows of dout[rows, cols] (row stride ld), in row order.
void bias_grad(const KernelContext& ctx, DType dtype, const void* dout, std::int64_t rows, std::int64_t cols,
               std::int64_t ld, void* dbias);

// Layer norm over the last dimension; mean and rstd are fp32 [rows], saved for backward.
void layernorm_forward(const KernelContext& ctx, DType dtype, const void* x, const void* weight, const void* bias,
                       void* out, float* mean, float* rstd, std::int64_t rows, std::int64_t cols, float eps);
// dx = (accumulate_dx ? dx : 0) + d(out)/dx; dweight and dbias accumulate in row order.
enum class Accumulate { No, Yes };
void layernorm_backward(const KernelContext& ctx, DType dtype, const void* dout, const void* x, const void* weight,
                        const float* mean, const float* rstd, void* dx, void* dweight, void* dbias,
                        std::int64_t rows, std::int64_t cols, Accumulate accumulate_dx);

// RMS norm (LLaMA): out = x * rstd * weight with rstd = 1/sqrt(mean(x^2) + eps).
void rmsnorm_forward(const KernelContext& ctx, DType dtype, const void* x, const void* weight, void* out, float* rstd,
                     std::int64_t rows, std::int64_t cols, float eps);
void rmsnorm_backward(const KernelContext& ctx, DType dtype, const void* dout, const void* x, const void* weight,
                      const float* rstd, void* dx, void* dweight, std::int64_t rows, std::int64_t cols,
                      Accumulate accumulate_dx);

// GELU (tanh) over n elements; backward dx = dout * gelu'(x).
void gelu_forward(const KernelContext& ctx, DType dtype, const void* x, void* out, std::int64_t n);
void gelu_backward(const KernelContext& ctx, DType dtype, const void* x, const void* dout, void* dx, std::int64_t n);

// SwiGLU: gate_up is [rows, 2*hidden] (gate in the first half of each row, up in the second);
// out[rows, hidden] = silu(gate) * up. Backward writes dgate_up [rows, 2*hidden].
void swiglu_forward(const KernelContext& ctx, DType dtype, const void* gate_up, void* out, std::int64_t rows,
                    std::int64_t hidden);
void swiglu_backward(const KernelContext& ctx, DType dtype, const void* gate_up, const void* dout, void* dgate_up,
                     std::int64_t rows, std::int64_t hidden);

// Shape of causal multi-head attention with grouped-query heads (q_heads % kv_heads == 0).
// Element (b, t, h, d) of q lives at q[(b*seq + t) * q_row_stride + h*head_dim + d]; k and v the same
// with kv heads and their own row strides; out with out_row_stride. lse is fp32 [batch, lse_heads, seq]
// (lse_heads 0: q_heads), so a call over some heads of a larger attention passes the whole lse's
// head count and lse advanced to its first head. The backward's dq is laid out as q and dk, dv as
// k, v but at row stride dkv_row_stride (0: kv_row_stride).
struct AttentionShape {
  std::int64_t batch = 0, seq = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t q_row_stride = 0, kv_row_stride = 0, out_row_stride = 0;
  std::int64_t lse_heads = 0, dkv_row_stride = 0;
  std::int64_t lse_heads_or_q() const { return lse_heads == 0 ? q_heads : lse_heads; }
  std::int64_t dkv_stride() const { return dkv_row_stride == 0 ? kv_row_stride : dkv_row_stride; }
};
void attention_forward(const KernelContext& ctx, DType dtype, const AttentionShape& shape, const void* q,
                       const void* k, const void* v, void* out, float* lse);
// Recomputes the softmax tiles from q, k, v and lse (memory stays O(seq)); writes dq, dk, dv (the
// layouts of q, k, v, dk and dv at dkv_row_stride; they may be parts of one packed dqkv buffer).
void attention_backward(const KernelContext& ctx, DType dtype, const AttentionShape& shape, const void* q,
                        const void* k, const void* v, const void* out, const float* lse, const void* dout, void* dq,
                        void* dk, void* dv);

// Note [KV cache] (models/kv_decoder.h): causal attention of `q_rows` new query rows of one
// sequence over a key/value cache of `kv_len` positions that already holds the new rows' keys and
// values last. Query row i is at position kv_len - q_rows + i and attends keys 0..that position.
// Element (t, h, d) of q is at q[t * q_row_stride + h*head_dim + d], of the caches at
// k[t * kv_row_stride + g*head_dim + d] (kv head g = h / (q_heads / kv_heads)), of out at
// out_row_stride. Each row's arithmetic is attention_forward's for the same row (the same key
// tiles from position 0, the same online softmax), so on the CPU a cached row has a full forward's
// bits; no lse is kept (inference only).
struct CachedAttentionShape {
  std::int64_t q_rows = 0, kv_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t q_row_stride = 0, kv_row_stride = 0, out_row_stride = 0;
};
void attention_cached(const KernelContext& ctx, DType dtype, const CachedAttentionShape& shape, const void* q,
                      const void* k_cache, const void* v_cache, void* out);

// Rotary embedding, in place, of `heads` heads of head_dim at row stride row_stride, rows = batch*seq,
// position of row r = r % seq. Direction::Inverse rotates back (the backward of Forward).
enum class RopeDirection { Forward, Inverse };
void rope(const KernelContext& ctx, DType dtype, void* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
          std::int64_t head_dim, std::int64_t row_stride, const RopeSpec& spec, RopeDirection direction);

// rope's Forward rotation of `rows` consecutive rows of one sequence at positions first_position..
// (a KV cache's new rows, Note [KV cache] in models/kv_decoder.h): row r gets the bits rope()
// gives row first_position + r of a whole sequence.
void rope_at(const KernelContext& ctx, DType dtype, void* x, std::int64_t rows, std::int64_t first_position,
             std::int64_t heads, std::int64_t head_dim, std::int64_t row_stride, const RopeSpec& spec);

// out[b*seq + t, :] = wte[token, :] + (wpe ? wpe[t, :] : 0). Tokens are int32 in [0, vocab).
void embedding_forward(const KernelContext& ctx, DType dtype, const std::int32_t* tokens, const void* wte,
                       const void* wpe, void* out, std::int64_t batch, std::int64_t seq, std::int64_t channels);
// dwte[token, :] += dout (token order); dwpe[t, :] += sum over batch (batch order); dwpe may be null.
void embedding_backward(const KernelContext& ctx, DType dtype, const std::int32_t* tokens, const void* dout,
                        void* dwte, void* dwpe, std::int64_t batch, std::int64_t seq, std::int64_t channels);

// Fused softmax + cross-entropy over rows of logits [rows, vocab] (row stride ld). losses (fp32 [rows])
// gets -log softmax[target]; a negative target is ignored (loss 0, gradient 0). With dlogits non-null
// (it may equal logits), writes (softmax - onehot) * grad_scale.
void cross_entropy(const KernelContext& ctx, DType dtype, const void* logits, const std::int32_t* targets,
                   float* losses, void* dlogits, std::int64_t rows, std::int64_t vocab, std::int64_t ld,
                   float grad_scale);

// ---- Vocabulary-parallel embedding and cross-entropy (tensor parallelism, models/tensor_parallel.h).
// A rank holds rows [vocab_begin, vocab_end) of the embedding (and of the tied or untied LM head).
// The vocabulary is cut into `slices` global slices, slice s = [s*vocab/slices, (s+1)*vocab/slices);
// a rank holds `local_slices` of them from `first_slice` (Note [Tensor slices] in models/tensor_parallel.h). CUDA
// kernels in cuda_embedding.cu and cuda_vocab_parallel.cu (written without a GPU: not run on one yet).

// out[b*seq + t, :] = wte_slice[token - vocab_begin, :] + (wpe ? wpe[t, :] : 0) for a token in the
// rank's rows, zeros for any other token: summed over the ranks, embedding_forward's output.
void embedding_forward_vocab_slice(const KernelContext& ctx, DType dtype, const std::int32_t* tokens,
                                   const void* wte_slice, std::int64_t vocab_begin, std::int64_t vocab_end,
                                   const void* wpe, void* out, std::int64_t batch, std::int64_t seq,
                                   std::int64_t channels);
// dwte_slice[token - vocab_begin, :] += dout for the tokens in the rank's rows (token order); dwpe
// as embedding_backward (every row).
void embedding_backward_vocab_slice(const KernelContext& ctx, DType dtype, const std::int32_t* tokens,
                                    const void* dout, void* dwte_slice, std::int64_t vocab_begin,
                                    std::int64_t vocab_end, void* dwpe, std::int64_t batch, std::int64_t seq,
                                    std::int64_t channels);

// The cross-entropy of logits [rows, vocab] of which this rank holds columns [vocab_begin,
// vocab_end) (logits_slice, row stride ld), in three steps around the collectives:
//  1. row_max[r] = the largest of the rank's logits of row r (-inf for none); all-reduce max.
void cross_entropy_row_max(const KernelContext& ctx, DType dtype, const void* logits_slice, std::int64_t rows,
                           std::int64_t cols, std::int64_t ld, float* row_max);
//  2. sums[r * local_slices + l] = the sum over slice first_slice + l of exp(logit - row_max[r]),
//     accumulated in double in column order; target_logit[r] = the target's logit when the rank
//     holds it, else 0. All-gather the sums ([ranks][rows][local_slices]); all-reduce sum the
//     target logits (one rank adds a value, the others zeros).
void cross_entropy_slice_sums(const KernelContext& ctx, DType dtype, const void* logits_slice,
                              const std::int32_t* targets, std::int64_t rows, std::int64_t ld, std::int64_t vocab,
                              std::int64_t slices, std::int64_t first_slice, std::int64_t local_slices,
                              const float* row_max, double* sums, float* target_logit);
//  3. losses[r] and, with dlogits_slice non-null (it may equal logits_slice), the rank's columns
//     of (softmax - onehot) * grad_scale, from the gathered sums summed on the pairwise tree over
//     the `slices` slices in global order, in double, then rounded once.
void cross_entropy_finish(const KernelContext& ctx, DType dtype, const void* logits_slice, const std::int32_t* targets,
                          float* losses, void* dlogits_slice, std::int64_t rows, std::int64_t ld, std::int64_t vocab,
                          std::int64_t slices, std::int64_t first_slice, std::int64_t local_slices,
                          const float* row_max, const double* all_sums, const float* target_logit, float grad_scale);

// out = a + b (out may alias a or b).
void residual_add(const KernelContext& ctx, DType dtype, const void* a, const void* b, void* out, std::int64_t n);

// dst = convert(src), n elements (round to nearest even).
void cast(const KernelContext& ctx, DType src_dtype, const void* src, DType dst_dtype, void* dst, std::int64_t n);

}  // namespace strata::models
