// The first tensor-core attention (nvcuda::wmma, 32-41 TFLOP/s forward and 20-29 backward on an
// H200, docs/MEASUREMENTS.md), kept as the default beside cuda_attention_tc.cu's flash-attention 2
// kernels until those have run on a GPU (attention::tc_variant, Note [Two tensor-core kernels] in
// models/kernels/cuda_attention.cuh). CUDA causal attention on tensor cores (WMMA, bf16/fp16 operands, fp32
// accumulation): the path cuda_attention.cu and cuda_attention_backward.cu take for bf16 and fp16 at head_dim 64 or 128
// with 16-byte aligned rows (attention::tc_supported); fp32 (exact mode) and other shapes keep the
// scalar kernels. Flash-attention 2's shape of work, in WMMA 16x16x16 fragments:
//  * forward: one block per (64-query tile, query head, batch item), 4 warps of 16 query rows. Key
//    and value tiles of 64 stream through shared memory; a warp computes S = Q K^T on tensor cores,
//    its lanes (two per row) take the online softmax in fp32 (running max m, sum l) and rescale the
//    row's fp32 output accumulator (in shared memory), and O += P V runs on tensor cores with P
//    rounded to the element type. lse = m + log(l) per row, as the scalar kernel saves it.
//  * backward, two kernels so every output element is written by one warp (no atomics, the same
//    bits every run): dK/dV per (64-key tile, kv head, batch item), summing over the group's query
//    heads in order and over the query tiles from the key tile's own on (dV += P^T dO, dK += dS^T Q
//    in fragments that stay in registers); dQ per (64-query tile, query head, batch item), summing
//    dS K over the key tiles up to its own. P and dS are rounded to the element type before their
//    products, as in flash-attention; delta = sum_c dO * O per query row is recomputed per tile.
// Scores are q.k * scale with scale = 1/sqrt(head_dim) applied to the fp32 product (the scalar
// kernels scale q before the dot product); the probabilities and score gradients use the shared
// element math of op_math.h (math::shifted_exp, online_softmax_rescale, online_softmax_lse,
// attention_prob, attention_dscore), as the scalar kernels do.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>

#include "models/kernels/cuda_attention.cuh"
#include "models/kernels/op_math.h"

namespace strata::models::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using attention::Layout;

constexpr int kBM = 64;       // query rows per tile
constexpr int kBN = 64;       // keys per tile
constexpr int kWarps = 4;     // each owns 16 rows of the block's tile
constexpr int kTcThreads = kWarps * 32;
constexpr int kLdS = kBN + 4;  // fp32 score scratch row stride (a multiple of 4 floats, as WMMA needs)
constexpr int kLdP = kBN + 8;  // 16-bit probability scratch row stride (a multiple of 8 elements)

// The CUDA type WMMA takes for Strata's 16-bit element types (the same bits).
template <typename T>
struct Wmma;
template <>
struct Wmma<bf16> {
  using type = __nv_bfloat16;
  static __device__ type round(float x) { return __float2bfloat16_rn(x); }
};
template <>
struct Wmma<fp16> {
  using type = __half;
  static __device__ type round(float x) { return __float2half_rn(x); }
};

using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <typename W>
using FragARow = wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major>;
template <typename W>
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::row_major>;
template <typename W>
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::col_major>;

// rows x D elements into shared [rows][D + 8], 16 bytes at a time; rows at or past `valid` are
// zeros. `first(r)` is the element index of row r's first element in `src` (16-byte aligned).
template <int D, typename W, typename T, typename First>
__device__ void load_rows(const T* src, int rows, int valid, First first, W* dst) {
  constexpr int kVecs = D / 8;  // 8 16-bit elements per 16 bytes
  for (int e = static_cast<int>(threadIdx.x); e < rows * kVecs; e += kTcThreads) {
    const int r = e / kVecs, c = (e % kVecs) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < valid) v = *reinterpret_cast<const uint4*>(src + first(r) + c);
    *reinterpret_cast<uint4*>(dst + r * (D + 8) + c) = v;
  }
}

