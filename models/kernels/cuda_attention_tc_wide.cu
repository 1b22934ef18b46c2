// Flash-attention 2's forward with two 16-row tiles per warp (STRATA_ATTENTION_TC=fa2w; Note [Wide
// warps]). The backward of that variant (cuda_attention_tc_wide_backward.cu at head dim 64, fa2's
// cuda_attention_tc_backward.cu at 128) takes the same contract: out, and lse in natural-log units.
//
// Note [Wide warps]: in fa2's forward (cuda_attention_tc.cu) a warp owns 16 query rows, so every K
// or V fragment it loads with ldmatrix feeds one m16n8k16 product. On an H100 an ldmatrix .x4 moves
// 512 bytes through shared memory's 128 bytes per clock (4 clocks) while an mma.sync m16n8k16 takes
// about 1.5-2: per 16-column step of S = Q K^T over 64 keys a warp issued 5 ldmatrix (1 for Q, 4
// for K) for 8 products (0.56 ldmatrix a product over S and P V), so shared memory, not the tensor
// cores, bounds the kernel. It measured 14-21 % of cuBLAS's GEMM rate there (docs/MEASUREMENTS.md).
// Here a block still covers 128 query rows, with 4 warps of 32 rows: each K or V fragment feeds two
// products, the layout flash-attention 2's own forward uses: 0.31 ldmatrix a product at head dim 64
// (S: 2 for Q and 4 for K per 16 products), 0.375 at 128 (32 keys a step: 2 for Q and 2 for K per
// 8), so the larger gain is expected at 64. Occupancy is unchanged: 8 warps per SM (2 blocks of
// 128 threads at 255 registers, against 1 of 256 at 180-242). The probabilities are exp2 of the
// raw scores times scale * log2(e) less the running maximum so scaled: one FFMA and one ex2.approx
// .ftz each (no denormal handling: a probability under 2^-126 becomes 0), where expf's range
// reduction costs several instructions more; the maximum is kept on raw scores (scale > 0, so it
// commutes). lse = m * scale + log(l), as the backward recomputes p = exp(s * scale - lse). The
// probabilities differ from fa2's by fp32 rounding (the products s * scale * log2(e) round
// differently: tens of ulps where |m * scale| is large), far below the rounding of P to the element
// type for P V.
// Written without a GPU (2026-11-27): opt-in until it has passed the attention op tests and been
// timed beside fa2 on one (tools/gpu-verify.sh and tools/gpu-bench.sh run it).
#include <cmath>

#include "models/kernels/cuda_attention_tc.cuh"

