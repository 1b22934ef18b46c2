// Written without a GPU and not yet run on one: taken only with STRATA_ATTENTION_TC=fa2 (Note [Two
// tensor-core kernels], cuda_attention.cuh); the default is cuda_attention_tc_wmma.cu's kernels.
// CUDA causal attention on tensor cores (bf16/fp16 operands, fp32 accumulation): the path
// cuda_attention.cu and cuda_attention_backward.cu take for bf16 and fp16 at head_dim 64 or 128
// with 16-byte aligned rows (attention::tc_supported); fp32 (exact mode) and other shapes keep the
// scalar kernels. Flash-attention 2's kernels written with mma.sync.m16n8k16, ldmatrix and
// cp.async (inline PTX; the fragment, ldmatrix and swizzle maps are attention_tc_layout.h's, where
// the PTX ISA's layouts are quoted, checked on the host by tests/models/attention_tc_layout_test.cc):
//  * every block has 8 warps; a warp owns 16 rows (query rows, or in dK/dV key rows) and keeps its
//    products in registers: a score tile's fp32 C fragments are masked, exponentiated and rounded
//    into the A fragments of the next product, never through shared memory. Shared tiles are rows
//    of head_dim elements with the XOR swizzle of attention_tc_layout.h (no bank conflicts for
//    ldmatrix or cp.async); the streamed tiles are double-buffered with cp.async (one tile in
//    flight while the previous one is used), rows past the sequence zero-filled by the copy.
//  * forward: one block per (128-query tile, query head, batch item), the longest tiles first. Key
//    and value tiles of 64 stream in; a warp computes S = Q K^T, masks the diagonal tile only,
//    keeps the online softmax (running max m, sum l over the fp32 p) in registers with quad
//    shuffles, rescales O and adds P V with P rounded to the element type. lse = m + log(l) per row.
//    Key tiles past a warp's last row are skipped (fully masked).
//  * backward, two kernels so every output element is written by one warp (no atomics, the same
//    bits every run and for any split of the heads into calls): dK/dV per (128-key tile, kv head,
//    batch item), over the group's query heads in order and the query chunks (64 rows at head_dim
//    64, 32 at 128) from the key tile's own on: S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T,
//    dS^T = P^T (dP^T - delta), dK += dS^T Q, dK and dV in registers. dQ per (128-query tile,
//    query head, batch item) over the key tiles up to its diagonal: S, P, dP = dO V^T, dS,
//    dQ += dS K. P and dS are rounded to the element type before their products, as in
//    flash-attention. delta = sum_c dO * O per query row is recomputed in each kernel (dQ: once per
//    row; dK/dV: per query chunk, from an O tile streamed with Q and dO): the interface has no
//    workspace, and device memory outside the Strata pool is not ours to take.
// Scores are q.k * scale with scale = 1/sqrt(head_dim) applied to the fp32 product (the scalar
// kernels scale q before the dot product); the probabilities and score gradients use the shared
// element math of op_math.h (math::shifted_exp, online_softmax_rescale, online_softmax_lse,
// attention_prob, attention_dscore), as the scalar kernels do.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "models/kernels/attention_tc_layout.h"
#include "models/kernels/cuda_attention.cuh"
#include "models/kernels/op_math.h"

namespace strata::models::cuda {
namespace {

namespace tc = attention_tc;
using attention::Layout;
using std::int64_t;
using std::uint32_t;

constexpr int kWarps = 8;
constexpr int kTcThreads = kWarps * 32;
constexpr int kBM = kWarps * 16;  // query rows per forward / dQ block, key rows per dK/dV block
constexpr int kBN = 64;           // keys per forward / dQ step
template <int D>
constexpr int kBQ = D == 64 ? 64 : 32;  // query rows per dK/dV step (fewer at 128: registers)

// ---------- PTX wrappers ----------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async.cg: 16 bytes global -> shared, bypassing L1. With src-size 0 nothing is read and the 16
// bytes are zero-filled (the rows past the sequence); `src` is still a valid address then.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(valid ? 16 : 0)
               : "memory");
}
// cp.async.ca: 4 bytes (an lse), zero-filled when !valid.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits for every cp.async group this thread committed; a __syncthreads after it makes all
// threads' copies visible to the block.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// ldmatrix .x4: four 8x8 matrices of 16-bit elements; lanes 8q..8q+7 give the row addresses of
// matrix q, register q receives it (layouts: attention_tc_layout.h).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}

