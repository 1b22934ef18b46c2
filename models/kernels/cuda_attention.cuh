// Pieces shared by the CUDA attention kernels (cuda_attention.cu: forward; cuda_attention_backward.cu:
// backward): the tile shape, the element layout of q/k/v/out/lse (the same as the CPU kernel's,
// cpu_attention.cc), fp32 tile loads into shared memory, the shared-memory row dot product, and the
// dynamic shared-memory reservation with a clear error when head_dim is too large for the GPU.
//
// Tile shape: 32 query rows by 32 keys, 128 threads (4 warps). In the score phase warp w owns query
// rows 8w .. 8w+7 of the tile and lane j owns key j, so a row's maximum and sum are warp reductions
// (cuda_common.cuh) and rows never need block barriers of their own. Shared tiles are fp32 with a
// row stride of head_dim + 1, so the 32 lanes reading 32 different key rows hit 32 different banks.
#pragma once

#include <initializer_list>
#include <string>

#include "core/error.h"
#include "models/kernels/cuda_common.cuh"

namespace strata::models::cuda::attention {

inline constexpr int kTile = 32;                        // query rows per tile = keys per tile = lanes
inline constexpr int kThreads = 128;                    // 4 warps
inline constexpr int kRowsPerWarp = kTile / (kThreads / 32);

// Index arithmetic of AttentionShape (ops.h), usable on the device.
struct Layout {
  std::int64_t seq, q_heads, kv_heads, head_dim, q_row_stride, kv_row_stride, out_row_stride, lse_heads, dkv_row_stride;

  static Layout of(const AttentionShape& s) {
    return {s.seq,           s.q_heads,        s.kv_heads,          s.head_dim,    s.q_row_stride,
            s.kv_row_stride, s.out_row_stride, s.lse_heads_or_q(), s.dkv_stride()};
  }
  __device__ std::int64_t q_index(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return (b * seq + t) * q_row_stride + h * head_dim;
  }
  __device__ std::int64_t kv_index(std::int64_t b, std::int64_t t, std::int64_t g) const {
    return (b * seq + t) * kv_row_stride + g * head_dim;
  }
  __device__ std::int64_t o_index(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return (b * seq + t) * out_row_stride + h * head_dim;
  }
  __device__ std::int64_t dkv_index(std::int64_t b, std::int64_t t, std::int64_t g) const {
    return (b * seq + t) * dkv_row_stride + g * head_dim;
  }
  __device__ std::int64_t lse_index(std::int64_t b, std::int64_t h, std::int64_t t) const {
    return (b * lse_heads + h) * seq + t;
  }
};

// dst[r][c] (row stride ld) = src[first(r) + c] * scale for r < rows, 0 for rows rows..kTile-1.
// `first` maps a tile row to the element index of its first element. Whole block participates.
template <typename T, typename First>
__device__ void load_tile(const T* src, int rows, int d, int ld, First first, float scale, float* dst) {
  for (int e = static_cast<int>(threadIdx.x); e < kTile * d; e += static_cast<int>(blockDim.x)) {
    const int r = e / d, c = e % d;
    dst[r * ld + c] = r < rows ? to_f32(src[first(r) + c]) * scale : 0.0f;
  }
}

__device__ __forceinline__ void zero_tile(int d, int ld, float* dst) {
  for (int e = static_cast<int>(threadIdx.x); e < kTile * d; e += static_cast<int>(blockDim.x)) {
    dst[(e / d) * ld + e % d] = 0.0f;
  }
}

// sum_c a[c] * b[c] in c order (the CPU kernel's tile_dot order).
__device__ __forceinline__ float row_dot(const float* a, const float* b, int d) {
  float acc = 0.0f;
  for (int c = 0; c < d; ++c) acc += a[c] * b[c];
  return acc;
}

inline int tile_count(std::int64_t seq) { return static_cast<int>((seq + kTile - 1) / kTile); }

// Checks the grid fits and the shape is consistent (plain messages: no fmt in .cu files).
inline void check_shape(const AttentionShape& s) {
  STRATA_CHECK(s.kv_heads > 0 && s.q_heads % s.kv_heads == 0, "attention: q_heads must be a multiple of kv_heads");
  STRATA_CHECK(s.head_dim > 0 && s.head_dim <= 1024, "attention: head_dim must be in 1..1024");
  STRATA_CHECK(s.lse_heads_or_q() >= s.q_heads && s.dkv_stride() >= s.kv_heads * s.head_dim,
               "attention: lse_heads below q_heads or a dK/dV row stride below the KV heads' width");
  STRATA_CHECK(s.batch <= 65535 && s.q_heads <= 65535, "attention: batch and q_heads must be at most 65535 on CUDA");
  STRATA_CHECK((s.seq + kTile - 1) / kTile <= 0x7fffffff, "attention: sequence too long for one CUDA grid");
}

// Lets `kernel` use `bytes` of dynamic shared memory on the current device, or throws DeviceError
// naming the op and head_dim when the GPU cannot give that much to one block.
template <typename Kernel>
void reserve_shared(Kernel* kernel, std::size_t bytes, std::int64_t head_dim, const char* op) {
  int device = 0, limit = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&device));
  STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > static_cast<std::size_t>(limit)) {
    throw DeviceError(std::string(op) + " on CUDA: head_dim " + std::to_string(head_dim) + " needs " +
                      std::to_string(bytes) + " bytes of shared memory per block, this GPU allows " +
                      std::to_string(limit) + "; use a smaller head_dim or the sim device");
  }
  STRATA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// The tensor-core path (cuda_attention_tc.cu): bf16 or fp16 elements, head_dim 64 or 128, and every
