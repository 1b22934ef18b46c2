// CUDA kernels of the engine's device ops (see engine/device_ops.h and device_ops_cuda.h): the
// left-operand add, the fused widen-and-add, and the per-block sums of squares. Element math is
// core/dtype.h's to_f32 (the function the host suite checks) and one fp32 add; the sum of squares
// follows the lane rule of optim/cpu_kernels.h (kSumLanes), Note [Lanes on the GPU].
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/dtype.h"
#include "core/dtype_convert.h"
#include "engine/device_ops_cuda.h"
#include "optim/cpu_kernels.h"
#include "optim/exact_squares.h"

namespace strata::device_ops::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
// Enough blocks to fill any current GPU several times over; larger arrays loop (grid stride).
constexpr std::size_t kMaxBlocks = 65535;

unsigned grid_for(std::size_t n) {
  return static_cast<unsigned>(std::min(kMaxBlocks, (n + kThreadsPerBlock - 1) / kThreadsPerBlock));
}

__global__ void add_left_kernel(float* __restrict__ dst, const float* __restrict__ left, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = left[i] + dst[i];
  }
}

template <typename Src>
__global__ void convert_add_left_kernel(const Src* __restrict__ src, float* __restrict__ dst, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = to_f32(src[i]) + dst[i];
  }
}

// Note [Lanes on the GPU]: the CPU sums a block of kCpuBlockElems gradients in kSumLanes double
// accumulators, element i into lane i % kSumLanes in increasing i, and adds the lanes 0..15 in
// order onto 0.0 (optim/cpu_kernels.h). Here one thread is one lane of one block and walks its
// elements in the same increasing order, so every lane holds the CPU's bits; lane 0's thread then
// adds the block's lanes in the CPU's order. (double)x * x is exact for any fp32 x, so a fused
// multiply-add that nvcc may form from `acc += x * x` rounds exactly like the CPU's add. Blocks
// never share a lane, so how many blocks one CUDA block covers changes nothing.
constexpr int kLanes = static_cast<int>(optim::detail::kSumLanes);
constexpr int kSumBlocksPerCta = 8;
constexpr int kSumThreads = kLanes * kSumBlocksPerCta;

template <typename G>
__global__ void __launch_bounds__(kSumThreads)
    block_sum_squares_kernel(const G* __restrict__ grad, std::size_t n, std::size_t block_elems,
                             std::size_t blocks, double* __restrict__ out) {
  __shared__ double lanes[kSumThreads];
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int local_block = static_cast<int>(threadIdx.x) / kLanes;
  const std::size_t block = static_cast<std::size_t>(blockIdx.x) * kSumBlocksPerCta + local_block;
  double acc = 0.0;
  if (block < blocks) {
    const std::size_t begin = block * block_elems;
    const std::size_t len = std::min(block_elems, n - begin);
    for (std::size_t i = static_cast<std::size_t>(lane); i < len; i += kLanes) {
      const double x = to_f32(grad[begin + i]);  // widening is exact: the fp32 gradient's bits
      acc += x * x;
    }
  }
  lanes[threadIdx.x] = acc;
  __syncthreads();
  if (lane == 0 && block < blocks) {
    double total = 0.0;
    for (int l = 0; l < kLanes; ++l) total += lanes[local_block * kLanes + l];
    out[block] = total;
  }
}

// Note [Exact sum of squares] in optim/exact_squares.h on the GPU: every thread adds its squares' pieces (the host's
// square_pieces) into the CTA's shared words with 64-bit integer atomics, and the CTA adds its words
// into the run's accumulator in global memory. Integer addition is associative, so the order the
// atomics land in cannot change the sum. A run holds at most optim::kExactMaxAdds elements, so no
// word wraps before the host normalizes it.
constexpr int kExactWords = optim::kExactDigits + 1;  // the digits, then the non-finite count
static_assert(sizeof(optim::ExactSquares) == kExactWords * sizeof(std::uint64_t));

