// The flash-attention 2 tensor-core kernels' shared pieces (cuda_attention_tc.cu: forward;
// cuda_attention_tc_backward.cu: dQ and dK/dV): tile sizes, the inline-PTX wrappers (mma.sync,
// ldmatrix, cp.async), the swizzled tile loads and the warp products. The default tensor-core
// attention (see Note [Two tensor-core kernels] in models/kernels/cuda_attention.cuh);
// STRATA_ATTENTION_TC=wmma takes cuda_attention_tc_wmma.cu's kernels instead.
// CUDA causal attention on tensor cores (bf16/fp16 operands, fp32 accumulation): the path
// cuda_attention.cu and cuda_attention_backward.cu take for bf16 and fp16 at head_dim 64 or 128
// with 16-byte aligned rows (attention::tc_supported); fp32 (exact mode) and other shapes keep the
// scalar kernels. Flash-attention 2's kernels written with mma.sync.m16n8k16, ldmatrix and
// cp.async (inline PTX; the fragment, ldmatrix and swizzle maps are attention_tc_layout.h's, where
// the PTX ISA's layouts are quoted, checked on the host by tests/models/attention_tc_layout_test.cc):
//  * every block has 8 warps (fa2w: 4 of 32 rows, Note [Wide warps] in models/kernels/cuda_attention_tc.cu); a
//    warp owns 16 rows (query rows, or in dK/dV key rows) and keeps its
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
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "models/kernels/attention_tc_layout.h"
#include "models/kernels/cuda_attention.cuh"
#include "models/kernels/op_math.h"

namespace strata::models::cuda::tc_kernels {

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
// Warps and threads of a block of kBM rows whose warps own MT row tiles of 16 (fa2: 1, fa2w: 2;
// Note [Wide warps] in models/kernels/cuda_attention_tc.cu).
template <int MT>
constexpr int kWarpsFor = kBM / (16 * MT);
template <int MT>
constexpr int kThreadsFor = kWarpsFor<MT> * 32;

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
// block (Threads threads) calls it; the caller commits the group.
template <int D, int Rows, typename T, int Threads = kTcThreads>
__device__ __forceinline__ void load_tile_async(const T* src, int64_t row_stride, int valid, T* dst) {
  constexpr int kChunks = D / 8;
  constexpr int kRowsPerPass = Threads / kChunks;
  static_assert(Threads % kChunks == 0 && kRowsPerPass % 8 == 0 && Rows % kRowsPerPass == 0,
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

// Key tile `tile` (BN rows of k and of v, KV head g of batch item b) into one stage of the
// double-buffered K/V tiles: k's rows, then v's (forward and dQ).
template <int D, typename T, int Threads = kTcThreads, int BN = kBN>
__device__ __forceinline__ void load_kv_tile_async(const Layout& lay, const T* k, const T* v, int64_t b, int64_t g,
                                                   int tile, T* stage) {
  const int64_t j0 = int64_t{tile} * BN;
  const int valid = static_cast<int>(std::min(int64_t{BN}, lay.seq - j0));
  const int64_t first = lay.kv_index(b, j0, g);
  load_tile_async<D, BN, T, Threads>(k + first, lay.kv_row_stride, valid, stage);
  load_tile_async<D, BN, T, Threads>(v + first, lay.kv_row_stride, valid, stage + BN * D);
}

// acc[mt][n] += A B^T for the warp: A its MT row tiles of 16 (tile mt: rows a_row0 + 16 mt ..) of a
// [row][D] tile, B the N rows of another (S = Q K^T, dP = dO V^T, S^T = K Q^T, dP^T = V dO^T).
// acc[mt][n] is the C fragment of columns 8n..8n+7 of row tile mt. A by ldmatrix
// (tc::ldsm_a_addr), B by ldmatrix without .trans from its [n][k] rows (tc::ldsm_b_addr): registers
// 0, 1 are block 2np, registers 2, 3 block 2np + 1. Each B fragment loaded feeds MT products (Note
// [Wide warps] in models/kernels/cuda_attention_tc.cu).
template <typename T, int D, int N, int MT>
__device__ __forceinline__ void mma_rows_rows_t(const T* a_tile, int a_row0, const T* b_tile, int lane,
                                                float (&acc)[MT][N / 8][4]) {
  const tc::RowCol pa = tc::ldsm_a_addr(lane), pb = tc::ldsm_b_addr(lane);
#pragma unroll 2  // fully unrolled, ptxas hoists all the loads of the product and spills at D = 128
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], a_tile + tc::tile_offset<D>(a_row0 + 16 * mt + pa.row, kk * 16 + pa.col));
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t bb[4];
      ldsm_x4(bb, b_tile + tc::tile_offset<D>(np * 16 + pb.row, kk * 16 + pb.col));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        TcOps<T>::mma(acc[mt][2 * np], a[mt], bb[0], bb[1]);
        TcOps<T>::mma(acc[mt][2 * np + 1], a[mt], bb[2], bb[3]);
      }
    }
  }
}

// acc[mt][n] += P M for the warp: P the MT x 16 x N fp32 product in C fragments (p[mt][n]: columns
// 8n..8n+7 of row tile mt), rounded to T into A fragments in registers (A columns 16kk.. are C
// blocks 2kk, 2kk + 1: tc::a_source_block / a_source_elem), M the N rows of a [row][D] tile read as
// B = M ([k][n], n contiguous) by ldmatrix .trans (tc::ldsm_bt_addr): registers 0, 1 are block
// 2dp, 2, 3 block 2dp + 1. (O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q.)
template <typename T, int D, int N, int MT>
__device__ __forceinline__ void mma_p_rows(const float (&p)[MT][N / 8][4], const T* m_tile, int lane,
                                           float (&acc)[MT][D / 8][4]) {
  const tc::RowCol pb = tc::ldsm_bt_addr(lane);
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        a[mt][r] = TcOps<T>::pack(p[mt][2 * kk + tc::a_source_block(2 * r)][tc::a_source_elem(2 * r)],
                                  p[mt][2 * kk + tc::a_source_block(2 * r + 1)][tc::a_source_elem(2 * r + 1)]);
      }
    }
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t bb[4];
      ldsm_x4_trans(bb, m_tile + tc::tile_offset<D>(kk * 16 + pb.row, dp * 16 + pb.col));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        TcOps<T>::mma(acc[mt][2 * dp], a[mt], bb[0], bb[1]);
        TcOps<T>::mma(acc[mt][2 * dp + 1], a[mt], bb[2], bb[3]);
      }
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

inline unsigned row_tiles(std::int64_t seq) { return static_cast<unsigned>((seq + kBM - 1) / kBM); }

}  // namespace strata::models::cuda::tc_kernels