// d += a b for one m16n8k16 tile (fp32 accumulators), and fp32 pairs rounded (to nearest even)
// into the .bf16x2 / .f16x2 registers of an A fragment, the first value in the low half.
template <typename T>
struct TcOps;
template <>
struct TcOps<bf16> {
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo: the low half
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
  }
};
template <>
struct TcOps<fp16> {
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);  // .x = lo: the low half
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
  }
};

// Two adjacent output elements (the C fragment pair c0 c1 or c2 c3) as one 4-byte store; `dst` is
// 4-byte aligned (rows start 16-byte aligned, the column is even).
template <typename T>
__device__ __forceinline__ void store_pair(T* dst, float x0, float x1) {
  const uint32_t u = static_cast<uint32_t>(from_f32<T>(x0).bits) | (static_cast<uint32_t>(from_f32<T>(x1).bits) << 16);
  *reinterpret_cast<uint32_t*>(dst) = u;
}

// The two T of a 32-bit word as fp32 (exact: the same values as to_f32), low half in .x.
template <typename T>
__device__ __forceinline__ float2 widen2(uint32_t word);
template <>
__device__ __forceinline__ float2 widen2<bf16>(uint32_t word) {
  return make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 widen2<fp16>(uint32_t word) {
  __half2 h;
  memcpy(&h, &word, sizeof h);
  return __half22float2(h);
}

// sum_c a[c] * b[c] over 8 elements held as 16 bytes each.
template <typename T>
__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
  const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
  float acc = 0.0f;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const float2 x = widen2<T>(aw[w]), y = widen2<T>(bw[w]);
    acc += x.x * y.x;
    acc += x.y * y.y;
  }
  return acc;
}

// ---------- tiles and warp products ----------

// Rows x D elements into a swizzled shared tile with cp.async, 16 bytes per copy: row r of the
// tile is src + r * row_stride (16-byte aligned: tc_supported); rows at or past `valid` are
// zero-filled. Thread t copies chunk tc::copy_chunk(t) of rows tc::copy_row(t) + n kRowsPerPass:
// 8 consecutive threads write 8 different bank groups, and since kRowsPerPass is a multiple of 8
// the swizzled offset of row r + n kRowsPerPass is that of row r plus n kRowsPerPass D. The whole
// block calls it; the caller commits the group.
template <int D, int Rows, typename T>
__device__ __forceinline__ void load_tile_async(const T* src, int64_t row_stride, int valid, T* dst) {
  constexpr int kChunks = D / 8;
  constexpr int kRowsPerPass = kTcThreads / kChunks;
  static_assert(kTcThreads % kChunks == 0 && kRowsPerPass % 8 == 0 && Rows % kRowsPerPass == 0,
                "every thread copies the same chunk column of rows kRowsPerPass apart");
  const int r0 = tc::copy_row<D>(static_cast<int>(threadIdx.x)), c = tc::copy_chunk<D>(static_cast<int>(threadIdx.x));
  const T* const from = src + r0 * row_stride + c * 8;
  T* const to = dst + tc::tile_offset<D>(r0, c * 8);
#pragma unroll
  for (int n = 0; n < Rows / kRowsPerPass; ++n) {
    const bool ok = r0 + n * kRowsPerPass < valid;
    cp_async_16(to + n * kRowsPerPass * D, ok ? from + n * kRowsPerPass * row_stride : src, ok);
  }
}

