// The CPU kernels of the op set: plain synchronous functions over host pointers (OpenBLAS for
// matmuls, oneTBB for row and element kernels). models/kernels/ops.h enqueues them on sim streams
// or runs them inline; the tests call them through ops.h with a null stream. Arguments and
// semantics are those of the same-named functions in ops.h.
#pragma once

#include <cstdint>

#include "models/kernels/ops.h"

namespace strata::models::cpu {

void matmul(const MatmulArgs& args);
void bias_grad(DType dtype, const void* dout, std::int64_t rows, std::int64_t cols,
               std::int64_t ld, void* dbias);
void layernorm_forward(DType dtype, const void* x, const void* weight, const void* bias,
                       void* out, float* mean, float* rstd, std::int64_t rows, std::int64_t cols, float eps);
void layernorm_backward(DType dtype, const void* dout, const void* x, const void* weight,
                        const float* mean, const float* rstd, void* dx, void* dweight, void* dbias,
                        std::int64_t rows, std::int64_t cols, Accumulate accumulate_dx);
void rmsnorm_forward(DType dtype, const void* x, const void* weight, void* out, float* rstd,
                     std::int64_t rows, std::int64_t cols, float eps);
void rmsnorm_backward(DType dtype, const void* dout, const void* x, const void* weight,
                      const float* rstd, void* dx, void* dweight, std::int64_t rows, std::int64_t cols,
                      Accumulate accumulate_dx);
void gelu_forward(DType dtype, const void* x, void* out, std::int64_t n);
void gelu_backward(DType dtype, const void* x, const void* dout, void* dx, std::int64_t n);
void swiglu_forward(DType dtype, const void* gate_up, void* out, std::int64_t rows,
                    std::int64_t hidden);
void swiglu_backward(DType dtype, const void* gate_up, const void* dout, void* dgate_up,
                     std::int64_t rows, std::int64_t hidden);
void attention_forward(DType dtype, const AttentionShape& shape, const void* q,
                       const void* k, const void* v, void* out, float* lse);
void attention_backward(DType dtype, const AttentionShape& shape, const void* q,
                        const void* k, const void* v, const void* out, const float* lse, const void* dout, void* dq,
                        void* dk, void* dv);
void attention_cached(DType dtype, const CachedAttentionShape& shape, const void* q, const void* k_cache,
                      const void* v_cache, void* out);
// Row r of each sequence is at position first_position + r (0 but for rope_at).
void rope(DType dtype, void* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
          std::int64_t head_dim, std::int64_t row_stride, const RopeSpec& spec, RopeDirection direction,
          std::int64_t first_position = 0);
void embedding_forward(DType dtype, const std::int32_t* tokens, const void* wte,
                       const void* wpe, void* out, std::int64_t batch, std::int64_t seq, std::int64_t channels);
void embedding_backward(DType dtype, const std::int32_t* tokens, const void* dout,
                        void* dwte, void* dwpe, std::int64_t batch, std::int64_t seq, std::int64_t channels);
// dwpe[t, :] += sum over the batch of dout (batch order): embedding_backward's position part.
void embedding_backward_positions(DType dtype, const void* dout, void* dwpe, std::int64_t batch, std::int64_t seq,
                                  std::int64_t channels);
void cross_entropy(DType dtype, const void* logits, const std::int32_t* targets,
                   float* losses, void* dlogits, std::int64_t rows, std::int64_t vocab, std::int64_t ld,
                   float grad_scale);
void embedding_forward_vocab_slice(DType dtype, const std::int32_t* tokens, const void* wte_slice,
                                   std::int64_t vocab_begin, std::int64_t vocab_end, const void* wpe, void* out,
                                   std::int64_t batch, std::int64_t seq, std::int64_t channels);
void embedding_backward_vocab_slice(DType dtype, const std::int32_t* tokens, const void* dout, void* dwte_slice,
                                    std::int64_t vocab_begin, std::int64_t vocab_end, void* dwpe, std::int64_t batch,
                                    std::int64_t seq, std::int64_t channels);
void cross_entropy_row_max(DType dtype, const void* logits_slice, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                           float* row_max);
void cross_entropy_slice_sums(DType dtype, const void* logits_slice, const std::int32_t* targets, std::int64_t rows,
                              std::int64_t ld, std::int64_t vocab, std::int64_t slices, std::int64_t first_slice,
                              std::int64_t local_slices, const float* row_max, double* sums, float* target_logit);
void cross_entropy_finish(DType dtype, const void* logits_slice, const std::int32_t* targets, float* losses,
                          void* dlogits_slice, std::int64_t rows, std::int64_t ld, std::int64_t vocab,
                          std::int64_t slices, std::int64_t first_slice, std::int64_t local_slices,
                          const float* row_max, const double* all_sums, const float* target_logit, float grad_scale);
void residual_add(DType dtype, const void* a, const void* b, void* out, std::int64_t n);
void cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, std::int64_t n);

}  // namespace strata::models::cpu
