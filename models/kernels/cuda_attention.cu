// CUDA causal multi-head attention, forward, flash-attention style: one block per (query tile,
// query head, batch item); keys and values stream through shared memory one 32-key tile at a time
// and each query row keeps an online softmax (running maximum m, running sum l, fp32 output
// accumulator rescaled whenever m grows), so memory is O(tile * head_dim) per block, never
// O(seq^2). The log-sum-exp m + log(l) of every row is saved for the backward pass, which
// recomputes the probabilities (cuda_attention_backward.cu). Grouped-query heads: query head h
// reads kv head h / (q_heads / kv_heads). The order of the arithmetic per row follows the CPU
// kernel (cpu_attention.cc): q pre-scaled by 1/sqrt(head_dim), dot products in channel order, the
// accumulator rescaled then updated key by key in order.
//
// Shared per-element math (also called by cpu_attention.cc): math::online_softmax_rescale,
// math::shifted_exp, math::online_softmax_lse (op_math.h); to_f32 / from_f32 (core/dtype.h).
//
// bf16 and fp16 at head_dim 64 or 128 with 16-byte aligned rows take the tensor-core kernels of
// cuda_attention_tc.cu instead (attention::tc_supported); this kernel serves fp32 (exact mode) and
// every other shape.
#include <cmath>

#include "models/kernels/cuda_attention.cuh"
#include "models/kernels/op_math.h"

namespace strata::models::cuda {
namespace {

using attention::kRowsPerWarp;
using attention::kThreads;
using attention::kTile;
using attention::Layout;

// Shared memory: q, k, v, output accumulator tiles ([kTile][head_dim + 1] fp32 each) and the
// probabilities of the current key tile ([kTile][kTile]).
std::size_t forward_shared_bytes(std::int64_t head_dim) {
  const std::size_t ld = static_cast<std::size_t>(head_dim) + 1;
  return (4 * kTile * ld + kTile * kTile) * sizeof(float);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(Layout lay, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                             T* __restrict__ out, float* __restrict__ lse, float scale) {
  extern __shared__ float smem[];
  const int d = static_cast<int>(lay.head_dim);
  const int ld = d + 1;
  float* sq = smem;
  float* sk = sq + kTile * ld;
  float* sv = sk + kTile * ld;
  float* so = sv + kTile * ld;
  float* sp = so + kTile * ld;

  const std::int64_t qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t g = h / (lay.q_heads / lay.kv_heads);
  const std::int64_t i0 = qt * kTile;
  const int rows = static_cast<int>(min(static_cast<std::int64_t>(kTile), lay.seq - i0));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;

  attention::load_tile(q, rows, d, ld, [&](int r) { return lay.q_index(b, i0 + r, h); }, scale, sq);
  attention::zero_tile(d, ld, so);
  float m[kRowsPerWarp], l[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
  }

  const std::int64_t last_query = i0 + rows - 1;
  for (std::int64_t j0 = 0; j0 <= last_query; j0 += kTile) {
    const int cols = static_cast<int>(min(static_cast<std::int64_t>(kTile), lay.seq - j0));
    __syncthreads();  // every warp is done with the previous key tile (and the q tile is loaded)
    attention::load_tile(k, cols, d, ld, [&](int j) { return lay.kv_index(b, j0 + j, g); }, 1.0f, sk);
    attention::load_tile(v, cols, d, ld, [&](int j) { return lay.kv_index(b, j0 + j, g); }, 1.0f, sv);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int j = lane;
      const bool visible = r < rows && j < cols && j0 + j <= i0 + r;  // causal: key <= query
      const float score = visible ? attention::row_dot(sq + r * ld, sk + j * ld, d) : -INFINITY;
      const float tile_max = warp_max(score);
      if (tile_max == -INFINITY) continue;  // no visible key for this row in this tile (warp-uniform)
      const float m_new = fmaxf(m[rr], tile_max);
      const float corr = math::online_softmax_rescale(m[rr], m_new);
      const float p = visible ? math::shifted_exp(score, m_new) : 0.0f;
      l[rr] = l[rr] * corr + warp_sum(p);
      m[rr] = m_new;
      sp[r * kTile + j] = p;
      __syncwarp();
      for (int c = lane; c < d; c += 32) {
        float acc = so[r * ld + c] * corr;
        for (int jj = 0; jj < cols; ++jj) acc += sp[r * kTile + jj] * sv[jj * ld + c];
        so[r * ld + c] = acc;
      }
      __syncwarp();  // sp row r is rewritten only after every lane has read it
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    if (r >= rows) continue;
    const float inv = 1.0f / l[rr];
    const std::int64_t o = lay.o_index(b, i0 + r, h);
    for (int c = lane; c < d; c += 32) out[o + c] = from_f32<T>(so[r * ld + c] * inv);
    if (lane == 0) lse[lay.lse_index(b, h, i0 + r)] = math::online_softmax_lse(m[rr], l[rr]);
  }
}

}  // namespace

void attention_forward(const Launch& L, DType dtype, const AttentionShape& shape, const void* q, const void* k,
                       const void* v, void* out, float* lse) {
  attention::check_shape(shape);
  if (shape.batch <= 0 || shape.seq <= 0 || shape.q_heads <= 0) return;
  const StreamScope scope(L);
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  if (attention::tc_supported(dtype, shape, {q, k, v, out})) {
    attention::tc_forward(scope.stream, dtype, shape, q, k, v, out, lse, scale);
    return;
  }
  const std::size_t shared_bytes = forward_shared_bytes(shape.head_dim);
  const dim3 grid(static_cast<unsigned>(attention::tile_count(shape.seq)), static_cast<unsigned>(shape.q_heads),
                  static_cast<unsigned>(shape.batch));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    attention::reserve_shared(attention_forward_kernel<T>, shared_bytes, shape.head_dim, "attention_forward");
    attention_forward_kernel<T><<<grid, kThreads, shared_bytes, scope.stream>>>(
        Layout::of(shape), static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
        static_cast<T*>(out), lse, scale);
  });
  check_launch();
}

}  // namespace strata::models::cuda