// acc[n] += A B^T for the warp: A the 16 rows a_row0.. of a [row][D] tile, B the N rows of another
// (S = Q K^T, dP = dO V^T, S^T = K Q^T, dP^T = V dO^T). acc[n] is the C fragment of columns
// 8n..8n+7. A by ldmatrix (tc::ldsm_a_addr), B by ldmatrix without .trans from its [n][k] rows
// (tc::ldsm_b_addr): registers 0, 1 are block 2np, registers 2, 3 block 2np + 1.
template <typename T, int D, int N>
__device__ __forceinline__ void mma_rows_rows_t(const T* a_tile, int a_row0, const T* b_tile, int lane,
                                                float (&acc)[N / 8][4]) {
  const tc::RowCol pa = tc::ldsm_a_addr(lane), pb = tc::ldsm_b_addr(lane);
#pragma unroll 2  // fully unrolled, ptxas hoists all the loads of the product and spills at D = 128
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldsm_x4(a, a_tile + tc::tile_offset<D>(a_row0 + pa.row, kk * 16 + pa.col));
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t bb[4];
      ldsm_x4(bb, b_tile + tc::tile_offset<D>(np * 16 + pb.row, kk * 16 + pb.col));
      TcOps<T>::mma(acc[2 * np], a, bb[0], bb[1]);
      TcOps<T>::mma(acc[2 * np + 1], a, bb[2], bb[3]);
    }
  }
}

// acc[n] += P M for the warp: P the 16 x N fp32 product in C fragments (p[n]: columns 8n..8n+7),
// rounded to T into A fragments in registers (A columns 16kk.. are C blocks 2kk, 2kk + 1:
// tc::a_source_block / a_source_elem), M the N rows of a [row][D] tile read as B = M ([k][n], n
// contiguous) by ldmatrix .trans (tc::ldsm_bt_addr): registers 0, 1 are block 2dp, 2, 3 block
// 2dp + 1. (O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q.)
template <typename T, int D, int N>
__device__ __forceinline__ void mma_p_rows(const float (&p)[N / 8][4], const T* m_tile, int lane,
                                           float (&acc)[D / 8][4]) {
  const tc::RowCol pb = tc::ldsm_bt_addr(lane);
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    uint32_t a[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      a[r] = TcOps<T>::pack(p[2 * kk + tc::a_source_block(2 * r)][tc::a_source_elem(2 * r)],
                            p[2 * kk + tc::a_source_block(2 * r + 1)][tc::a_source_elem(2 * r + 1)]);
    }
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t bb[4];
      ldsm_x4_trans(bb, m_tile + tc::tile_offset<D>(kk * 16 + pb.row, dp * 16 + pb.col));
      TcOps<T>::mma(acc[2 * dp], a, bb[0], bb[1]);
      TcOps<T>::mma(acc[2 * dp + 1], a, bb[2], bb[3]);
    }
  }
}

// Max (or sum) over the 4 lanes of a quad: the lanes holding one C-fragment row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---------- forward ----------

template <int D>
constexpr std::size_t forward_tc_shared_bytes() {
  return std::size_t{kBM + 4 * kBN} * D * 2;  // Q, then two stages of K and V
}

