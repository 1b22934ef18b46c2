// Flash-attention 2's backward on tensor cores (the design: cuda_attention_tc.cuh): a dK/dV kernel
// and a dQ kernel, so every output element is written by one warp (no atomics), for fa2 and fa2w
// (Note [Wide warps] in models/kernels/cuda_attention_tc.cu), and tc_backward.
#include "models/kernels/cuda_attention_tc.cuh"

namespace strata::models::cuda {
namespace tc_kernels {
namespace {

// ---------- dK, dV ----------

template <int D, int BQ>
constexpr std::size_t dkdv_tc_shared_bytes() {
  // K, V, then two stages of (Q, dO, O) and two of (lse, delta).
  return std::size_t{2 * kBM + 6 * BQ} * D * 2 + std::size_t{4 * BQ} * sizeof(float);
}

// Warps of MT row tiles of 16 keys (Note [Wide warps] in models/kernels/cuda_attention_tc.cu), BQ query rows a step.
template <typename T, int D, int MT, int BQ>
__global__ void __launch_bounds__(kThreadsFor<MT>)
    attention_dkdv_tc_kernel(Layout lay, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                               const T* __restrict__ out, const float* __restrict__ lse, const T* __restrict__ dout,
                               T* __restrict__ dk, T* __restrict__ dv, float scale) {
  constexpr int kThreads = kThreadsFor<MT>;
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
    load_tile_async<D, BQ, T, kThreads>(q + lay.q_index(b, i0, h), lay.q_row_stride, valid, base);
    load_tile_async<D, BQ, T, kThreads>(dout + o_first, lay.out_row_stride, valid, base + BQ * D);
    load_tile_async<D, BQ, T, kThreads>(out + o_first, lay.out_row_stride, valid, base + 2 * BQ * D);
    const int r = static_cast<int>(threadIdx.x);
    if (r < BQ) {
      const bool ok = r < valid;
      cp_async_4(slse + stage * BQ + r, ok ? lse + lay.lse_index(b, h, i0 + r) : lse, ok);
    }
  };
  const int valid_k = static_cast<int>(std::min(int64_t{kBM}, lay.seq - j0));
  const int64_t kv_first = lay.kv_index(b, j0, g);
  load_tile_async<D, kBM, T, kThreads>(k + kv_first, lay.kv_row_stride, valid_k, sk);
  load_tile_async<D, kBM, T, kThreads>(v + kv_first, lay.kv_row_stride, valid_k, sv);
  load_chunk(0, 0);
  cp_async_commit();

  // Key tile mt of the warp starts at warp_key0 + 16 mt; the lane's C-fragment rows in it are keys
  // quad_row and quad_row + 8.
  const int quad_row = lane / 4;
  const int64_t warp_key0 = j0 + warp * 16 * MT;
  const bool warp_active = warp_key0 < lay.seq;
  float dk_acc[MT][D / 8][4] = {}, dv_acc[MT][D / 8][4] = {};

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
      constexpr int kTpr = kThreads / BQ;
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

    float p[MT][BQ / 8][4] = {};
    mma_rows_rows_t<T, D, BQ, MT>(sk, warp * 16 * MT, sq, lane, p);  // S^T = K Q^T
    // Element e of block nb of tile mt: key warp_key0 + 16 mt + rc.row, query i0 + 8 nb + rc.col;
    // kept where query >= key and query < seq (as fa2's kernel, per tile).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int64_t key0 = warp_key0 + 16 * mt;
      const bool masked = i0 < key0 + 15 || i0 + BQ > lay.seq;
      const int lo = static_cast<int>(std::clamp(key0 - i0, int64_t{-BQ}, int64_t{kBM}));
      const int hi = static_cast<int>(std::min(int64_t{BQ}, lay.seq - i0));
#pragma unroll
      for (int nb = 0; nb < BQ / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const tc::RowCol rc = tc::mma_c_elem(lane, e);
          const int col = nb * 8 + rc.col;
          const bool keep = !masked || (col - rc.row >= lo && col < hi);
          p[mt][nb][e] = keep ? math::attention_prob(p[mt][nb][e] * scale, clse[col]) : 0.0f;
        }
      }
    }
    mma_p_rows<T, D, BQ, MT>(p, sdo, lane, dv_acc);  // dV += P^T dO
    float ds[MT][BQ / 8][4] = {};
    mma_rows_rows_t<T, D, BQ, MT>(sv, warp * 16 * MT, sdo, lane, ds);  // dP^T = V dO^T
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nb = 0; nb < BQ / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = nb * 8 + tc::mma_c_elem(lane, e).col;
          ds[mt][nb][e] = math::attention_dscore(p[mt][nb][e], ds[mt][nb][e], cdelta[col]);  // 0 where masked
        }
      }
    }
    mma_p_rows<T, D, BQ, MT>(ds, sq, lane, dk_acc);  // dK += dS^T Q
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t j = warp_key0 + 16 * mt + quad_row + 8 * r;
      if (!warp_active || j >= lay.seq) continue;
      const int64_t base = lay.dkv_index(b, j, g);