// acc (16 x 16 at column block nb of a 16 x 64 product) = A[16][D] . B[64][D]^T, A and B in shared
// memory at row stride D + 8: the score-shaped products (Q K^T, dO V^T, K Q^T, V dO^T).
template <int D, typename W>
__device__ void rows_times_rows_t(const W* a, const W* b, int nb, FragAcc& acc) {
  wmma::fill_fragment(acc, 0.0f);
  FragARow<W> fa;
  FragBCol<W> fb;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    wmma::load_matrix_sync(fa, a + kk * 16, D + 8);
    wmma::load_matrix_sync(fb, b + nb * 16 * (D + 8) + kk * 16, D + 8);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// The 16 x 64 fp32 product A . B^T into scratch [16][kLdS].
template <int D, typename W>
__device__ void score_tile(const W* a, const W* b, float* scratch) {
  FragAcc acc;
#pragma unroll
  for (int nb = 0; nb < kBN / 16; ++nb) {
    rows_times_rows_t<D>(a, b, nb, acc);
    wmma::store_matrix_sync(scratch + nb * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// acc[db] += P[16][64] (16-bit, stride kLdP) . M[64][D] (shared, stride D + 8), for every 16-column
// block db of D.
template <int D, typename W>
__device__ void accumulate_p_times(const W* p, const W* m, FragAcc (&acc)[D / 16]) {
  FragARow<W> fa;
  FragBRow<W> fb;
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk) {
    wmma::load_matrix_sync(fa, p + kk * 16, kLdP);
#pragma unroll
    for (int db = 0; db < D / 16; ++db) {
      wmma::load_matrix_sync(fb, m + kk * 16 * (D + 8) + db * 16, D + 8);
      wmma::mma_sync(acc[db], fa, fb, acc[db]);
    }
  }
}

// delta[r] = sum_c dout[r][c] * out[r][c] for the tile's rows (0 past `valid`), two threads a row.
template <int D, typename T, typename First>
__device__ void row_deltas(const T* dout, const T* out, int valid, First first, float* delta) {
  const int r = static_cast<int>(threadIdx.x) / 2, half = static_cast<int>(threadIdx.x) % 2;
  float acc = 0.0f;
  if (r < valid) {
    const std::int64_t base = first(r);
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c) acc += to_f32(dout[base + c]) * to_f32(out[base + c]);
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  if (half == 0) delta[r] = acc;
}

// The backward's query tile (i0, head h, item b): q and dout rows into shared memory, each row's
// delta and saved lse (0 past the sequence). The whole block calls it; synchronize after.
template <int D, typename T, typename W>
__device__ void load_query_tile(const Layout& lay, const T* q, const T* out, const float* lse, const T* dout,
                                std::int64_t b, std::int64_t h, std::int64_t i0, W* sq, W* sdo, float* slse,
                                float* sdelta) {
  const int valid_q = static_cast<int>(min(static_cast<std::int64_t>(kBM), lay.seq - i0));
  auto o_row = [&](int rr) { return lay.o_index(b, i0 + rr, h); };
  load_rows<D>(q, kBM, valid_q, [&](int rr) { return lay.q_index(b, i0 + rr, h); }, sq);
  load_rows<D>(dout, kBM, valid_q, o_row, sdo);
  row_deltas<D>(dout, out, valid_q, o_row, sdelta);
  for (int e = static_cast<int>(threadIdx.x); e < kBM; e += kTcThreads) {
    slse[e] = e < valid_q ? lse[lay.lse_index(b, h, i0 + e)] : 0.0f;
  }
}

template <int D>
constexpr std::size_t forward_tc_shared_bytes() {
  return 3 * kBM * (D + 8) * 2 + kWarps * 16 * (kLdS * 4 + kLdP * 2 + (D + 4) * 4);
}

template <typename T, int D>
__global__ void __launch_bounds__(kTcThreads)
    attention_forward_tc_kernel(Layout lay, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                T* __restrict__ out, float* __restrict__ lse, float scale) {
  using W = typename Wmma<T>::type;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  W* sq = reinterpret_cast<W*>(smem_raw);
  W* sk = sq + kBM * (D + 8);
  W* sv = sk + kBN * (D + 8);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float* ss = reinterpret_cast<float*>(sv + kBN * (D + 8)) + warp * 16 * kLdS;
  W* sp = reinterpret_cast<W*>(reinterpret_cast<float*>(sv + kBN * (D + 8)) + kWarps * 16 * kLdS) + warp * 16 * kLdP;
  float* so = reinterpret_cast<float*>(reinterpret_cast<W*>(reinterpret_cast<float*>(sv + kBN * (D + 8)) +
                                                              kWarps * 16 * kLdS) +
                                       kWarps * 16 * kLdP) +
              warp * 16 * (D + 4);

  const std::int64_t qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t g = h / (lay.q_heads / lay.kv_heads);
  const std::int64_t i0 = qt * kBM;
  const int valid_q = static_cast<int>(min(static_cast<std::int64_t>(kBM), lay.seq - i0));
  load_rows<D>(q, kBM, valid_q, [&](int r) { return lay.q_index(b, i0 + r, h); }, sq);
  for (int e = lane; e < 16 * (D + 4); e += 32) so[e] = 0.0f;
  // Lanes 2r and 2r+1 own row r of the warp's 16, columns [32 * half, 32 * half + 32) of a score
  // tile and [D/2 * half, D/2 * half + D/2) of the output.
  const int r = lane / 2, half = lane % 2;
  const std::int64_t i = i0 + warp * 16 + r;  // this lane's query row
  float m = -INFINITY, l = 0.0f;

  for (std::int64_t j0 = 0; j0 <= i0; j0 += kBN) {  // key tiles up to the diagonal one (kBN == kBM)
    const int valid_k = static_cast<int>(min(static_cast<std::int64_t>(kBN), lay.seq - j0));
    __syncthreads();  // every warp is done with the previous key and value tiles
    load_rows<D>(k, kBN, valid_k, [&](int j) { return lay.kv_index(b, j0 + j, g); }, sk);
    load_rows<D>(v, kBN, valid_k, [&](int j) { return lay.kv_index(b, j0 + j, g); }, sv);
    __syncthreads();
    score_tile<D>(sq + warp * 16 * (D + 8), sk, ss);
    __syncwarp();
    float s[32];
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const std::int64_t j = j0 + half * 32 + c;
      s[c] = (j <= i && j < lay.seq) ? ss[r * kLdS + half * 32 + c] * scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[c]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    // A row sees key 0 in the first tile, so m_new is finite from the first tile on.
    const float corr = math::online_softmax_rescale(m, m_new);
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const float p = s[c] == -INFINITY ? 0.0f : math::shifted_exp(s[c], m_new);
      sum += p;
      sp[r * kLdP + half * 32 + c] = Wmma<T>::round(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    m = m_new;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c) so[r * (D + 4) + c] *= corr;
    __syncwarp();
    FragAcc acc[D / 16];
#pragma unroll
    for (int db = 0; db < D / 16; ++db) wmma::load_matrix_sync(acc[db], so + db * 16, D + 4, wmma::mem_row_major);
    accumulate_p_times<D>(sp, sv, acc);
#pragma unroll
    for (int db = 0; db < D / 16; ++db) wmma::store_matrix_sync(so + db * 16, acc[db], D + 4, wmma::mem_row_major);
    __syncwarp();
  }
  if (i < lay.seq) {
    const float inv = 1.0f / l;
    const std::int64_t o = lay.o_index(b, i, h);
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c) out[o + c] = from_f32<T>(so[r * (D + 4) + c] * inv);
    if (half == 0) lse[lay.lse_index(b, h, i)] = math::online_softmax_lse(m, l);
  }
}

template <int D>
constexpr std::size_t dq_tc_shared_bytes() {
  return 4 * kBM * (D + 8) * 2 + kWarps * 16 * (2 * kLdS * 4 + kLdP * 2) + 2 * kBM * 4;
}

template <typename T, int D>
__global__ void __launch_bounds__(kTcThreads)
    attention_dq_tc_kernel(Layout lay, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                           const T* __restrict__ out, const float* __restrict__ lse, const T* __restrict__ dout,
                           T* __restrict__ dq, float scale) {
  using W = typename Wmma<T>::type;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  W* sq = reinterpret_cast<W*>(smem_raw);
  W* sdo = sq + kBM * (D + 8);
  W* sk = sdo + kBM * (D + 8);
  W* sv = sk + kBN * (D + 8);
  float* scratch = reinterpret_cast<float*>(sv + kBN * (D + 8));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float* ss = scratch + warp * 16 * kLdS;
  float* sdp = scratch + kWarps * 16 * kLdS + warp * 16 * kLdS;
  W* sds = reinterpret_cast<W*>(scratch + 2 * kWarps * 16 * kLdS) + warp * 16 * kLdP;
  float* slse = reinterpret_cast<float*>(reinterpret_cast<W*>(scratch + 2 * kWarps * 16 * kLdS) + kWarps * 16 * kLdP);
  float* sdelta = slse + kBM;

  const std::int64_t qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t g = h / (lay.q_heads / lay.kv_heads);
  const std::int64_t i0 = qt * kBM;
  load_query_tile<D>(lay, q, out, lse, dout, b, h, i0, sq, sdo, slse, sdelta);
  const int r = lane / 2, half = lane % 2;
  const int row = warp * 16 + r;
  const std::int64_t i = i0 + row;
  FragAcc acc[D / 16];
#pragma unroll
  for (int db = 0; db < D / 16; ++db) wmma::fill_fragment(acc[db], 0.0f);

  for (std::int64_t j0 = 0; j0 <= i0; j0 += kBN) {
    const int valid_k = static_cast<int>(min(static_cast<std::int64_t>(kBN), lay.seq - j0));
    __syncthreads();
    load_rows<D>(k, kBN, valid_k, [&](int j) { return lay.kv_index(b, j0 + j, g); }, sk);
    load_rows<D>(v, kBN, valid_k, [&](int j) { return lay.kv_index(b, j0 + j, g); }, sv);
    __syncthreads();
    score_tile<D>(sq + warp * 16 * (D + 8), sk, ss);
    score_tile<D>(sdo + warp * 16 * (D + 8), sv, sdp);
    __syncwarp();
    const float row_lse = slse[row], row_delta = sdelta[row];
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const int col = half * 32 + c;
      const std::int64_t j = j0 + col;
      float ds = 0.0f;
      if (j <= i && i < lay.seq) {
        const float p = math::attention_prob(ss[r * kLdS + col] * scale, row_lse);
        ds = math::attention_dscore(p, sdp[r * kLdS + col], row_delta);
      }
      sds[r * kLdP + col] = Wmma<T>::round(ds);
    }
    __syncwarp();
    accumulate_p_times<D>(sds, sk, acc);
  }
  __syncthreads();  // the key and value tiles are free: they hold the dQ rows now
  float* sacc = reinterpret_cast<float*>(sk) + warp * 16 * (D + 4);
#pragma unroll
  for (int db = 0; db < D / 16; ++db) wmma::store_matrix_sync(sacc + db * 16, acc[db], D + 4, wmma::mem_row_major);
  __syncwarp();
  if (i < lay.seq) {
    const std::int64_t base = lay.q_index(b, i, h);
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c) dq[base + c] = from_f32<T>(sacc[r * (D + 4) + c] * scale);
  }
}