template <typename T, int D>
__global__ void __launch_bounds__(kTcThreads)
    attention_forward_tc_kernel(Layout lay, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                T* __restrict__ out, float* __restrict__ lse, float scale) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const sq = reinterpret_cast<T*>(smem_raw);  // [kBM][D]
  T* const skv = sq + kBM * D;                    // stage s: K [kBN][D] at skv + s * 2 kBN D, V after it
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t qt = gridDim.x - 1 - blockIdx.x;  // the tiles with the most keys start first
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t g = h / (lay.q_heads / lay.kv_heads);
  const int64_t i0 = qt * kBM;
  const int64_t rows_end = std::min(lay.seq, i0 + kBM);
  const int n_tiles = static_cast<int>((rows_end - 1) / kBN + 1);  // key tiles up to the last row

  auto load_kv = [&](int tile, int stage) {
    const int64_t j0 = int64_t{tile} * kBN;
    const int valid = static_cast<int>(std::min(int64_t{kBN}, lay.seq - j0));
    const int64_t first = lay.kv_index(b, j0, g);
    T* const sk = skv + stage * 2 * kBN * D;
    load_tile_async<D, kBN>(k + first, lay.kv_row_stride, valid, sk);
    load_tile_async<D, kBN>(v + first, lay.kv_row_stride, valid, sk + kBN * D);
  };
  load_tile_async<D, kBM>(q + lay.q_index(b, i0, h), lay.q_row_stride, static_cast<int>(rows_end - i0), sq);
  load_kv(0, 0);
  cp_async_commit();

  // The lane's C-fragment rows are quad_row and quad_row + 8 of the warp's 16 (tc::mma_c_elem).
  const int quad_row = lane / 4;
  const int64_t warp_row0 = i0 + warp * 16;
  const bool warp_active = warp_row0 < lay.seq;
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait_all();
    __syncthreads();  // tile `tile` is visible; every warp is done with tile - 1, whose stage is refilled next
    if (tile + 1 < n_tiles) {
      load_kv(tile + 1, (tile + 1) % 2);
      cp_async_commit();
    }
    const int64_t j0 = int64_t{tile} * kBN;
    if (!warp_active || j0 > warp_row0 + 15) continue;  // every key after every row of the warp
    const T* const sk = skv + (tile % 2) * 2 * kBN * D;
    const T* const sv = sk + kBN * D;

    float s[kBN / 8][4] = {};
    mma_rows_rows_t<T, D, kBN>(sq, warp * 16, sk, lane, s);  // S = Q K^T
    // Element e of block nb: row warp_row0 + rc.row, key j0 + 8 nb + rc.col. Tiles start at
    // multiples of 64 and warps at multiples of 16, so a computed tile has j0 <= warp_row0: every
    // row sees key j0. Only a tile reaching past the warp's first row has keys after some row
    // (then warp_row0 - j0 is 0, 16, 32 or 48); keys past the sequence come after every valid row.
    const bool diagonal = j0 + kBN - 1 > warp_row0;
    const int lim = diagonal ? static_cast<int>(warp_row0 - j0) : 0;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < kBN / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const tc::RowCol rc = tc::mma_c_elem(lane, e);
        float x = s[nb][e] * scale;
        if (diagonal && nb * 8 + rc.col - rc.row > lim) x = -INFINITY;
        s[nb][e] = x;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
      }
    }
    float corr[2], m_new[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // Every computed row sees at least key j0 in every computed tile: m_new is finite.
      m_new[r] = fmaxf(m[r], quad_max(tile_max[r]));
      corr[r] = math::online_softmax_rescale(m[r], m_new[r]);
    }
#pragma unroll
    for (int nb = 0; nb < kBN / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = math::shifted_exp(s[nb][e], m_new[e / 2]);  // exp(-inf - finite) = 0: masked
        sum[e / 2] += p;
        s[nb][e] = p;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] = l[r] * corr[r] + quad_sum(sum[r]);
      m[r] = m_new[r];
    }
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nb][e] *= corr[e / 2];
    }
    mma_p_rows<T, D, kBN>(s, sv, lane, o);  // O += P V
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = warp_row0 + quad_row + 8 * r;
    if (!warp_active || i >= lay.seq) continue;
    const float inv = 1.0f / l[r];
    T* const dst = out + lay.o_index(b, i, h);
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      store_pair(dst + nb * 8 + tc::mma_c_elem(lane, 2 * r).col, o[nb][2 * r] * inv, o[nb][2 * r + 1] * inv);
    }
    if (lane % 4 == 0) lse[lay.lse_index(b, h, i)] = math::online_softmax_lse(m[r], l[r]);
  }
}

// ---------- backward: dQ ----------

