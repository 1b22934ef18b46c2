// CUDA kernels of the vocabulary-parallel cross-entropy (models/kernels/ops.h; Note
// [Vocabulary-parallel cross-entropy] in models/tensor_parallel.h), the CPU kernels' steps
// (cpu_vocab_parallel.cc) on the GPU. The vocabulary-parallel embedding is in cuda_embedding.cu.
//   1. row_max: one block per row, a block maximum (order-free: the CPU's bits).
//   2. slice_sums: one block per (row, local slice), each thread's exp(logit - max) summed in
//      double, then a fixed-shape double tree over the block; the CPU sums the slice's columns in
//      column order, so the two differ by the double's rounding plus expf's (the per-term 2 ulp of
//      Note [CUDA op tolerances] in tests/models/ops_cuda_test_util.h). The target's logit is copied as it is (the
// CPU's bits).
//   3. finish: one block per row; thread 0 adds the gathered sums on the pairwise tree over the
//      slices in global order (exactly the CPU's loop), then every thread writes its columns'
//      gradients with math::cross_entropy_dlogit, as the whole-vocabulary kernel does.
// A target >= vocab cannot be thrown for on the device (the CPU kernels' STRATA_CHECK): its target
// logit, loss and gradient row become NaN, as in cuda_cross_entropy.cu. A negative target is
// ignored (loss 0, gradient 0).
#include "models/kernels/cuda_common.cuh"

#include "models/kernels/op_math.h"

namespace strata::models::cuda {
namespace {

__device__ __forceinline__ std::int64_t slice_begin(std::int64_t vocab, std::int64_t slices, std::int64_t s) {
  return s * vocab / slices;
}

// Sum of `v` over the block in double (fixed shape: warps by shuffles, then warp 0 over the warps),
// returned to every thread. `scratch` is __shared__ double[32].
__device__ __forceinline__ double block_sum_double(double v, double* scratch) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double t = lane < warps ? scratch[lane] : 0.0;
  for (int offset = 16; offset > 0; offset >>= 1) t += __shfl_xor_sync(0xffffffffu, t, offset);
  return t;
}

template <typename T>
__global__ void row_max_kernel(const T* __restrict__ logits, std::int64_t cols, std::int64_t ld,
                               float* __restrict__ row_max) {
  __shared__ float scratch[32];
  const std::int64_t r = blockIdx.x;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, to_f32(logits[r * ld + j]));
  m = block_max(m, scratch);
  if (threadIdx.x == 0) row_max[r] = m;
}

template <typename T>
__global__ void slice_sums_kernel(const T* __restrict__ logits, const std::int32_t* __restrict__ targets,
                                  std::int64_t ld, std::int64_t vocab, std::int64_t slices, std::int64_t first_slice,
                                  std::int64_t local_slices, const float* __restrict__ row_max,
                                  double* __restrict__ sums, float* __restrict__ target_logit) {
  __shared__ double scratch[32];
  const std::int64_t r = blockIdx.x, l = blockIdx.y;
  const std::int64_t vocab_begin = slice_begin(vocab, slices, first_slice);
  const std::int64_t b = slice_begin(vocab, slices, first_slice + l) - vocab_begin;
  const std::int64_t e = slice_begin(vocab, slices, first_slice + l + 1) - vocab_begin;
  const float mx = row_max[r];
  double s = 0.0;
  for (std::int64_t j = b + threadIdx.x; j < e; j += blockDim.x) s += math::shifted_exp(to_f32(logits[r * ld + j]), mx);
  s = block_sum_double(s, scratch);
  if (threadIdx.x != 0) return;
  sums[r * local_slices + l] = s;
  if (l != 0) return;
  const std::int64_t target = targets[r];
  const std::int64_t vocab_end = slice_begin(vocab, slices, first_slice + local_slices);
  float t = 0.0f;
  if (target >= vocab) {
    t = bad_input_nan();
  } else if (target >= vocab_begin && target < vocab_end) {
    t = to_f32(logits[r * ld + target - vocab_begin]);
  }
  target_logit[r] = t;
}

// At most this many slices (see Note [Tensor slices] in models/tensor_parallel.h: S divides the tiling's chunks, 16 by default).
constexpr int kMaxSlices = 256;