template <int D>
constexpr std::size_t dkdv_tc_shared_bytes() {
  return 4 * kBM * (D + 8) * 2 + kWarps * 16 * (2 * kLdS * 4 + 2 * kLdP * 2) + 2 * kBM * 4;
}

template <typename T, int D>
__global__ void __launch_bounds__(kTcThreads)
    attention_dkdv_tc_kernel(Layout lay, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                             const T* __restrict__ out, const float* __restrict__ lse, const T* __restrict__ dout,
                             T* __restrict__ dk, T* __restrict__ dv, float scale) {
  using W = typename Wmma<T>::type;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  W* sk = reinterpret_cast<W*>(smem_raw);
  W* sv = sk + kBN * (D + 8);
  W* sq = sv + kBN * (D + 8);
  W* sdo = sq + kBM * (D + 8);
  float* scratch = reinterpret_cast<float*>(sdo + kBM * (D + 8));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float* sst = scratch + warp * 16 * kLdS;                      // S^T: 16 keys x 64 queries
  float* sdpt = scratch + kWarps * 16 * kLdS + warp * 16 * kLdS;  // dP^T
  W* spt = reinterpret_cast<W*>(scratch + 2 * kWarps * 16 * kLdS) + warp * 16 * kLdP;
  W* sdst = reinterpret_cast<W*>(scratch + 2 * kWarps * 16 * kLdS) + kWarps * 16 * kLdP + warp * 16 * kLdP;
  float* slse = reinterpret_cast<float*>(reinterpret_cast<W*>(scratch + 2 * kWarps * 16 * kLdS) + 2 * kWarps * 16 * kLdP);
  float* sdelta = slse + kBM;

  const std::int64_t kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  const std::int64_t group = lay.q_heads / lay.kv_heads;
  const std::int64_t j0 = kt * kBN;
  const int valid_k = static_cast<int>(min(static_cast<std::int64_t>(kBN), lay.seq - j0));
  load_rows<D>(k, kBN, valid_k, [&](int j) { return lay.kv_index(b, j0 + j, g); }, sk);
  load_rows<D>(v, kBN, valid_k, [&](int j) { return lay.kv_index(b, j0 + j, g); }, sv);
  const int r = lane / 2, half = lane % 2;   // lanes 2r, 2r+1: key row r of the warp's 16
  const std::int64_t j = j0 + warp * 16 + r;  // this lane's key
  FragAcc dk_acc[D / 16], dv_acc[D / 16];
#pragma unroll
  for (int db = 0; db < D / 16; ++db) {
    wmma::fill_fragment(dk_acc[db], 0.0f);
    wmma::fill_fragment(dv_acc[db], 0.0f);
  }
  for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (std::int64_t i0 = j0; i0 < lay.seq; i0 += kBM) {  // query tiles from the diagonal one on
      __syncthreads();  // every warp is done with the previous query tile
      load_query_tile<D>(lay, q, out, lse, dout, b, h, i0, sq, sdo, slse, sdelta);
      __syncthreads();
      score_tile<D>(sk + warp * 16 * (D + 8), sq, sst);    // K Q^T
      score_tile<D>(sv + warp * 16 * (D + 8), sdo, sdpt);  // V dO^T
      __syncwarp();
#pragma unroll 8
      for (int c = 0; c < 32; ++c) {
        const int col = half * 32 + c;
        const std::int64_t i = i0 + col;
        float p = 0.0f, ds = 0.0f;
        if (j <= i && i < lay.seq) {
          p = math::attention_prob(sst[r * kLdS + col] * scale, slse[col]);
          ds = math::attention_dscore(p, sdpt[r * kLdS + col], sdelta[col]);
        }
        spt[r * kLdP + col] = Wmma<T>::round(p);
        sdst[r * kLdP + col] = Wmma<T>::round(ds);
      }
      __syncwarp();
      accumulate_p_times<D>(spt, sdo, dv_acc);   // dV += P^T dO
      accumulate_p_times<D>(sdst, sq, dk_acc);  // dK += dS^T Q
    }
  }
  __syncthreads();  // the query and dO tiles are free: they hold the dK and dV rows now
  float* sacc = reinterpret_cast<float*>(sq) + warp * 16 * (D + 4);
  const bool mine = j < lay.seq;
  const std::int64_t base = lay.dkv_index(b, j, g);
