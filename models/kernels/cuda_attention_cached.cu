// CUDA attention of new query rows over a key/value cache (ops.h attention_cached; Note [KV cache] in
// models/kv_decoder.h in models/kv_decoder.h): one warp per (query row, query head). Lane j scores key j of each
// 32-key tile (a dot product in channel order of the pre-scaled query and the key, as the CPU
// kernel's tile_dot), the tile's maximum is a warp reduction, every lane adds the tile's
// probabilities in key order (the CPU kernel's running sum), and lane c owns channels c, c+32, ...
// of the output accumulator, rescaled then updated key by key in order. So each row follows the
// CPU kernel's order of arithmetic (cpu_attention.cc forward_query_tile) step by step.
//
// Decoding reads the whole cache once per token, so this kernel is bound by the cache's bytes, not
// by arithmetic; it keeps no tiles in shared memory beyond the query, the tile's probabilities and
// the accumulator. Written without a GPU: compiled here, checked against the CPU kernel by
// tests/models/ops_attention_cuda_test.cc (label gpu), not yet run on one.
//
// Shared per-element math (also called by cpu_attention.cc): math::online_softmax_rescale,
// math::shifted_exp (op_math.h); to_f32 / from_f32 (core/dtype.h).
#include <cmath>

#include "models/kernels/cuda_common.cuh"
#include "models/kernels/op_math.h"

namespace strata::models::cuda {
namespace {

constexpr int kKeys = 32;  // keys per tile = lanes

// Shared memory: the scaled query [head_dim], the accumulator [head_dim], the tile's probabilities [32].
std::size_t cached_shared_bytes(std::int64_t head_dim) {
  return (2 * static_cast<std::size_t>(head_dim) + kKeys) * sizeof(float);
}

template <typename T>
__global__ void __launch_bounds__(32)
    attention_cached_kernel(CachedAttentionShape s, const T* __restrict__ q, const T* __restrict__ k,
                            const T* __restrict__ v, T* __restrict__ out, float scale) {
  extern __shared__ float smem[];
  const int d = static_cast<int>(s.head_dim);
  float* sq = smem;
  float* acc = sq + d;
  float* sp = acc + d;
  const int lane = static_cast<int>(threadIdx.x);
  const std::int64_t h = blockIdx.x, i = blockIdx.y;
  const std::int64_t g = h / (s.q_heads / s.kv_heads);
  const std::int64_t pos = s.kv_len - s.q_rows + i;  // this row's position; it attends keys 0..pos
  const T* qrow = q + i * s.q_row_stride + h * d;
  for (int c = lane; c < d; c += 32) {
    sq[c] = to_f32(qrow[c]) * scale;
    acc[c] = 0.0f;
  }
  __syncwarp();
  float m = -INFINITY, l = 0.0f;
  for (std::int64_t j0 = 0; j0 <= pos; j0 += kKeys) {
    const int last = static_cast<int>(min(static_cast<std::int64_t>(kKeys), pos - j0 + 1));
    float score = -INFINITY;
    if (lane < last) {
      const T* krow = k + (j0 + lane) * s.kv_row_stride + g * d;
      float dot = 0.0f;
      for (int c = 0; c < d; ++c) dot += sq[c] * to_f32(krow[c]);
      score = dot;
    }
    const float m_new = fmaxf(m, warp_max(score));
    const float corr = math::online_softmax_rescale(m, m_new);
    sp[lane] = lane < last ? math::shifted_exp(score, m_new) : 0.0f;
    __syncwarp();
    float sum = 0.0f;
    for (int j = 0; j < last; ++j) sum += sp[j];
    for (int c = lane; c < d; c += 32) {
      float a = acc[c] * corr;
      for (int j = 0; j < last; ++j) a += sp[j] * to_f32(v[(j0 + j) * s.kv_row_stride + g * d + c]);
      acc[c] = a;
    }
    l = l * corr + sum;
    m = m_new;
    __syncwarp();  // every lane has read sp before the next tile writes it
  }
  const float inv = 1.0f / l;
  T* orow = out + i * s.out_row_stride + h * d;
  for (int c = lane; c < d; c += 32) orow[c] = from_f32<T>(acc[c] * inv);
}

}  // namespace

void attention_cached(const Launch& L, DType dtype, const CachedAttentionShape& shape, const void* q,
                      const void* k_cache, const void* v_cache, void* out) {
  STRATA_CHECK(shape.kv_heads > 0 && shape.q_heads % shape.kv_heads == 0,
               "attention_cached: q_heads must be a multiple of kv_heads");
  STRATA_CHECK(shape.head_dim > 0 && shape.head_dim <= 4096, "attention_cached: head_dim must be in 1..4096");
  STRATA_CHECK(shape.q_rows >= 1 && shape.q_rows <= shape.kv_len && shape.q_rows <= 65535 &&
                   shape.q_heads <= 0x7fffffff,
               "attention_cached: q_rows must be in 1..min(kv_len, 65535)");
  const StreamScope scope(L);
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  const dim3 grid(static_cast<unsigned>(shape.q_heads), static_cast<unsigned>(shape.q_rows));
  const std::size_t shared_bytes = cached_shared_bytes(shape.head_dim);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    attention_cached_kernel<T><<<grid, 32, shared_bytes, scope.stream>>>(
        shape, static_cast<const T*>(q), static_cast<const T*>(k_cache), static_cast<const T*>(v_cache),
        static_cast<T*>(out), scale);
  });
  check_launch();
}

}  // namespace strata::models::cuda
