// Flash-attention 2's forward on tensor cores (the design: cuda_attention_tc.cuh), fa2 and fa2w
// (Note [Wide warps]), the tensor-core path's entry points (attention::tc_supported, tc_forward)
// and the choice between them and the WMMA kernels (Note [Two tensor-core kernels] in
// models/kernels/cuda_attention.cuh).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "models/kernels/cuda_attention_tc.cuh"

namespace strata::models::cuda {
namespace tc_kernels {
namespace {

// ---------- forward ----------

// Note [Wide warps]: in fa2's forward a warp owns 16 query rows, so every K
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
// Opt-in until it has passed the attention op tests and been timed beside fa2 on a GPU
// (tools/gpu-verify.sh and tools/gpu-bench.sh run it).
// fa2 and fa2w are one kernel: MT row tiles per warp and BN keys a step; kFastExp picks the exp2
// probabilities (fa2w) or the shared op_math ones (fa2: math::shifted_exp, online_softmax_rescale,
// online_softmax_lse). The backward kernels (cuda_attention_tc_backward.cu) take MT the same way.

constexpr float kLog2e = 1.4426950408889634f;

// 2^x by one MUFU.EX2, subnormal results flushed to 0 (exp2f adds their scaling); 2^-inf = 0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <int D, int BN>
constexpr std::size_t forward_tc_shared_bytes() {
  return std::size_t{kBM + 4 * BN} * D * 2;  // Q, then two stages of K and V
}

template <typename T, int D, int MT, int BN, bool kFastExp>
__global__ void __launch_bounds__(kThreadsFor<MT>)
    attention_forward_tc_kernel(Layout lay, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                T* __restrict__ out, float* __restrict__ lse, float scale) {
  constexpr int kThreads = kThreadsFor<MT>;
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
  const float scale_log2 = scale * kLog2e;  // fa2w: scores stay raw, their maximum too (scale > 0)

  auto load_kv = [&](int tile, int stage) {
    load_kv_tile_async<D, T, kThreads, BN>(lay, k, v, b, g, tile, skv + stage * 2 * BN * D);
  };
  load_tile_async<D, kBM, T, kThreads>(q + lay.q_index(b, i0, h), lay.q_row_stride, static_cast<int>(rows_end - i0),
                                       sq);
  load_kv(0, 0);
  cp_async_commit();

  // Row tile mt of the warp starts at warp_row0 + 16 mt; the lane's C-fragment rows in it are
  // quad_row and quad_row + 8 (tc::mma_c_elem).
  const int quad_row = lane / 4;
  const int64_t warp_row0 = i0 + warp * 16 * MT;
  const bool warp_active = warp_row0 < lay.seq;
  float o[MT][D / 8][4] = {};
  float m[MT][2], l[MT][2];
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
    mma_rows_rows_t<T, D, BN, MT>(sq, warp * 16 * MT, sk, lane, s);  // S = Q K^T
    // Element e of block nb of row tile mt: row r0 + rc.row (r0 = warp_row0 + 16 mt), key
    // j0 + 8 nb + rc.col. Tiles start at multiples of BN (32 or 64) and warps at multiples of 16 MT,
    // so a computed tile has j0 <= warp_row0 <= r0: every row sees key j0. Only a tile reaching past
    // r0 has keys after some row of the row tile (then r0 - j0 is a multiple of 16 below BN); keys
    // past the sequence come after every valid row.
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
          float x = kFastExp ? s[mt][nb][e] : s[mt][nb][e] * scale;
          if (diagonal && nb * 8 + rc.col - rc.row > lim) x = -INFINITY;
          s[mt][nb][e] = x;
          tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
        }
      }
      float corr[2], m_new[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // Every computed row sees at least key j0 in every computed tile: m_new is finite.
        m_new[r] = fmaxf(m[mt][r], quad_max(tile_max[r]));
        corr[r] = kFastExp ? exp2_ftz((m[mt][r] - m_new[r]) * scale_log2)
                           : math::online_softmax_rescale(m[mt][r], m_new[r]);
      }
#pragma unroll
      for (int nb = 0; nb < BN / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          // exp(-inf - finite) = 0: masked
          const float p = kFastExp ? exp2_ftz(fmaf(s[mt][nb][e], scale_log2, -m_new[e / 2] * scale_log2))
                                   : math::shifted_exp(s[mt][nb][e], m_new[e / 2]);
          sum[e / 2] += p;
          s[mt][nb][e] = p;
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l[mt][r] = l[mt][r] * corr[r] + quad_sum(sum[r]);
        m[mt][r] = m_new[r];
      }
#pragma unroll
      for (int nb = 0; nb < D / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][nb][e] *= corr[e / 2];
      }
    }
    mma_p_rows<T, D, BN, MT>(s, sv, lane, o);  // O += P V
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
      if (lane % 4 == 0) {
        lse[lay.lse_index(b, h, i)] =
            kFastExp ? m[mt][r] * scale + logf(l[mt][r]) : math::online_softmax_lse(m[mt][r], l[mt][r]);
      }
    }
  }
}