#pragma unroll
  for (int db = 0; db < D / 16; ++db) wmma::store_matrix_sync(sacc + db * 16, dv_acc[db], D + 4, wmma::mem_row_major);
  __syncwarp();
  if (mine) {
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c) dv[base + c] = from_f32<T>(sacc[r * (D + 4) + c]);
  }
  __syncwarp();
#pragma unroll
  for (int db = 0; db < D / 16; ++db) wmma::store_matrix_sync(sacc + db * 16, dk_acc[db], D + 4, wmma::mem_row_major);
  __syncwarp();
  if (mine) {
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c) dk[base + c] = from_f32<T>(sacc[r * (D + 4) + c] * scale);
  }
}

template <typename T, int D>
void forward_tc(cudaStream_t stream, const AttentionShape& s, const void* q, const void* k, const void* v, void* out,
                float* lse, float scale) {
  constexpr std::size_t bytes = forward_tc_shared_bytes<D>();
  attention::reserve_shared(attention_forward_tc_kernel<T, D>, bytes, D, "attention_forward");
  const dim3 grid(static_cast<unsigned>((s.seq + kBM - 1) / kBM), static_cast<unsigned>(s.q_heads),
                  static_cast<unsigned>(s.batch));
  attention_forward_tc_kernel<T, D><<<grid, kTcThreads, bytes, stream>>>(
      Layout::of(s), static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out),
      lse, scale);
  check_launch();
}