#pragma unroll
      for (int nb = 0; nb < D / 8; ++nb) {
        const int col = nb * 8 + tc::mma_c_elem(lane, 2 * r).col;
        store_pair(dv + base + col, dv_acc[mt][nb][2 * r], dv_acc[mt][nb][2 * r + 1]);
        store_pair(dk + base + col, dk_acc[mt][nb][2 * r] * scale, dk_acc[mt][nb][2 * r + 1] * scale);
      }
    }
  }
}

// ---------- dQ ----------

template <int D, int BN>
constexpr std::size_t dq_tc_shared_bytes() {
  return std::size_t{2 * kBM + 4 * BN} * D * 2;  // Q, dO, then two stages of K and V
}

// Warps of MT row tiles of 16 queries, BN keys a step.
template <typename T, int D, int MT, int BN>
__global__ void __launch_bounds__(kThreadsFor<MT>)
    attention_dq_tc_kernel(Layout lay, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                             const T* __restrict__ out, const float* __restrict__ lse, const T* __restrict__ dout,
                             T* __restrict__ dq, float scale) {
  constexpr int kThreads = kThreadsFor<MT>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const sq = reinterpret_cast<T*>(smem_raw);  // [kBM][D]
  T* const sdo = sq + kBM * D;                    // [kBM][D]
  T* const skv = sdo + kBM * D;                   // stage s: K [BN][D] at skv + s * 2 BN D, V after it
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t qt = gridDim.x - 1 - blockIdx.x;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t g = h / (lay.q_heads / lay.kv_heads);
  const int64_t i0 = qt * kBM;
  const int64_t rows_end = std::min(lay.seq, i0 + kBM);
  const int n_tiles = static_cast<int>((rows_end - 1) / BN + 1);

  auto load_kv = [&](int tile, int stage) {
    load_kv_tile_async<D, T, kThreads, BN>(lay, k, v, b, g, tile, skv + stage * 2 * BN * D);
  };
  const int valid_q = static_cast<int>(rows_end - i0);
  load_tile_async<D, kBM, T, kThreads>(q + lay.q_index(b, i0, h), lay.q_row_stride, valid_q, sq);
  load_tile_async<D, kBM, T, kThreads>(dout + lay.o_index(b, i0, h), lay.out_row_stride, valid_q, sdo);
  load_kv(0, 0);
  cp_async_commit();

  // The lse and delta of the lane's rows (tile mt: quad_row and quad_row + 8 of its 16; 0 past the
  // sequence): lane quad_col of the quad sums columns [quad_col D/4, (quad_col + 1) D/4) of
  // dO * O, then the quad.
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int64_t warp_row0 = i0 + warp * 16 * MT;
  const bool warp_active = warp_row0 < lay.seq;
  float row_lse[MT][2], row_delta[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t i = warp_row0 + 16 * mt + quad_row + 8 * r;
      const bool valid = i < lay.seq;
      float acc = 0.0f;
      if (valid) {
        const int64_t base = lay.o_index(b, i, h) + quad_col * (D / 4);
        const uint4* o4 = reinterpret_cast<const uint4*>(out + base);
        const uint4* do4 = reinterpret_cast<const uint4*>(dout + base);
#pragma unroll
        for (int c = 0; c < D / 32; ++c) acc += dot8<T>(do4[c], o4[c]);
      }
      row_delta[mt][r] = quad_sum(acc);
      row_lse[mt][r] = valid ? lse[lay.lse_index(b, h, i)] : 0.0f;
    }
  }
  float dq_acc[MT][D / 8][4] = {};

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait_all();
    __syncthreads();
    if (tile + 1 < n_tiles) {
      load_kv(tile + 1, (tile + 1) % 2);
      cp_async_commit();
    }
    const int64_t j0 = int64_t{tile} * BN;
    if (!warp_active || j0 > warp_row0 + 16 * MT - 1) continue;
    const T* const sk = skv + (tile % 2) * 2 * BN * D;
    const T* const sv = sk + BN * D;

    float s[MT][BN / 8][4] = {}, ds[MT][BN / 8][4] = {};
    mma_rows_rows_t<T, D, BN, MT>(sq, warp * 16 * MT, sk, lane, s);    // S = Q K^T
    mma_rows_rows_t<T, D, BN, MT>(sdo, warp * 16 * MT, sv, lane, ds);  // dP = dO V^T
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      // As in the forward: j0 <= the warp's first row <= r0, and r0 - j0 is a multiple of 16 below BN
      // on a diagonal tile.
      const int64_t r0 = warp_row0 + 16 * mt;
      const bool diagonal = j0 + BN - 1 > r0;
      const int lim = diagonal ? static_cast<int>(r0 - j0) : 0;