template <int D>
constexpr std::size_t dq_tc_shared_bytes() {
  return std::size_t{2 * kBM + 4 * kBN} * D * 2;  // Q, dO, then two stages of K and V
}

template <typename T, int D>
__global__ void __launch_bounds__(kTcThreads)
    attention_dq_tc_kernel(Layout lay, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                           const T* __restrict__ out, const float* __restrict__ lse, const T* __restrict__ dout,
                           T* __restrict__ dq, float scale) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const sq = reinterpret_cast<T*>(smem_raw);  // [kBM][D]
  T* const sdo = sq + kBM * D;                    // [kBM][D]
  T* const skv = sdo + kBM * D;                   // stage s: K [kBN][D] at skv + s * 2 kBN D, V after it
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t qt = gridDim.x - 1 - blockIdx.x;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t g = h / (lay.q_heads / lay.kv_heads);
  const int64_t i0 = qt * kBM;
  const int64_t rows_end = std::min(lay.seq, i0 + kBM);
  const int n_tiles = static_cast<int>((rows_end - 1) / kBN + 1);

  auto load_kv = [&](int tile, int stage) {
    const int64_t j0 = int64_t{tile} * kBN;
    const int valid = static_cast<int>(std::min(int64_t{kBN}, lay.seq - j0));
    const int64_t first = lay.kv_index(b, j0, g);
    T* const sk = skv + stage * 2 * kBN * D;
    load_tile_async<D, kBN>(k + first, lay.kv_row_stride, valid, sk);
    load_tile_async<D, kBN>(v + first, lay.kv_row_stride, valid, sk + kBN * D);
  };
  const int valid_q = static_cast<int>(rows_end - i0);
  load_tile_async<D, kBM>(q + lay.q_index(b, i0, h), lay.q_row_stride, valid_q, sq);
  load_tile_async<D, kBM>(dout + lay.o_index(b, i0, h), lay.out_row_stride, valid_q, sdo);
  load_kv(0, 0);
  cp_async_commit();

  // The lse and delta of the lane's rows quad_row, quad_row + 8 (0 past the sequence): lane
  // quad_col of the quad sums columns [quad_col D/4, (quad_col + 1) D/4) of dO * O, then the quad.
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int64_t warp_row0 = i0 + warp * 16;
  const bool warp_active = warp_row0 < lay.seq;
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = warp_row0 + quad_row + 8 * r;
    const bool valid = i < lay.seq;
    float acc = 0.0f;
    if (valid) {
      const int64_t base = lay.o_index(b, i, h) + quad_col * (D / 4);
      const uint4* o4 = reinterpret_cast<const uint4*>(out + base);
      const uint4* do4 = reinterpret_cast<const uint4*>(dout + base);
#pragma unroll
      for (int c = 0; c < D / 32; ++c) acc += dot8<T>(do4[c], o4[c]);
    }
    row_delta[r] = quad_sum(acc);
    row_lse[r] = valid ? lse[lay.lse_index(b, h, i)] : 0.0f;
  }
  float dq_acc[D / 8][4] = {};

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait_all();
    __syncthreads();
    if (tile + 1 < n_tiles) {
      load_kv(tile + 1, (tile + 1) % 2);
      cp_async_commit();
    }
    const int64_t j0 = int64_t{tile} * kBN;
    if (!warp_active || j0 > warp_row0 + 15) continue;
    const T* const sk = skv + (tile % 2) * 2 * kBN * D;
    const T* const sv = sk + kBN * D;

    float s[kBN / 8][4] = {}, ds[kBN / 8][4] = {};
    mma_rows_rows_t<T, D, kBN>(sq, warp * 16, sk, lane, s);    // S = Q K^T
    mma_rows_rows_t<T, D, kBN>(sdo, warp * 16, sv, lane, ds);  // dP = dO V^T
    const bool diagonal = j0 + kBN - 1 > warp_row0;  // as in the forward
    const int lim = diagonal ? static_cast<int>(warp_row0 - j0) : 0;