template <typename T, int D>
void backward_tc(cudaStream_t stream, const AttentionShape& s, const void* q, const void* k, const void* v,
                 const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv, float scale) {
  constexpr std::size_t dkdv_bytes = dkdv_tc_shared_bytes<D>();
  constexpr std::size_t dq_bytes = dq_tc_shared_bytes<D>();
  attention::reserve_shared(attention_dkdv_tc_kernel<T, D>, dkdv_bytes, D, "attention_backward");
  attention::reserve_shared(attention_dq_tc_kernel<T, D>, dq_bytes, D, "attention_backward");
  const unsigned tiles = static_cast<unsigned>((s.seq + kBM - 1) / kBM);
  const auto* qt = static_cast<const T*>(q);
  const auto* kt = static_cast<const T*>(k);
  const auto* vt = static_cast<const T*>(v);
  const auto* ot = static_cast<const T*>(out);
  const auto* dot = static_cast<const T*>(dout);
  attention_dkdv_tc_kernel<T, D><<<dim3(tiles, static_cast<unsigned>(s.kv_heads), static_cast<unsigned>(s.batch)),
                                   kTcThreads, dkdv_bytes, stream>>>(Layout::of(s), qt, kt, vt, ot, lse, dot,
                                                                     static_cast<T*>(dk), static_cast<T*>(dv), scale);
  check_launch();
  attention_dq_tc_kernel<T, D><<<dim3(tiles, static_cast<unsigned>(s.q_heads), static_cast<unsigned>(s.batch)),
                                 kTcThreads, dq_bytes, stream>>>(Layout::of(s), qt, kt, vt, ot, lse, dot,
                                                                 static_cast<T*>(dq), scale);
  check_launch();
}

}  // namespace

namespace attention {

void tc_forward_wmma(cudaStream_t stream, DType dtype, const AttentionShape& s, const void* q, const void* k,
                     const void* v, void* out, float* lse, float scale) {
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (s.head_dim == 64) forward_tc<T, 64>(stream, s, q, k, v, out, lse, scale);
    else forward_tc<T, 128>(stream, s, q, k, v, out, lse, scale);
  };
  if (dtype == DType::BF16) run(bf16{});
  else run(fp16{});
}

void tc_backward_wmma(cudaStream_t stream, DType dtype, const AttentionShape& s, const void* q, const void* k,
                      const void* v, const void* out, const float* lse, const void* dout, void* dq, void* dk,
                      void* dv, float scale) {
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (s.head_dim == 64) backward_tc<T, 64>(stream, s, q, k, v, out, lse, dout, dq, dk, dv, scale);
    else backward_tc<T, 128>(stream, s, q, k, v, out, lse, dout, dq, dk, dv, scale);
  };
  if (dtype == DType::BF16) run(bf16{});
  else run(fp16{});
}

}  // namespace attention
}  // namespace strata::models::cuda