// fa2: 8 warps of 16 rows, 64 keys a step. fa2w (Note [Wide warps]): 4 warps of 32 rows, 64 keys a
// step at head dim 64 and 32 at 128, where 64 left ptxas 50 registers short (200 bytes spilled).
template <typename T, int D, bool kWide>
void forward_tc(cudaStream_t stream, const AttentionShape& s, const void* q, const void* k, const void* v, void* out,
                float* lse, float scale) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  constexpr int MT = kWide ? 2 : 1;
  constexpr int BN = kWide && D == 128 ? 32 : kBN;
  constexpr auto kernel = attention_forward_tc_kernel<T, D, MT, BN, kWide>;
  constexpr std::size_t bytes = forward_tc_shared_bytes<D, BN>();
  attention::reserve_shared(kernel, bytes, D, "attention_forward");
  const dim3 grid(row_tiles(s.seq), static_cast<unsigned>(s.q_heads), static_cast<unsigned>(s.batch));
  kernel<<<grid, kThreadsFor<MT>, bytes, stream>>>(Layout::of(s), static_cast<const T*>(q), static_cast<const T*>(k),
                                                   static_cast<const T*>(v), static_cast<T*>(out), lse, scale);
  check_launch();
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace
}  // namespace tc_kernels

namespace attention {

bool tc_supported(DType dtype, const AttentionShape& s, std::initializer_list<const void*> pointers) {
  if (dtype == DType::F32 || (s.head_dim != 64 && s.head_dim != 128)) return false;
  for (const std::int64_t stride : {s.q_row_stride, s.kv_row_stride, s.out_row_stride, s.dkv_stride()}) {
    if (stride % 8 != 0) return false;  // every row (and head) starts 16-byte aligned
  }
  for (const void* p : pointers) {
    if (p != nullptr && !tc_kernels::aligned16(p)) return false;
  }
  return true;
}

TcVariant tc_variant() {
  static const TcVariant variant = [] {
    const char* v = std::getenv("STRATA_ATTENTION_TC");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "fa2") == 0) return TcVariant::Fa2;
    if (std::strcmp(v, "wmma") == 0) return TcVariant::Wmma;
    if (std::strcmp(v, "fa2w") == 0) return TcVariant::Fa2Wide;
    throw ConfigError(std::string("STRATA_ATTENTION_TC=") + v +
                      " is not a tensor-core attention kernel; use fa2 (the default), fa2w or wmma, or unset it");
  }();
  return variant;
}

void tc_forward(cudaStream_t stream, DType dtype, const AttentionShape& s, const void* q, const void* k, const void* v,
                void* out, float* lse, float scale) {
  if (tc_variant() == TcVariant::Wmma) return tc_forward_wmma(stream, dtype, s, q, k, v, out, lse, scale);
  auto run = [&](auto tag, auto wide) {
    using T = decltype(tag);
    constexpr bool kWide = decltype(wide)::value;
    if (s.head_dim == 64) tc_kernels::forward_tc<T, 64, kWide>(stream, s, q, k, v, out, lse, scale);
    else tc_kernels::forward_tc<T, 128, kWide>(stream, s, q, k, v, out, lse, scale);
  };
  auto with_dtype = [&](auto wide) {
    if (dtype == DType::BF16) run(bf16{}, wide);
    else run(fp16{}, wide);
  };
  if (tc_variant() == TcVariant::Fa2Wide) with_dtype(std::true_type{});
  else with_dtype(std::false_type{});
}

}  // namespace attention
}  // namespace strata::models::cuda