#pragma unroll
    for (int nb = 0; nb < kBN / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const tc::RowCol rc = tc::mma_c_elem(lane, e);
        float d = 0.0f;
        if (!(diagonal && nb * 8 + rc.col - rc.row > lim)) {
          const float p = math::attention_prob(s[nb][e] * scale, row_lse[e / 2]);
          d = math::attention_dscore(p, ds[nb][e], row_delta[e / 2]);
        }
        ds[nb][e] = d;
      }
    }
    mma_p_rows<T, D, kBN>(ds, sk, lane, dq_acc);  // dQ += dS K
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = warp_row0 + quad_row + 8 * r;
    if (!warp_active || i >= lay.seq) continue;
    T* const dst = dq + lay.q_index(b, i, h);
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      store_pair(dst + nb * 8 + tc::mma_c_elem(lane, 2 * r).col, dq_acc[nb][2 * r] * scale,
                 dq_acc[nb][2 * r + 1] * scale);
    }
  }
}

// ---------- backward: dK, dV ----------

template <int D>
constexpr std::size_t dkdv_tc_shared_bytes() {
  // K, V, then two stages of (Q, dO, O) and two of (lse, delta).
  return std::size_t{2 * kBM + 6 * kBQ<D>} * D * 2 + std::size_t{4 * kBQ<D>} * sizeof(float);
}