#pragma unroll
      for (int nb = 0; nb < BN / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const tc::RowCol rc = tc::mma_c_elem(lane, e);
          float d = 0.0f;
          if (!(diagonal && nb * 8 + rc.col - rc.row > lim)) {
            const float p = math::attention_prob(s[mt][nb][e] * scale, row_lse[mt][e / 2]);
            d = math::attention_dscore(p, ds[mt][nb][e], row_delta[mt][e / 2]);
          }
          ds[mt][nb][e] = d;
        }
      }
    }
    mma_p_rows<T, D, BN, MT>(ds, sk, lane, dq_acc);  // dQ += dS K
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t i = warp_row0 + 16 * mt + quad_row + 8 * r;
      if (!warp_active || i >= lay.seq) continue;
      T* const dst = dq + lay.q_index(b, i, h);
#pragma unroll
      for (int nb = 0; nb < D / 8; ++nb) {
        store_pair(dst + nb * 8 + tc::mma_c_elem(lane, 2 * r).col, dq_acc[mt][nb][2 * r] * scale,
                   dq_acc[mt][nb][2 * r + 1] * scale);
      }
    }
  }
}

// fa2: 8 warps of 16 rows, 64 keys a dQ step, kBQ<D> query rows a dK/dV step. fa2w at head dim 64
// (Note [Wide warps] in models/kernels/cuda_attention_tc.cu): 4 warps of 32 rows, 32 of each a step (64 left too few
// registers for the two tiles' score and gradient fragments; dK/dV still spills 36 bytes at 255 registers for sm_90,
// and 16 rows a step spill nothing, with twice the barriers per product: which is faster is for the GPU
// to say). At head dim 128 two tiles' dK and dV accumulators alone would take 256 registers, so
// fa2w keeps fa2's backward there.
template <typename T, int D, bool kWide>
void backward_tc(cudaStream_t stream, const AttentionShape& s, const void* q, const void* k, const void* v,
                 const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv, float scale) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  static_assert(!kWide || D == 64, "fa2w's backward is for head dim 64");
  constexpr int MT = kWide ? 2 : 1;
  constexpr int BQ = kWide ? 32 : kBQ<D>, BN = kWide ? 32 : kBN;
  constexpr auto dkdv_kernel = attention_dkdv_tc_kernel<T, D, MT, BQ>;
  constexpr auto dq_kernel = attention_dq_tc_kernel<T, D, MT, BN>;
  constexpr std::size_t dkdv_bytes = dkdv_tc_shared_bytes<D, BQ>();
  constexpr std::size_t dq_bytes = dq_tc_shared_bytes<D, BN>();
  attention::reserve_shared(dkdv_kernel, dkdv_bytes, D, "attention_backward");
  attention::reserve_shared(dq_kernel, dq_bytes, D, "attention_backward");
  const unsigned tiles = row_tiles(s.seq);
  const auto* qt = static_cast<const T*>(q);
  const auto* kt = static_cast<const T*>(k);
  const auto* vt = static_cast<const T*>(v);
  const auto* ot = static_cast<const T*>(out);
  const auto* dot = static_cast<const T*>(dout);
  dkdv_kernel<<<dim3(tiles, static_cast<unsigned>(s.kv_heads), static_cast<unsigned>(s.batch)), kThreadsFor<MT>,
                dkdv_bytes, stream>>>(Layout::of(s), qt, kt, vt, ot, lse, dot, static_cast<T*>(dk), static_cast<T*>(dv),
                                      scale);
  check_launch();
  dq_kernel<<<dim3(tiles, static_cast<unsigned>(s.q_heads), static_cast<unsigned>(s.batch)), kThreadsFor<MT>,
              dq_bytes, stream>>>(Layout::of(s), qt, kt, vt, ot, lse, dot, static_cast<T*>(dq), scale);
  check_launch();
}

}  // namespace
}  // namespace tc_kernels

namespace attention {

void tc_backward(cudaStream_t stream, DType dtype, const AttentionShape& s, const void* q, const void* k,
                 const void* v, const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv,
                 float scale) {
  if (tc_variant() == TcVariant::Wmma) {
    return tc_backward_wmma(stream, dtype, s, q, k, v, out, lse, dout, dq, dk, dv, scale);
  }
  const bool wide = tc_variant() == TcVariant::Fa2Wide;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (s.head_dim == 64 && wide) tc_kernels::backward_tc<T, 64, true>(stream, s, q, k, v, out, lse, dout, dq, dk, dv, scale);
    else if (s.head_dim == 64) tc_kernels::backward_tc<T, 64, false>(stream, s, q, k, v, out, lse, dout, dq, dk, dv, scale);
    else tc_kernels::backward_tc<T, 128, false>(stream, s, q, k, v, out, lse, dout, dq, dk, dv, scale);
  };
  if (dtype == DType::BF16) run(bf16{});
  else run(fp16{});
}

}  // namespace attention
}  // namespace strata::models::cuda
