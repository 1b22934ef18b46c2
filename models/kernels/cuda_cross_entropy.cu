// CUDA kernel of the fused softmax + cross-entropy (forward loss and, optionally, the logit
// gradient in the same pass over the row). One block per row: a block maximum, a block sum of
// exp(logit - max) (both fixed-shape reductions, cuda_common.cuh), then the loss and the gradient.
// dlogits may equal logits: the target logit is read before the block barrier that precedes the
// first write, and afterwards each element is read and written by the same thread.
//
// A target >= vocab cannot be thrown for on the device (the CPU kernel's STRATA_CHECK): its loss
// and its gradient row become NaN. A negative target is ignored (loss 0, gradient 0), as on the CPU.
//
// Shared per-element math (also called by cpu_matmul.cc's cross_entropy): math::shifted_exp,
// math::cross_entropy_loss, math::cross_entropy_dlogit (op_math.h); to_f32 / from_f32 (core/dtype.h).
#include "models/kernels/cuda_common.cuh"

#include "models/kernels/op_math.h"

namespace strata::models::cuda {
namespace {

template <typename T>
__global__ void cross_entropy_kernel(const T* logits, const std::int32_t* __restrict__ targets,
                                     float* __restrict__ losses, T* dlogits, std::int64_t vocab, std::int64_t ld,
                                     float grad_scale) {
  __shared__ float scratch[32];
  const std::int64_t r = blockIdx.x;
  const std::int64_t base = r * ld;
  const std::int32_t target = targets[r];
  float local_max = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    local_max = fmaxf(local_max, to_f32(logits[base + j]));
  }
  const float row_max = block_max(local_max, scratch);
  float local_sum = 0.0f;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    local_sum += math::shifted_exp(to_f32(logits[base + j]), row_max);
  }
  const float sum = block_sum(local_sum, scratch);

  const bool ignored = target < 0;
  const bool bad_target = target >= vocab;
  if (threadIdx.x == 0) {
    float loss = 0.0f;
    if (bad_target) {
      loss = bad_input_nan();
    } else if (!ignored) {
      loss = math::cross_entropy_loss(row_max, sum, to_f32(logits[base + target]));
    }
    losses[r] = loss;
  }
  if (dlogits == nullptr) return;
  __syncthreads();  // the target logit is read before dlogits (possibly == logits) is written
  const float inv_sum = 1.0f / sum;
  float scale = grad_scale;
  if (ignored) scale = 0.0f;
  if (bad_target) scale = bad_input_nan();
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    dlogits[base + j] =
        from_f32<T>(math::cross_entropy_dlogit(to_f32(logits[base + j]), row_max, inv_sum, j == target, scale));
  }
}

}  // namespace

void cross_entropy(const Launch& L, DType dtype, const void* logits, const std::int32_t* targets, float* losses,
                   void* dlogits, std::int64_t rows, std::int64_t vocab, std::int64_t ld, float grad_scale) {
  if (rows <= 0) return;
  STRATA_CHECK(vocab > 0 && ld >= vocab, "cross_entropy: vocab must be positive and ld at least vocab");
  STRATA_CHECK(rows <= 0x7fffffff, "cross_entropy: more rows than one CUDA grid dimension holds (2^31 - 1)");
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<static_cast<unsigned>(rows), kBlockThreads, 0, scope.stream>>>(
        static_cast<const T*>(logits), targets, losses, static_cast<T*>(dlogits), vocab, ld, grad_scale);
  });
  check_launch();
}

}  // namespace strata::models::cuda