// row of q, k, v, out, dout and dq/dk/dv starting 16-byte aligned (row strides multiples of 8
// elements, the given pointers 16-byte aligned). Other calls take the scalar kernels.
bool tc_supported(DType dtype, const AttentionShape& s, std::initializer_list<const void*> pointers);
void tc_forward(cudaStream_t stream, DType dtype, const AttentionShape& s, const void* q, const void* k, const void* v,
                void* out, float* lse, float scale);
void tc_backward(cudaStream_t stream, DType dtype, const AttentionShape& s, const void* q, const void* k,
                 const void* v, const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv,
                 float scale);

// Note [Two tensor-core kernels]: tc_forward/tc_backward run flash-attention 2's kernels
// (cuda_attention_tc.cuh, .cu and _backward.cu: mma.sync, ldmatrix, cp.async). They pass the
// attention op tests on a GPU and run 3-4x the WMMA kernels' TFLOP/s (docs/MEASUREMENTS.md, "On the
// GPU"), so they are the default; STRATA_ATTENTION_TC=wmma (read once) takes the WMMA kernels
// (cuda_attention_tc_wmma.cu), which compute-sanitizer has checked, until fa2 has run clean under
// memcheck and racecheck too; then the WMMA kernels go. Both take the same calls and keep the same
// numerics contract (tests/models/ops_attention_cuda_test.cc runs either, tools/gpu-verify.sh both).
// STRATA_ATTENTION_TC=fa2w takes fa2's kernels with two 16-row tiles per warp (Note [Wide warps],
// models/kernels/cuda_attention_tc.cu): the forward, and the backward at head dim 64 (fa2's at 128). Opt-in
// until it has passed the op tests and been timed beside fa2 on a GPU (docs/GPU_LOG.md).
enum class TcVariant { Wmma, Fa2, Fa2Wide };
TcVariant tc_variant();
void tc_forward_wmma(cudaStream_t stream, DType dtype, const AttentionShape& s, const void* q, const void* k,
                     const void* v, void* out, float* lse, float scale);
void tc_backward_wmma(cudaStream_t stream, DType dtype, const AttentionShape& s, const void* q, const void* k,
                      const void* v, const void* out, const float* lse, const void* dout, void* dq, void* dk,
                      void* dv, float scale);

}  // namespace strata::models::cuda::attention
