// CUDA causal multi-head attention, backward. Recomputes each (query tile, key tile) of
// probabilities from q, k and the forward's saved log-sum-exp, so memory stays O(tile * head_dim)
// per block. Like the CPU kernel (cpu_attention.cc), two kernels keep every output element written
// by exactly one thread, so there are no atomics and the result is the same every run:
//  * dkdv: one block per (key tile, kv head, batch item) sums dV += P^T dO and dK += dS^T (scale q)
//    over the query heads of its group and the query tiles from its own onwards, in that order;
//  * dq: one block per (query tile, query head, batch item) sums dQ += dS K over key tiles up to its
//    own, then scales by 1/sqrt(head_dim).
// delta = sum_c dout * out of each query row (the softmax-backward row term) is recomputed where a
// tile needs it instead of being stored, which keeps the op free of scratch memory.
//
// Shared per-element math (also called by cpu_attention.cc): math::attention_prob,
// math::attention_dscore (op_math.h); to_f32 / from_f32 (core/dtype.h).
#include <cmath>

#include "models/kernels/cuda_attention.cuh"
#include "models/kernels/op_math.h"

namespace strata::models::cuda {
namespace {

using attention::kRowsPerWarp;
using attention::kThreads;
using attention::kTile;
using attention::Layout;

// dkdv: k, v, q, dout tiles and the dK, dV accumulators ([kTile][head_dim + 1] each), P and dS.
std::size_t dkdv_shared_bytes(std::int64_t head_dim) {
  const std::size_t ld = static_cast<std::size_t>(head_dim) + 1;
  return (6 * kTile * ld + 2 * kTile * kTile) * sizeof(float);
}
// dq: q, dout, k, v tiles and the dQ accumulator, and dS.
std::size_t dq_shared_bytes(std::int64_t head_dim) {
  const std::size_t ld = static_cast<std::size_t>(head_dim) + 1;
  return (5 * kTile * ld + kTile * kTile) * sizeof(float);
}

// delta of tile row r (< rows), from the dout tile in shared memory and `out` in global memory;
// the whole warp calls it and gets the same value.
template <typename T>
__device__ float row_delta(const float* sdo_row, const T* out, std::int64_t out_first, int d, int lane) {
  float part = 0.0f;
  for (int c = lane; c < d; c += 32) part += sdo_row[c] * to_f32(out[out_first + c]);
  return warp_sum(part);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(Layout lay, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const T* __restrict__ out, const float* __restrict__ lse, const T* __restrict__ dout,
                          T* dk, T* dv, float scale) {
  extern __shared__ float smem[];
  const int d = static_cast<int>(lay.head_dim);
  const int ld = d + 1;
  float* sk = smem;
  float* sv = sk + kTile * ld;
  float* sq = sv + kTile * ld;
  float* sdo = sq + kTile * ld;
  float* sdk = sdo + kTile * ld;
  float* sdv = sdk + kTile * ld;
  float* sp = sdv + kTile * ld;
  float* sds = sp + kTile * kTile;

  const std::int64_t kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  const std::int64_t group = lay.q_heads / lay.kv_heads;
  const std::int64_t j0 = kt * kTile;
  const int cols = static_cast<int>(min(static_cast<std::int64_t>(kTile), lay.seq - j0));
  const std::int64_t tiles = (lay.seq + kTile - 1) / kTile;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;

  attention::load_tile(k, cols, d, ld, [&](int j) { return lay.kv_index(b, j0 + j, g); }, 1.0f, sk);
  attention::load_tile(v, cols, d, ld, [&](int j) { return lay.kv_index(b, j0 + j, g); }, 1.0f, sv);
  attention::zero_tile(d, ld, sdk);
  attention::zero_tile(d, ld, sdv);

  for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (std::int64_t qt = kt; qt < tiles; ++qt) {  // causal: earlier query tiles see none of these keys
      const std::int64_t i0 = qt * kTile;
      const int rows = static_cast<int>(min(static_cast<std::int64_t>(kTile), lay.seq - i0));
      __syncthreads();  // the previous accumulation step is done with sq, sdo, sp, sds
      attention::load_tile(q, rows, d, ld, [&](int r) { return lay.q_index(b, i0 + r, h); }, scale, sq);
      attention::load_tile(dout, rows, d, ld, [&](int r) { return lay.o_index(b, i0 + r, h); }, 1.0f, sdo);
      __syncthreads();
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int r = warp * kRowsPerWarp + rr;
        const int j = lane;
        float p = 0.0f, ds = 0.0f;
        if (r < rows) {  // warp-uniform
          const float delta = row_delta(sdo + r * ld, out, lay.o_index(b, i0 + r, h), d, lane);
          const float row_lse = lse[lay.lse_index(b, h, i0 + r)];
          if (j < cols && j0 + j <= i0 + r) {
            p = math::attention_prob(attention::row_dot(sq + r * ld, sk + j * ld, d), row_lse);
            ds = math::attention_dscore(p, attention::row_dot(sdo + r * ld, sv + j * ld, d), delta);
          }
        }
        sp[r * kTile + j] = p;
        sds[r * kTile + j] = ds;
      }
      __syncthreads();
      // Each thread owns fixed (key, channel) elements of the accumulators and adds the query rows
      // in order: the CPU kernel's summation order.
      for (int e = static_cast<int>(threadIdx.x); e < cols * d; e += kThreads) {
        const int j = e / d, c = e % d;
        float dv_acc = sdv[j * ld + c], dk_acc = sdk[j * ld + c];
        for (int r = 0; r < rows; ++r) {
          dv_acc += sp[r * kTile + j] * sdo[r * ld + c];
          dk_acc += sds[r * kTile + j] * sq[r * ld + c];
        }
        sdv[j * ld + c] = dv_acc;
        sdk[j * ld + c] = dk_acc;
      }
    }
  }
  // Same (key, channel) ownership as the accumulation: no barrier needed before the write-out.
  for (int e = static_cast<int>(threadIdx.x); e < cols * d; e += kThreads) {
    const int j = e / d, c = e % d;
    const std::int64_t base = lay.dkv_index(b, j0 + j, g);
    dk[base + c] = from_f32<T>(sdk[j * ld + c]);
    dv[base + c] = from_f32<T>(sdv[j * ld + c]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(Layout lay, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                        const T* __restrict__ out, const float* __restrict__ lse, const T* __restrict__ dout, T* dq,
                        float scale) {
  extern __shared__ float smem[];
  const int d = static_cast<int>(lay.head_dim);
  const int ld = d + 1;
  float* sq = smem;
  float* sdo = sq + kTile * ld;
  float* sk = sdo + kTile * ld;
  float* sv = sk + kTile * ld;
  float* sdq = sv + kTile * ld;
  float* sds = sdq + kTile * ld;

  const std::int64_t qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t g = h / (lay.q_heads / lay.kv_heads);
  const std::int64_t i0 = qt * kTile;
  const int rows = static_cast<int>(min(static_cast<std::int64_t>(kTile), lay.seq - i0));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;

  attention::load_tile(q, rows, d, ld, [&](int r) { return lay.q_index(b, i0 + r, h); }, scale, sq);
  attention::load_tile(dout, rows, d, ld, [&](int r) { return lay.o_index(b, i0 + r, h); }, 1.0f, sdo);
  attention::zero_tile(d, ld, sdq);
  __syncthreads();
  float delta[kRowsPerWarp], row_lse[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    delta[rr] = 0.0f;
    row_lse[rr] = 0.0f;
    if (r < rows) {  // warp-uniform
      delta[rr] = row_delta(sdo + r * ld, out, lay.o_index(b, i0 + r, h), d, lane);
      row_lse[rr] = lse[lay.lse_index(b, h, i0 + r)];
    }
  }

  for (std::int64_t kt = 0; kt <= static_cast<std::int64_t>(qt); ++kt) {
    const std::int64_t j0 = kt * kTile;
    const int cols = static_cast<int>(min(static_cast<std::int64_t>(kTile), lay.seq - j0));
    __syncthreads();  // every warp is done with the previous key tile
    attention::load_tile(k, cols, d, ld, [&](int j) { return lay.kv_index(b, j0 + j, g); }, 1.0f, sk);
    attention::load_tile(v, cols, d, ld, [&](int j) { return lay.kv_index(b, j0 + j, g); }, 1.0f, sv);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      if (r >= rows) continue;  // warp-uniform
      const int j = lane;
      float ds = 0.0f;
      if (j < cols && j0 + j <= i0 + r) {
        const float p = math::attention_prob(attention::row_dot(sq + r * ld, sk + j * ld, d), row_lse[rr]);
        ds = math::attention_dscore(p, attention::row_dot(sdo + r * ld, sv + j * ld, d), delta[rr]);
      }
      sds[r * kTile + j] = ds;
      __syncwarp();
      for (int c = lane; c < d; c += 32) {
        float acc = sdq[r * ld + c];
        for (int jj = 0; jj < cols; ++jj) acc += sds[r * kTile + jj] * sk[jj * ld + c];
        sdq[r * ld + c] = acc;
      }
      __syncwarp();  // sds row r is rewritten only after every lane has read it
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    if (r >= rows) continue;
    const std::int64_t base = lay.q_index(b, i0 + r, h);
    for (int c = lane; c < d; c += 32) dq[base + c] = from_f32<T>(sdq[r * ld + c] * scale);
  }
}

}  // namespace

void attention_backward(const Launch& L, DType dtype, const AttentionShape& shape, const void* q, const void* k,
                        const void* v, const void* out, const float* lse, const void* dout, void* dq, void* dk,
                        void* dv) {
  attention::check_shape(shape);
  if (shape.batch <= 0 || shape.seq <= 0 || shape.q_heads <= 0) return;
  const StreamScope scope(L);
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  if (attention::tc_supported(dtype, shape, {q, k, v, out, dout, dq, dk, dv})) {
    attention::tc_backward(scope.stream, dtype, shape, q, k, v, out, lse, dout, dq, dk, dv, scale);
    return;
  }
  const unsigned tiles = static_cast<unsigned>(attention::tile_count(shape.seq));
  const dim3 dkdv_grid(tiles, static_cast<unsigned>(shape.kv_heads), static_cast<unsigned>(shape.batch));
  const dim3 dq_grid(tiles, static_cast<unsigned>(shape.q_heads), static_cast<unsigned>(shape.batch));
  const std::size_t dkdv_bytes = dkdv_shared_bytes(shape.head_dim);
  const std::size_t dq_bytes = dq_shared_bytes(shape.head_dim);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto* qt = static_cast<const T*>(q);
    const auto* kt = static_cast<const T*>(k);
    const auto* vt = static_cast<const T*>(v);
    const auto* ot = static_cast<const T*>(out);
    const auto* dot = static_cast<const T*>(dout);
    attention::reserve_shared(attention_dkdv_kernel<T>, dkdv_bytes, shape.head_dim, "attention_backward");
    attention::reserve_shared(attention_dq_kernel<T>, dq_bytes, shape.head_dim, "attention_backward");
    attention_dkdv_kernel<T><<<dkdv_grid, kThreads, dkdv_bytes, scope.stream>>>(
        Layout::of(shape), qt, kt, vt, ot, lse, dot, static_cast<T*>(dk), static_cast<T*>(dv), scale);
    check_launch();
    attention_dq_kernel<T><<<dq_grid, kThreads, dq_bytes, scope.stream>>>(Layout::of(shape), qt, kt, vt, ot, lse,
                                                                         dot, static_cast<T*>(dq), scale);
    check_launch();
  });
}

}  // namespace strata::models::cuda