template <typename T, int D>
__global__ void __launch_bounds__(kTcThreads)
    attention_dkdv_tc_kernel(Layout lay, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                             const T* __restrict__ out, const float* __restrict__ lse, const T* __restrict__ dout,
                             T* __restrict__ dk, T* __restrict__ dv, float scale) {
  constexpr int BQ = kBQ<D>;
  constexpr int kStage = 3 * BQ * D;  // Q, dO, O of one query chunk
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const sk = reinterpret_cast<T*>(smem_raw);  // [kBM][D]
  T* const sv = sk + kBM * D;                     // [kBM][D]
  T* const schunk = sv + kBM * D;                 // stage s at schunk + s kStage: Q, dO, O [BQ][D] each
  float* const slse = reinterpret_cast<float*>(schunk + 2 * kStage);  // [2][BQ]
  float* const sdelta = slse + 2 * BQ;                                // [2][BQ]
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z;  // the longest (first) key tiles start first
  const int64_t group = lay.q_heads / lay.kv_heads;
  const int64_t j0 = kt * kBM;
  const int64_t n_chunks = (lay.seq - j0 + BQ - 1) / BQ;  // query chunks from the key tile's first key on
  const int64_t n_steps = group * n_chunks;              // (query head, chunk), heads in order

  auto load_chunk = [&](int64_t step, int stage) {
    const int64_t h = g * group + step / n_chunks;
    const int64_t i0 = j0 + (step % n_chunks) * BQ;
    const int valid = static_cast<int>(std::min(int64_t{BQ}, lay.seq - i0));
    const int64_t o_first = lay.o_index(b, i0, h);
    T* const base = schunk + stage * kStage;
    load_tile_async<D, BQ>(q + lay.q_index(b, i0, h), lay.q_row_stride, valid, base);
    load_tile_async<D, BQ>(dout + o_first, lay.out_row_stride, valid, base + BQ * D);
    load_tile_async<D, BQ>(out + o_first, lay.out_row_stride, valid, base + 2 * BQ * D);
    const int r = static_cast<int>(threadIdx.x);
    if (r < BQ) {
      const bool ok = r < valid;
      cp_async_4(slse + stage * BQ + r, ok ? lse + lay.lse_index(b, h, i0 + r) : lse, ok);
    }
  };
  const int valid_k = static_cast<int>(std::min(int64_t{kBM}, lay.seq - j0));
  const int64_t kv_first = lay.kv_index(b, j0, g);
  load_tile_async<D, kBM>(k + kv_first, lay.kv_row_stride, valid_k, sk);
  load_tile_async<D, kBM>(v + kv_first, lay.kv_row_stride, valid_k, sv);
  load_chunk(0, 0);
  cp_async_commit();

  // The lane's C-fragment rows are keys quad_row, quad_row + 8 of the warp's 16.
  const int quad_row = lane / 4;
  const int64_t warp_key0 = j0 + warp * 16;
  const bool warp_active = warp_key0 < lay.seq;
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};

  for (int64_t step = 0; step < n_steps; ++step) {
    const int stage = static_cast<int>(step % 2);
    cp_async_wait_all();
    __syncthreads();  // chunk `step` is visible; every warp is done with step - 1, whose stage is refilled next
    if (step + 1 < n_steps) {
      load_chunk(step + 1, stage ^ 1);
      cp_async_commit();
    }
    const T* const sq = schunk + stage * kStage;
    const T* const sdo = sq + BQ * D;
    {
      // delta of the chunk's rows (0 past the sequence: zero-filled rows): kTpr threads a row.
      constexpr int kTpr = kTcThreads / BQ;
      constexpr int kChunksPerThread = D / 8 / kTpr;
      static_assert(kTpr <= 32 && kChunksPerThread * kTpr * 8 == D, "delta: a row's threads within one warp");
      const T* const so = sdo + BQ * D;
      const int r = static_cast<int>(threadIdx.x) / kTpr, part = static_cast<int>(threadIdx.x) % kTpr;
      float acc = 0.0f;
#pragma unroll
      for (int c = 0; c < kChunksPerThread; ++c) {
        const int col = (part + c * kTpr) * 8;
        acc += dot8<T>(*reinterpret_cast<const uint4*>(sdo + tc::tile_offset<D>(r, col)),
                       *reinterpret_cast<const uint4*>(so + tc::tile_offset<D>(r, col)));
      }
#pragma unroll
      for (int off = kTpr / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
      if (part == 0) sdelta[stage * BQ + r] = acc;
    }
    __syncthreads();  // the chunk's deltas are visible
    const int64_t i0 = j0 + (step % n_chunks) * BQ;
    if (!warp_active || i0 + BQ - 1 < warp_key0) continue;  // every query before every key of the warp
    const float* const clse = slse + stage * BQ;
    const float* const cdelta = sdelta + stage * BQ;

    float p[BQ / 8][4] = {};
    mma_rows_rows_t<T, D, BQ>(sk, warp * 16, sq, lane, p);  // S^T = K Q^T
    // Element e of block nb: key warp_key0 + rc.row, query i0 + 8 nb + rc.col; kept where
    // query >= key and query < seq.
    const bool masked = i0 < warp_key0 + 15 || i0 + BQ > lay.seq;
    const int lo = static_cast<int>(std::clamp(warp_key0 - i0, int64_t{-BQ}, int64_t{kBM}));
    const int hi = static_cast<int>(std::min(int64_t{BQ}, lay.seq - i0));
#pragma unroll
    for (int nb = 0; nb < BQ / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const tc::RowCol rc = tc::mma_c_elem(lane, e);
        const int col = nb * 8 + rc.col;
        const bool keep = !masked || (col - rc.row >= lo && col < hi);
        p[nb][e] = keep ? math::attention_prob(p[nb][e] * scale, clse[col]) : 0.0f;
      }
    }
    mma_p_rows<T, D, BQ>(p, sdo, lane, dv_acc);  // dV += P^T dO
    float ds[BQ / 8][4] = {};
    mma_rows_rows_t<T, D, BQ>(sv, warp * 16, sdo, lane, ds);  // dP^T = V dO^T
#pragma unroll
    for (int nb = 0; nb < BQ / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nb * 8 + tc::mma_c_elem(lane, e).col;
        ds[nb][e] = math::attention_dscore(p[nb][e], ds[nb][e], cdelta[col]);  // 0 where p was masked
      }
    }
    mma_p_rows<T, D, BQ>(ds, sq, lane, dk_acc);  // dK += dS^T Q
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = warp_key0 + quad_row + 8 * r;
    if (!warp_active || j >= lay.seq) continue;
    const int64_t base = lay.dkv_index(b, j, g);
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      const int col = nb * 8 + tc::mma_c_elem(lane, 2 * r).col;
      store_pair(dv + base + col, dv_acc[nb][2 * r], dv_acc[nb][2 * r + 1]);
      store_pair(dk + base + col, dk_acc[nb][2 * r] * scale, dk_acc[nb][2 * r + 1] * scale);
    }
  }
}