template <typename G>
__global__ void exact_sum_squares_kernel(const G* __restrict__ grad, std::size_t n, std::size_t run_elems,
                                         unsigned long long* __restrict__ out) {
  __shared__ unsigned long long words[kExactWords];
  if (threadIdx.x < kExactWords) words[threadIdx.x] = 0;
  __syncthreads();
  // One grid row of CTAs per run, so a CTA's elements all belong to run blockIdx.y.
  const std::size_t begin = static_cast<std::size_t>(blockIdx.y) * run_elems;
  const std::size_t end = begin + run_elems < n ? begin + run_elems : n;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = begin + static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < end;
       i += stride) {
    optim::SquarePieces p;
    if (!optim::square_pieces(to_f32(grad[i]), p)) {
      atomicAdd(&words[kExactWords - 1], 1ull);
      continue;
    }
    for (int k = 0; k < 3; ++k) {
      if (p.piece[k] != 0) atomicAdd(&words[p.word + k], static_cast<unsigned long long>(p.piece[k]));
    }
  }
  __syncthreads();
  if (threadIdx.x < kExactWords && words[threadIdx.x] != 0) {
    atomicAdd(&out[static_cast<std::size_t>(blockIdx.y) * kExactWords + threadIdx.x], words[threadIdx.x]);
  }
}

}  // namespace

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n_elems, void* stream) {
  strata::cuda::convert_async(src, src_dtype, dst, dst_dtype, n_elems, stream);
}

void add_left(float* dst, const float* left, std::size_t n_elems, void* stream) {
  if (n_elems == 0) return;
  add_left_kernel<<<grid_for(n_elems), kThreadsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(dst, left, n_elems);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void convert_add_left(const void* src, DType src_dtype, float* dst, std::size_t n_elems, void* stream) {
  if (n_elems == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = grid_for(n_elems);
  switch (src_dtype) {
    case DType::F32:
      convert_add_left_kernel<float><<<grid, kThreadsPerBlock, 0, s>>>(static_cast<const float*>(src), dst, n_elems);
      break;
    case DType::BF16:
      convert_add_left_kernel<bf16><<<grid, kThreadsPerBlock, 0, s>>>(static_cast<const bf16*>(src), dst, n_elems);
      break;
    case DType::F16:
      convert_add_left_kernel<fp16><<<grid, kThreadsPerBlock, 0, s>>>(static_cast<const fp16*>(src), dst, n_elems);
      break;
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void block_sum_squares(const void* grad, DType grad_dtype, std::size_t n_elems, std::size_t block_elems,
                       double* out_device, void* stream) {
  if (n_elems == 0) return;
  STRATA_CHECK(block_elems > 0, "block_sum_squares with a block of 0 elements");
  const std::size_t blocks = (n_elems + block_elems - 1) / block_elems;
  const std::size_t ctas = (blocks + kSumBlocksPerCta - 1) / kSumBlocksPerCta;
  STRATA_CHECK(ctas <= 0x7FFFFFFFu, "block_sum_squares: too many blocks for one launch");
  const auto s = static_cast<cudaStream_t>(stream);
  const auto grid = static_cast<unsigned>(ctas);
  switch (grad_dtype) {
    case DType::F32:
      block_sum_squares_kernel<<<grid, kSumThreads, 0, s>>>(static_cast<const float*>(grad), n_elems, block_elems,
                                                             blocks, out_device);
      break;
    case DType::BF16:
      block_sum_squares_kernel<<<grid, kSumThreads, 0, s>>>(static_cast<const bf16*>(grad), n_elems, block_elems,
                                                             blocks, out_device);
      break;
    case DType::F16:
      block_sum_squares_kernel<<<grid, kSumThreads, 0, s>>>(static_cast<const fp16*>(grad), n_elems, block_elems,
                                                             blocks, out_device);
      break;
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void exact_sum_squares(const void* grad, DType grad_dtype, std::size_t n_elems, std::uint64_t* out_device,
                       void* stream) {
  if (n_elems == 0) return;
  const std::size_t runs = (n_elems + optim::kExactMaxAdds - 1) / optim::kExactMaxAdds;
  STRATA_CHECK(runs <= 65535, "exact_sum_squares: too many elements for one launch");
  const std::size_t run_elems = std::min<std::size_t>(n_elems, optim::kExactMaxAdds);
  const dim3 grid(grid_for(run_elems), static_cast<unsigned>(runs));
  const auto s = static_cast<cudaStream_t>(stream);
  auto* out = reinterpret_cast<unsigned long long*>(out_device);
  switch (grad_dtype) {
    case DType::F32:
      exact_sum_squares_kernel<<<grid, kThreadsPerBlock, 0, s>>>(static_cast<const float*>(grad), n_elems,
                                                                  optim::kExactMaxAdds, out);
      break;
    case DType::BF16:
      exact_sum_squares_kernel<<<grid, kThreadsPerBlock, 0, s>>>(static_cast<const bf16*>(grad), n_elems,
                                                                  optim::kExactMaxAdds, out);
      break;
    case DType::F16:
      exact_sum_squares_kernel<<<grid, kThreadsPerBlock, 0, s>>>(static_cast<const fp16*>(grad), n_elems,
                                                                  optim::kExactMaxAdds, out);
      break;
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::device_ops::cuda