namespace strata::models::cuda {
namespace tc_kernels {
namespace {

constexpr int kWideTiles = 2;                          // 16-row tiles per warp
constexpr int kWideWarps = kBM / (16 * kWideTiles);    // 4
constexpr int kWideThreads = kWideWarps * 32;          // 128
constexpr float kLog2e = 1.4426950408889634f;

// 2^x by one MUFU.EX2, subnormal results flushed to 0 (exp2f adds their scaling); 2^-inf = 0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// Keys per step: 32 at head dim 128, where 64 left ptxas 50 registers short (200 bytes spilled
// with 255 registers); 64 at head dim 64.
template <int D>
constexpr int kWideBN = D == 128 ? 32 : 64;

template <int D>
constexpr std::size_t forward_wide_shared_bytes() {
  return std::size_t{kBM + 4 * kWideBN<D>} * D * 2;  // Q, then two stages of K and V
}

template <typename T, int D>
__global__ void __launch_bounds__(kWideThreads, 2)  // two blocks per SM: 255 registers x 128 threads each
    attention_forward_tc_wide_kernel(Layout lay, const T* __restrict__ q, const T* __restrict__ k,
                                     const T* __restrict__ v, T* __restrict__ out, float* __restrict__ lse,
                                     float scale) {
  constexpr int MT = kWideTiles;
  constexpr int BN = kWideBN<D>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const sq = reinterpret_cast<T*>(smem_raw);  // [kBM][D]
  T* const skv = sq + kBM * D;                    // stage s: K [BN][D] at skv + s * 2 BN D, V after it
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t qt = gridDim.x - 1 - blockIdx.x;  // the tiles with the most keys start first
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t g = h / (lay.q_heads / lay.kv_heads);
  const int64_t i0 = qt * kBM;
  const int64_t rows_end = std::min(lay.seq, i0 + kBM);
  const int n_tiles = static_cast<int>((rows_end - 1) / BN + 1);  // key tiles up to the last row
  const float scale_log2 = scale * kLog2e;

  auto load_kv = [&](int tile, int stage) {
    load_kv_tile_async<D, T, kWideThreads, BN>(lay, k, v, b, g, tile, skv + stage * 2 * BN * D);
  };
  load_tile_async<D, kBM, T, kWideThreads>(q + lay.q_index(b, i0, h), lay.q_row_stride,
                                           static_cast<int>(rows_end - i0), sq);
  load_kv(0, 0);
  cp_async_commit();

  // Row tile mt of the warp starts at warp_row0 + 16 mt; the lane's C-fragment rows in it are
  // quad_row and quad_row + 8 (tc::mma_c_elem).
  const int quad_row = lane / 4;
  const int64_t warp_row0 = i0 + warp * 16 * MT;
  const bool warp_active = warp_row0 < lay.seq;
  float o[MT][D / 8][4] = {};
  float m[MT][2], l[MT][2];  // m: the running maximum of the raw scores
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait_all();
    __syncthreads();  // tile `tile` is visible; every warp is done with tile - 1, whose stage is refilled next
    if (tile + 1 < n_tiles) {
      load_kv(tile + 1, (tile + 1) % 2);
      cp_async_commit();
    }
    const int64_t j0 = int64_t{tile} * BN;
    if (!warp_active || j0 > warp_row0 + 16 * MT - 1) continue;  // every key after every row of the warp
    const T* const sk = skv + (tile % 2) * 2 * BN * D;
    const T* const sv = sk + BN * D;

    float s[MT][BN / 8][4] = {};
    mma_rows_rows_t_tiles<T, D, BN, MT>(sq, warp * 16 * MT, sk, lane, s);  // S = Q K^T (unscaled)
    // Tiles start at multiples of BN (32 or 64) and warps at multiples of 32, so a computed tile has
    // j0 <= warp_row0: every row of both row tiles sees key j0, and a row tile whose first row is
    // r0 has keys after some row only when the tile reaches past r0 (then r0 - j0 is a multiple of
    // 16 below BN). Keys past the sequence come after every valid row.
    float corr[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int64_t r0 = warp_row0 + 16 * mt;
      const bool diagonal = j0 + BN - 1 > r0;
      const int lim = diagonal ? static_cast<int>(r0 - j0) : 0;
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nb = 0; nb < BN / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const tc::RowCol rc = tc::mma_c_elem(lane, e);
          if (diagonal && nb * 8 + rc.col - rc.row > lim) s[mt][nb][e] = -INFINITY;
          tile_max[e / 2] = fmaxf(tile_max[e / 2], s[mt][nb][e]);
        }
      }
      float m_scaled[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // Every computed row sees key j0 in every computed tile: the new maximum is finite, and
        // exp2(-inf) = 0 for the first tile's correction and for masked keys.
        const float m_new = fmaxf(m[mt][r], quad_max(tile_max[r]));
        corr[mt][r] = exp2_ftz((m[mt][r] - m_new) * scale_log2);
        m[mt][r] = m_new;
        m_scaled[r] = m_new * scale_log2;
      }
#pragma unroll
      for (int nb = 0; nb < BN / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = exp2_ftz(fmaf(s[mt][nb][e], scale_log2, -m_scaled[e / 2]));
          sum[e / 2] += p;
          s[mt][nb][e] = p;
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) l[mt][r] = l[mt][r] * corr[mt][r] + quad_sum(sum[r]);
#pragma unroll
      for (int nb = 0; nb < D / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][nb][e] *= corr[mt][e / 2];
      }
    }
    mma_p_rows_tiles<T, D, BN, MT>(s, sv, lane, o);  // O += P V
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t i = warp_row0 + 16 * mt + quad_row + 8 * r;
      if (!warp_active || i >= lay.seq) continue;
      const float inv = 1.0f / l[mt][r];
      T* const dst = out + lay.o_index(b, i, h);
#pragma unroll
      for (int nb = 0; nb < D / 8; ++nb) {
        store_pair(dst + nb * 8 + tc::mma_c_elem(lane, 2 * r).col, o[mt][nb][2 * r] * inv,
                   o[mt][nb][2 * r + 1] * inv);
      }
      if (lane % 4 == 0) lse[lay.lse_index(b, h, i)] = m[mt][r] * scale + logf(l[mt][r]);
    }
  }
}

template <typename T, int D>
void forward_wide(cudaStream_t stream, const AttentionShape& s, const void* q, const void* k, const void* v,
                  void* out, float* lse, float scale) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  constexpr std::size_t bytes = forward_wide_shared_bytes<D>();
  attention::reserve_shared(attention_forward_tc_wide_kernel<T, D>, bytes, D, "attention_forward");
  const dim3 grid(row_tiles(s.seq), static_cast<unsigned>(s.q_heads), static_cast<unsigned>(s.batch));
  attention_forward_tc_wide_kernel<T, D><<<grid, kWideThreads, bytes, stream>>>(
      Layout::of(s), static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
      static_cast<T*>(out), lse, scale);
  check_launch();
}

}  // namespace
}  // namespace tc_kernels

namespace attention {

void tc_forward_wide(cudaStream_t stream, DType dtype, const AttentionShape& s, const void* q, const void* k,
                     const void* v, void* out, float* lse, float scale) {
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (s.head_dim == 64) tc_kernels::forward_wide<T, 64>(stream, s, q, k, v, out, lse, scale);
    else tc_kernels::forward_wide<T, 128>(stream, s, q, k, v, out, lse, scale);
  };
  if (dtype == DType::BF16) run(bf16{});
  else run(fp16{});
}

}  // namespace attention
}  // namespace strata::models::cuda
