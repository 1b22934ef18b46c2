// Flash-attention 2's forward on tensor cores (the design: cuda_attention_tc.cuh), the tensor-core
// path's entry points (attention::tc_supported, tc_forward) and the choice between it and the WMMA
// kernels (Note [Two tensor-core kernels]).
#include <cstdlib>
#include <cstring>

#include "models/kernels/cuda_attention_tc.cuh"

namespace strata::models::cuda {
namespace tc_kernels {
namespace {

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
    load_kv_tile_async<D>(lay, k, v, b, g, tile, skv + stage * 2 * kBN * D);
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

template <typename T, int D>
void forward_tc(cudaStream_t stream, const AttentionShape& s, const void* q, const void* k, const void* v, void* out,
                float* lse, float scale) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  constexpr std::size_t bytes = forward_tc_shared_bytes<D>();
  attention::reserve_shared(attention_forward_tc_kernel<T, D>, bytes, D, "attention_forward");
  const dim3 grid(row_tiles(s.seq), static_cast<unsigned>(s.q_heads), static_cast<unsigned>(s.batch));
  attention_forward_tc_kernel<T, D><<<grid, kTcThreads, bytes, stream>>>(
      Layout::of(s), static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out),
      lse, scale);
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
  if (tc_variant() == TcVariant::Fa2Wide) return tc_forward_wide(stream, dtype, s, q, k, v, out, lse, scale);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (s.head_dim == 64) tc_kernels::forward_tc<T, 64>(stream, s, q, k, v, out, lse, scale);
    else tc_kernels::forward_tc<T, 128>(stream, s, q, k, v, out, lse, scale);
  };
  if (dtype == DType::BF16) run(bf16{});
  else run(fp16{});
}

}  // namespace attention
}  // namespace strata::models::cuda
