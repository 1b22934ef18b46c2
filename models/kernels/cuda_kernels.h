// The CUDA side of the op set: the cuBLAS handle owner and the launchers models/kernels/ops.cc
// calls for a cuda KernelContext. No CUDA header is included here (streams and handles travel as
// void*), so host-only code may include it in every build.
//
// The launchers are defined only in builds with the CUDA backend (models/kernels/*.cu, compiled
// with nvcc); ops.cc reaches them only there. Each one enqueues its kernels on `stream` (a
// cudaStream_t, Stream::native_handle()) and returns; arguments and semantics are exactly those
// of the same-named op in ops.h, and the per-element math is the STRATA_HD code of op_math.h and
// core/dtype.h that the CPU kernels run (the host tests check it; see each .cu file's header).
//
// Bad input the CPU kernels report with STRATA_CHECK (a target id >= vocab, a negative token id)
// cannot be thrown from a GPU kernel: the CUDA kernels write NaN into the affected loss or output
// row instead, so the mistake shows in the loss rather than as silent garbage.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device/device.h"
#include "core/dtype.h"
#include "models/kernels/ops.h"

namespace strata::models {

// One cuBLAS handle bound to one CUDA stream (models/kernels/cublas_handles_cuda.cc), with its own
// workspace allocated from the Device (counted against the device's capacity under the tag
// "cublas.workspace"). A private
// workspace per stream is what cuBLAS needs for bit-reproducible gemms when several streams run
// at once. Move-only; must not outlive its Device. Use one CublasHandles per stream: matmul on a
// context whose stream is not the bound one is a DeviceError. In builds without CUDA the
// constructor throws DeviceError (cublas_handles_nocuda.cc). A cuda KernelContext carries a pointer
// to one in KernelContext::cublas.
class CublasHandles {
 public:
  static constexpr std::size_t kDefaultWorkspaceBytes = std::size_t{32} << 20;