template <typename T>
__global__ void finish_kernel(const T* logits, const std::int32_t* __restrict__ targets, float* __restrict__ losses,
                              T* dlogits, std::int64_t rows, std::int64_t ld, std::int64_t vocab, std::int64_t slices,
                              std::int64_t first_slice, std::int64_t local_slices, const float* __restrict__ row_max,
                              const double* __restrict__ all_sums, const float* __restrict__ target_logit,
                              float grad_scale) {
  __shared__ double t[kMaxSlices];
  const std::int64_t r = blockIdx.x;
  const std::int64_t ranks = slices / local_slices;
  if (threadIdx.x == 0) {
    // Slice s = rank * local_slices + l in global order, then the pairwise tree of
    // tree_reduce_host (comm/communicator.h), as the CPU kernel adds them.
    for (std::int64_t k = 0; k < ranks; ++k) {
      for (std::int64_t l = 0; l < local_slices; ++l) t[k * local_slices + l] = all_sums[(k * rows + r) * local_slices + l];
    }
    for (std::int64_t stride = 1; stride < slices; stride *= 2) {
      for (std::int64_t i = 0; i + stride < slices; i += 2 * stride) t[i] += t[i + stride];
    }
  }
  __syncthreads();
  const float sum = static_cast<float>(t[0]);
  const std::int64_t target = targets[r];
  const bool ignored = target < 0, bad_target = target >= vocab;
  if (threadIdx.x == 0) {
    float loss = 0.0f;
    if (bad_target) {
      loss = bad_input_nan();
    } else if (!ignored) {
      loss = math::cross_entropy_loss(row_max[r], sum, target_logit[r]);
    }
    losses[r] = loss;
  }
  if (dlogits == nullptr) return;
  const std::int64_t vocab_begin = slice_begin(vocab, slices, first_slice);
  const std::int64_t cols = slice_begin(vocab, slices, first_slice + local_slices) - vocab_begin;
  const float inv_sum = 1.0f / sum;
  float scale = grad_scale;
  if (ignored) scale = 0.0f;
  if (bad_target) scale = bad_input_nan();
  // Each element is read and written by the same thread, so dlogits may equal logits.
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    dlogits[r * ld + j] = from_f32<T>(
        math::cross_entropy_dlogit(to_f32(logits[r * ld + j]), row_max[r], inv_sum, j + vocab_begin == target, scale));
  }
}

void check_rows(std::int64_t rows) {
  STRATA_CHECK(rows <= 0x7fffffff, "vocabulary-parallel cross-entropy: more rows than one CUDA grid dimension holds");
}

}  // namespace

void cross_entropy_row_max(const Launch& L, DType dtype, const void* logits_slice, std::int64_t rows,
                           std::int64_t cols, std::int64_t ld, float* row_max) {
  if (rows <= 0) return;
  check_rows(rows);
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    row_max_kernel<T><<<static_cast<unsigned>(rows), kBlockThreads, 0, scope.stream>>>(
        static_cast<const T*>(logits_slice), cols, ld, row_max);
  });
  check_launch();
}

void cross_entropy_slice_sums(const Launch& L, DType dtype, const void* logits_slice, const std::int32_t* targets,
                              std::int64_t rows, std::int64_t ld, std::int64_t vocab, std::int64_t slices,
                              std::int64_t first_slice, std::int64_t local_slices, const float* row_max, double* sums,
                              float* target_logit) {
  if (rows <= 0) return;
  check_rows(rows);
  STRATA_CHECK(local_slices >= 1 && local_slices <= 65535, "cross_entropy_slice_sums: local slices out of range");
  const StreamScope scope(L);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(local_slices));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    slice_sums_kernel<T><<<grid, kBlockThreads, 0, scope.stream>>>(static_cast<const T*>(logits_slice), targets, ld,
                                                                     vocab, slices, first_slice, local_slices, row_max,
                                                                     sums, target_logit);
  });
  check_launch();
}

void cross_entropy_finish(const Launch& L, DType dtype, const void* logits_slice, const std::int32_t* targets,
                          float* losses, void* dlogits_slice, std::int64_t rows, std::int64_t ld, std::int64_t vocab,
                          std::int64_t slices, std::int64_t first_slice, std::int64_t local_slices,
                          const float* row_max, const double* all_sums, const float* target_logit, float grad_scale) {
  if (rows <= 0) return;
  check_rows(rows);
  STRATA_CHECK(local_slices >= 1 && slices % local_slices == 0 && slices <= kMaxSlices,
               "cross_entropy_finish: slices out of range");
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    finish_kernel<T><<<static_cast<unsigned>(rows), kBlockThreads, 0, scope.stream>>>(
        static_cast<const T*>(logits_slice), targets, losses, static_cast<T*>(dlogits_slice), rows, ld, vocab, slices,
        first_slice, local_slices, row_max, all_sums, target_logit, grad_scale);
  });
  check_launch();
}

}  // namespace strata::models::cuda
