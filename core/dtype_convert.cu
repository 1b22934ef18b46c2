// CUDA kernels for element-type conversions (see core/dtype_convert.h). One grid-stride kernel
// templated on the source and destination types; the per-element work is to_f32 / from_f32 from
// core/dtype.h, the functions the host tests check bit for bit, so there is no device-only
// rounding code to get wrong.
#include "core/dtype_convert.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/dtype.h"

namespace strata::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
// Enough blocks to fill any current GPU several times over; larger arrays loop (grid stride).
constexpr std::size_t kMaxBlocks = 65535;

template <typename Src, typename Dst>
__global__ void convert_kernel(const Src* __restrict__ src, Dst* __restrict__ dst, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = from_f32<Dst>(to_f32(src[i]));
  }
}

template <typename Src, typename Dst>
void launch(const void* src, void* dst, std::size_t n, cudaStream_t stream) {
  const std::size_t blocks = std::min(kMaxBlocks, (n + kThreadsPerBlock - 1) / kThreadsPerBlock);
  convert_kernel<Src, Dst><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
      static_cast<const Src*>(src), static_cast<Dst*>(dst), n);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

template <typename Src>
void launch_to(const void* src, DType dst_dtype, void* dst, std::size_t n, cudaStream_t stream) {
  switch (dst_dtype) {
    case DType::F32: return launch<Src, float>(src, dst, n, stream);
    case DType::BF16: return launch<Src, bf16>(src, dst, n, stream);
    case DType::F16: return launch<Src, fp16>(src, dst, n, stream);
  }
  STRATA_CHECK(false, "unknown destination dtype");
}

}  // namespace

void convert_async(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n_elems, void* stream) {
  if (n_elems == 0) return;
  // (Plain message: .cu files have no fmt, see core/error.h.)
  STRATA_CHECK(src != nullptr && dst != nullptr, "dtype conversion on the device with a null pointer");
  auto* s = static_cast<cudaStream_t>(stream);
  if (src_dtype == dst_dtype) {
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, n_elems * dtype_bytes(src_dtype), cudaMemcpyDeviceToDevice, s));
    return;
  }
  switch (src_dtype) {
    case DType::F32: return launch_to<float>(src, dst_dtype, dst, n_elems, s);
    case DType::BF16: return launch_to<bf16>(src, dst_dtype, dst, n_elems, s);
    case DType::F16: return launch_to<fp16>(src, dst_dtype, dst, n_elems, s);
  }
  STRATA_CHECK(false, "unknown source dtype");
}

}  // namespace strata::cuda