  CublasHandles(Device& device, Stream& stream, std::size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~CublasHandles();
  CublasHandles(CublasHandles&& other) noexcept;
  CublasHandles& operator=(CublasHandles&& other) noexcept;
  CublasHandles(const CublasHandles&) = delete;
  CublasHandles& operator=(const CublasHandles&) = delete;

  void* handle() const { return handle_; }        // cublasHandle_t
  void* stream() const { return stream_; }        // the cudaStream_t the handle is bound to
  int device_ordinal() const { return ordinal_; }  // the CUDA device the handle was created on

 private:
  void destroy() noexcept;

  DeviceMemory workspace_;  // freed after destroy(): cublasDestroy synchronizes the device first
  void* handle_ = nullptr;
  void* stream_ = nullptr;
  int ordinal_ = 0;
};

namespace cuda {

// Where a launcher enqueues: the stream (cudaStream_t) and, for matmul, the handle bound to it.
struct Launch {
  void* stream = nullptr;
  CublasHandles* cublas = nullptr;
};

// models/kernels/cuda_matmul.cu (cuBLAS; the bias gradient is its column-sum kernel).
void matmul(const Launch& L, const MatmulArgs& args);
void bias_grad(const Launch& L, DType dtype, const void* dout, std::int64_t rows, std::int64_t cols, std::int64_t ld,
               void* dbias);

// models/kernels/cuda_norm.cu.
void layernorm_forward(const Launch& L, DType dtype, const void* x, const void* weight, const void* bias, void* out,
                       float* mean, float* rstd, std::int64_t rows, std::int64_t cols, float eps);
void layernorm_backward(const Launch& L, DType dtype, const void* dout, const void* x, const void* weight,
                        const float* mean, const float* rstd, void* dx, void* dweight, void* dbias,
                        std::int64_t rows, std::int64_t cols, Accumulate accumulate_dx);
void rmsnorm_forward(const Launch& L, DType dtype, const void* x, const void* weight, void* out, float* rstd,
                     std::int64_t rows, std::int64_t cols, float eps);
void rmsnorm_backward(const Launch& L, DType dtype, const void* dout, const void* x, const void* weight,
                      const float* rstd, void* dx, void* dweight, std::int64_t rows, std::int64_t cols,
                      Accumulate accumulate_dx);

// models/kernels/cuda_elementwise.cu.
void gelu_forward(const Launch& L, DType dtype, const void* x, void* out, std::int64_t n);
void gelu_backward(const Launch& L, DType dtype, const void* x, const void* dout, void* dx, std::int64_t n);
void swiglu_forward(const Launch& L, DType dtype, const void* gate_up, void* out, std::int64_t rows,
                    std::int64_t hidden);
void swiglu_backward(const Launch& L, DType dtype, const void* gate_up, const void* dout, void* dgate_up,
                     std::int64_t rows, std::int64_t hidden);
void residual_add(const Launch& L, DType dtype, const void* a, const void* b, void* out, std::int64_t n);
void cast(const Launch& L, DType src_dtype, const void* src, DType dst_dtype, void* dst, std::int64_t n);
void rope(const Launch& L, DType dtype, void* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
          std::int64_t head_dim, std::int64_t row_stride, const RopeSpec& spec, RopeDirection direction,
          std::int64_t first_position = 0);

// models/kernels/cuda_embedding.cu.
void embedding_forward(const Launch& L, DType dtype, const std::int32_t* tokens, const void* wte, const void* wpe,
                       void* out, std::int64_t batch, std::int64_t seq, std::int64_t channels);
void embedding_backward(const Launch& L, DType dtype, const std::int32_t* tokens, const void* dout, void* dwte,
                        void* dwpe, std::int64_t batch, std::int64_t seq, std::int64_t channels);
void embedding_forward_vocab_slice(const Launch& L, DType dtype, const std::int32_t* tokens, const void* wte_slice,
                                   std::int64_t vocab_begin, std::int64_t vocab_end, const void* wpe, void* out,
                                   std::int64_t batch, std::int64_t seq, std::int64_t channels);
void embedding_backward_vocab_slice(const Launch& L, DType dtype, const std::int32_t* tokens, const void* dout,
                                    void* dwte_slice, std::int64_t vocab_begin, std::int64_t vocab_end, void* dwpe,
                                    std::int64_t batch, std::int64_t seq, std::int64_t channels);

// models/kernels/cuda_cross_entropy.cu.
void cross_entropy(const Launch& L, DType dtype, const void* logits, const std::int32_t* targets, float* losses,
                   void* dlogits, std::int64_t rows, std::int64_t vocab, std::int64_t ld, float grad_scale);

// models/kernels/cuda_vocab_parallel.cu (tensor parallelism's cross-entropy steps).
void cross_entropy_row_max(const Launch& L, DType dtype, const void* logits_slice, std::int64_t rows,
                           std::int64_t cols, std::int64_t ld, float* row_max);
void cross_entropy_slice_sums(const Launch& L, DType dtype, const void* logits_slice, const std::int32_t* targets,
                              std::int64_t rows, std::int64_t ld, std::int64_t vocab, std::int64_t slices,
                              std::int64_t first_slice, std::int64_t local_slices, const float* row_max, double* sums,
                              float* target_logit);
void cross_entropy_finish(const Launch& L, DType dtype, const void* logits_slice, const std::int32_t* targets,
                          float* losses, void* dlogits_slice, std::int64_t rows, std::int64_t ld, std::int64_t vocab,
                          std::int64_t slices, std::int64_t first_slice, std::int64_t local_slices,
                          const float* row_max, const double* all_sums, const float* target_logit, float grad_scale);

// models/kernels/cuda_attention.cu (forward) and cuda_attention_backward.cu.
void attention_forward(const Launch& L, DType dtype, const AttentionShape& shape, const void* q, const void* k,
                       const void* v, void* out, float* lse);
void attention_backward(const Launch& L, DType dtype, const AttentionShape& shape, const void* q, const void* k,
                        const void* v, const void* out, const float* lse, const void* dout, void* dq, void* dk,
                        void* dv);
// models/kernels/cuda_attention_cached.cu (the KV cache's attention).
void attention_cached(const Launch& L, DType dtype, const CachedAttentionShape& shape, const void* q,
                      const void* k_cache, const void* v_cache, void* out);

}  // namespace cuda
}  // namespace strata::models