// ---------- launches ----------

template <typename Kernel>
void reserve(Kernel* kernel, std::size_t bytes, std::int64_t head_dim, const char* op) {
  attention::reserve_shared(kernel, bytes, head_dim, op);
}

unsigned row_tiles(std::int64_t seq) { return static_cast<unsigned>((seq + kBM - 1) / kBM); }

template <typename T, int D>
void forward_tc(cudaStream_t stream, const AttentionShape& s, const void* q, const void* k, const void* v, void* out,
                float* lse, float scale) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  constexpr std::size_t bytes = forward_tc_shared_bytes<D>();
  reserve(attention_forward_tc_kernel<T, D>, bytes, D, "attention_forward");
  const dim3 grid(row_tiles(s.seq), static_cast<unsigned>(s.q_heads), static_cast<unsigned>(s.batch));
  attention_forward_tc_kernel<T, D><<<grid, kTcThreads, bytes, stream>>>(
      Layout::of(s), static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out),
      lse, scale);
  check_launch();
}

template <typename T, int D>
void backward_tc(cudaStream_t stream, const AttentionShape& s, const void* q, const void* k, const void* v,
                 const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv, float scale) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  constexpr std::size_t dkdv_bytes = dkdv_tc_shared_bytes<D>();
  constexpr std::size_t dq_bytes = dq_tc_shared_bytes<D>();
  reserve(attention_dkdv_tc_kernel<T, D>, dkdv_bytes, D, "attention_backward");
  reserve(attention_dq_tc_kernel<T, D>, dq_bytes, D, "attention_backward");
  const unsigned tiles = row_tiles(s.seq);
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

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

namespace attention {

bool tc_supported(DType dtype, const AttentionShape& s, std::initializer_list<const void*> pointers) {
  if (dtype == DType::F32 || (s.head_dim != 64 && s.head_dim != 128)) return false;
  for (const std::int64_t stride : {s.q_row_stride, s.kv_row_stride, s.out_row_stride, s.dkv_stride()}) {
    if (stride % 8 != 0) return false;  // every row (and head) starts 16-byte aligned
  }
  for (const void* p : pointers) {
    if (p != nullptr && !aligned16(p)) return false;
  }
  return true;
}

TcVariant tc_variant() {
  static const TcVariant variant = [] {
    const char* v = std::getenv("STRATA_ATTENTION_TC");
    return v != nullptr && std::strcmp(v, "fa2") == 0 ? TcVariant::Fa2 : TcVariant::Wmma;
  }();
  return variant;
}

void tc_forward(cudaStream_t stream, DType dtype, const AttentionShape& s, const void* q, const void* k, const void* v,
                void* out, float* lse, float scale) {
  if (tc_variant() == TcVariant::Wmma) return tc_forward_wmma(stream, dtype, s, q, k, v, out, lse, scale);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (s.head_dim == 64) forward_tc<T, 64>(stream, s, q, k, v, out, lse, scale);
    else forward_tc<T, 128>(stream, s, q, k, v, out, lse, scale);
  };
  if (dtype == DType::BF16) run(bf16{});
  else run(fp16{});
}

void tc_backward(cudaStream_t stream, DType dtype, const AttentionShape& s, const void* q, const void* k,
                 const void* v, const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv,
                 float scale) {
  if (tc_variant() == TcVariant::Wmma) {
    return tc_backward_wmma(stream, dtype, s, q, k, v, out, lse, dout, dq, dk, dv, scale);
  }
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
