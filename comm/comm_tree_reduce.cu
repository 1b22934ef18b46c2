// CUDA tree reduction over ranks' contributions (Note [Deterministic reduction] in comm/communicator.h): each thread
// loads one element from every rank and combines them on the same pairwise tree as the host code,
// with the same per-element math (comm/reduce_math.h) and the same dtype rounding (core/dtype.h).
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "core/dtype.h"
#include "comm/comm_tree_reduce.h"
#include "comm/reduce_math.h"

namespace strata {
namespace {

constexpr int kMaxWorld = 64;

template <typename T>
__global__ void tree_reduce_kernel(const T* parts, int world, T* out, std::size_t count, int op) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  float t[kMaxWorld];
  for (int r = 0; r < world; ++r) t[r] = to_f32(parts[static_cast<std::size_t>(r) * count + i]);
  for (int stride = 1; stride < world; stride *= 2) {
    for (int r = 0; r + stride < world; r += 2 * stride) t[r] = combine_partials(t[r], t[r + stride], op);
  }
  out[i] = from_f32<T>(t[0]);
}

}  // namespace

void launch_tree_reduce(const void* parts, int world, void* out, std::size_t count, DType dtype, int op,
                        void* cuda_stream) {
  STRATA_CHECK(world >= 1 && world <= kMaxWorld, "tree reduction supports 1..64 ranks");
  if (count == 0) return;
  const int threads = 256;
  const auto blocks = static_cast<unsigned>((count + threads - 1) / threads);
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  switch (dtype) {
    case DType::F32:
      tree_reduce_kernel<float><<<blocks, threads, 0, stream>>>(static_cast<const float*>(parts), world, static_cast<float*>(out), count, op);
      break;
    case DType::BF16:
      tree_reduce_kernel<bf16><<<blocks, threads, 0, stream>>>(static_cast<const bf16*>(parts), world, static_cast<bf16*>(out), count, op);
      break;
    case DType::F16:
      tree_reduce_kernel<fp16><<<blocks, threads, 0, stream>>>(static_cast<const fp16*>(parts), world, static_cast<fp16*>(out), count, op);
      break;
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata
