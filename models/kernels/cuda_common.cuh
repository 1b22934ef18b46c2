// Device-side helpers shared by the .cu files of the op set (included only by nvcc-compiled code):
// dtype dispatch to a kernel template, deterministic warp and block reductions, launch shapes,
// and the guard that makes the launch stream's device current. Element loads and stores are
// core/dtype.h's to_f32 / from_f32, the scalar conversions the host tests check bit for bit.
//
// Determinism: every reduction here has one fixed shape for a fixed blockDim (xor-butterfly over
// the 32 lanes, then over the warps in order), and IEEE addition is commutative, so all lanes end
// with the same bits and every run gives the same result. No kernel of the op set uses atomics.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/dtype.h"
#include "models/kernels/cuda_kernels.h"

namespace strata::models::cuda {

// Threads per block of the element and row kernels (a multiple of 32, at most 1024).
inline constexpr int kBlockThreads = 256;
// Grid-stride element kernels cap their grid here; longer arrays loop.
inline constexpr std::int64_t kMaxElementBlocks = std::int64_t{1} << 16;

// Calls f(T{}) with T the element type of `dtype`.
template <typename F>
void dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(bf16{}); return;
    case DType::F16: f(fp16{}); return;
  }
  STRATA_CHECK(false, "unknown dtype in a CUDA model op");
}

inline unsigned element_blocks(std::int64_t n) {
  return static_cast<unsigned>(std::min(kMaxElementBlocks, (n + kBlockThreads - 1) / kBlockThreads));
}

// The launch stream, with its device made current for the lifetime of the scope (a kernel must be
// launched on the device that owns its stream; Strata never relies on a global current device).
class StreamScope {
 public:
  explicit StreamScope(const Launch& launch) : stream(static_cast<cudaStream_t>(launch.stream)) {
    int stream_device = 0;
    STRATA_CUDA_CHECK(cudaStreamGetDevice(stream, &stream_device));
    STRATA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (stream_device != previous_) {
      STRATA_CUDA_CHECK(cudaSetDevice(stream_device));
      restore_ = true;
    }
  }
  ~StreamScope() {
    if (restore_) (void)cudaSetDevice(previous_);
  }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

  const cudaStream_t stream;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// Throws InternalError if the kernel launch just made failed (bad configuration, no device code
// for this GPU). Asynchronous faults surface at the stream's next synchronize.
inline void check_launch() { STRATA_CUDA_CHECK(cudaGetLastError()); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum of `v` over the block, returned to every thread. `scratch` is __shared__ float[32]. Every
// thread of the block must call it (it synchronizes the block).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call's readers of scratch are done
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? scratch[lane] : 0.0f);
}

// Maximum of `v` over the block, returned to every thread (same contract as block_sum).
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? scratch[lane] : -INFINITY);
}

// The bf16/fp16 parameter-gradient column sums (bias: cuda_matmul.cu; norm weights and bias:
// cuda_norm.cu; never exact mode, which is fp32 only): blocks of kSplitWarps warps over 32 columns,
// warp w summing rows w, w + kSplitWarps, ... of its lane's column. A fixed order (the same bits
// every run), not the serial row order the fp32 kernels keep for exact mode.
inline constexpr int kSplitWarps = 32;
inline unsigned split_blocks(std::int64_t cols) { return static_cast<unsigned>((cols + 31) / 32); }

// Each thread passes its warp's N partial sums of its lane's column; warp 0 gets, in `v`, the
// sums over the warps in warp order and true, every other warp false. The whole block calls it.
template <int N>
__device__ __forceinline__ bool sum_warp_partials(float (&v)[N]) {
  __shared__ float partial[N][kSplitWarps][32];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
#pragma unroll
  for (int i = 0; i < N; ++i) partial[i][warp][lane] = v[i];
  __syncthreads();
  if (warp != 0) return false;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float total = 0.0f;
    for (int w = 0; w < kSplitWarps; ++w) total += partial[i][w][lane];
    v[i] = total;
  }
  return true;
}

// NaN marks bad input a kernel cannot throw for (see cuda_kernels.h).
__device__ __forceinline__ float bad_input_nan() { return __int_as_float(0x7fc00000); }

}  // namespace strata::models::cuda
