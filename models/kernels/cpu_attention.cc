// CPU causal multi-head attention (grouped-query heads) in the flash-attention style: queries are
// processed in tiles against key/value tiles with an online (streamed) softmax, so memory is
// O(tile * head_dim) per task and never O(seq^2). Backward recomputes the probabilities from q, k
// and the saved log-sum-exp. Two backward passes keep every output written by exactly one task
// (deterministic, no atomics): pass 1 owns a key tile of one kv head (dK, dV, summed over its
// query heads and query tiles in a fixed order); pass 2 owns a query tile of one head (dQ).
//
// Inner loops are written as axpy updates over contiguous rows (keys are transposed into the tile),
// which GCC vectorizes without reassociating sums, so results stay bit-reproducible.
//
// attention_cached (the KV cache's attention, Note [KV cache] in models/kv_decoder.h) runs the
// forward's per-tile function on new query rows over a cache, so each row gets the forward's bits.
#include <algorithm>
#include <cmath>
#include <vector>

#include "models/kernels/cpu_common.h"
#include "models/kernels/cpu_kernels.h"
#include "models/kernels/op_math.h"

namespace strata::models::cpu {

namespace {

constexpr std::int64_t kTile = 32;

struct Layout {
  AttentionShape s;
  std::int64_t q_index(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return (b * s.seq + t) * s.q_row_stride + h * s.head_dim;
  }
  std::int64_t kv_index(std::int64_t b, std::int64_t t, std::int64_t g) const {
    return (b * s.seq + t) * s.kv_row_stride + g * s.head_dim;
  }
  std::int64_t o_index(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return (b * s.seq + t) * s.out_row_stride + h * s.head_dim;
  }
  std::int64_t dkv_index(std::int64_t b, std::int64_t t, std::int64_t g) const {
    return (b * s.seq + t) * s.dkv_stride() + g * s.head_dim;
  }
  std::int64_t lse_index(std::int64_t b, std::int64_t h, std::int64_t t) const {
    return (b * s.lse_heads_or_q() + h) * s.seq + t;
  }
  std::int64_t delta_index(std::int64_t b, std::int64_t h, std::int64_t t) const {  // the backward's own [b, h, t]
    return (b * s.q_heads + h) * s.seq + t;
  }
};

// Per-task scratch: one tile of each operand in fp32.
struct Tiles {
  explicit Tiles(std::int64_t d)
      : q(kTile * d), kt(d * kTile), k(kTile * d), v(kTile * d), vt(d * kTile), dout(kTile * d), s(kTile * kTile),
        dp(kTile * kTile), acc(kTile * d) {}
  std::vector<float> q, kt, k, v, vt, dout, s, dp, acc;
};

// rows x d of T at `src` (row i at src + index(i)) into dense fp32; `transposed` writes [d][kTile].
template <typename T, typename Index>
void load_tile(const void* src, std::int64_t rows, std::int64_t d, Index index, float scale, float* dst,
               bool transposed) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t base = index(i);
    for (std::int64_t c = 0; c < d; ++c) {
      const float v = load<T>(src, base + c) * scale;
      if (transposed) {
        dst[c * kTile + i] = v;
      } else {
        dst[i * d + c] = v;
      }
    }
  }
}

// s[i][j] = sum_c a[i][c] * bt[c][j] for i < rows, j < cols (bt is [d][kTile]).
void tile_dot(const float* a, const float* bt, std::int64_t rows, std::int64_t cols, std::int64_t d, float* s) {
  for (std::int64_t i = 0; i < rows; ++i) {
    float* srow = s + i * kTile;
    std::fill(srow, srow + kTile, 0.0f);
    for (std::int64_t c = 0; c < d; ++c) {
      const float av = a[i * d + c];
      const float* brow = bt + c * kTile;
      for (std::int64_t j = 0; j < cols; ++j) srow[j] += av * brow[j];
    }
  }
}

// One query tile of one head: `rows` query rows at positions p0.. (row i at q_index(i)) against
// keys 0..p0+rows-1 of `kv_len` (key j at kv_index(j)), the online softmax key tile by key tile from
// position 0; store(i, acc row, 1 / l, m, l) takes each row's result. A row's arithmetic depends on
// its own values only, never on which other rows share its tile: attention_forward and
// attention_cached call this one function, so a cached row has a full forward's bits.
template <typename T, typename QIndex, typename KvIndex, typename Store>
void forward_query_tile(const void* q, const void* k, const void* v, QIndex q_index, KvIndex kv_index,
                        std::int64_t rows, std::int64_t p0, std::int64_t kv_len, std::int64_t d, float scale,
                        Tiles& tl, std::vector<float>& m, std::vector<float>& l, Store store) {
  load_tile<T>(q, rows, d, q_index, scale, tl.q.data(), false);
  std::fill(m.begin(), m.end(), -INFINITY);
  std::fill(l.begin(), l.end(), 0.0f);
  std::fill(tl.acc.begin(), tl.acc.end(), 0.0f);
  for (std::int64_t j0 = 0; j0 <= p0 + rows - 1; j0 += kTile) {
    const std::int64_t cols = std::min(kTile, kv_len - j0);
    load_tile<T>(k, cols, d, [&](std::int64_t j) { return kv_index(j0 + j); }, 1.0f, tl.kt.data(), true);
    load_tile<T>(v, cols, d, [&](std::int64_t j) { return kv_index(j0 + j); }, 1.0f, tl.v.data(), false);
    tile_dot(tl.q.data(), tl.kt.data(), rows, cols, d, tl.s.data());
    for (std::int64_t i = 0; i < rows; ++i) {
      const std::int64_t last = std::min(cols, p0 + i - j0 + 1);  // causal: key j0+j <= query p0+i
      if (last <= 0) continue;
      float* srow = tl.s.data() + i * kTile;
      float tile_max = -INFINITY;
      for (std::int64_t j = 0; j < last; ++j) tile_max = std::max(tile_max, srow[j]);
      const float m_new = std::max(m[static_cast<std::size_t>(i)], tile_max);
      const float corr = math::online_softmax_rescale(m[static_cast<std::size_t>(i)], m_new);
      float* arow = tl.acc.data() + i * d;
      float sum = 0.0f;
      for (std::int64_t c = 0; c < d; ++c) arow[c] *= corr;
      for (std::int64_t j = 0; j < last; ++j) {
        const float p = math::shifted_exp(srow[j], m_new);
        sum += p;
        const float* vrow = tl.v.data() + j * d;
        for (std::int64_t c = 0; c < d; ++c) arow[c] += p * vrow[c];
      }
      l[static_cast<std::size_t>(i)] = l[static_cast<std::size_t>(i)] * corr + sum;
      m[static_cast<std::size_t>(i)] = m_new;
    }
  }
  for (std::int64_t i = 0; i < rows; ++i) {
    store(i, tl.acc.data() + i * d, 1.0f / l[static_cast<std::size_t>(i)], m[static_cast<std::size_t>(i)],
          l[static_cast<std::size_t>(i)]);
  }
}

}  // namespace

void attention_forward(DType dtype, const AttentionShape& shape, const void* q, const void* k, const void* v,
                       void* out, float* lse) {
  STRATA_CHECK(shape.kv_heads > 0 && shape.q_heads % shape.kv_heads == 0, "q_heads {} not a multiple of kv_heads {}",
               shape.q_heads, shape.kv_heads);
  const Layout L{shape};
  const std::int64_t d = shape.head_dim;
  const std::int64_t group = shape.q_heads / shape.kv_heads;
  const std::int64_t q_tiles = (shape.seq + kTile - 1) / kTile;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(shape.batch * shape.q_heads * q_tiles, 1, [&](std::int64_t w0, std::int64_t w1) {
      Tiles tl(d);
      std::vector<float> m(kTile), l(kTile);
      for (std::int64_t w = w0; w < w1; ++w) {
        const std::int64_t qt = w % q_tiles, h = (w / q_tiles) % shape.q_heads, b = w / (q_tiles * shape.q_heads);
        const std::int64_t g = h / group;
        const std::int64_t i0 = qt * kTile, rows = std::min(kTile, shape.seq - i0);
        forward_query_tile<T>(
            q, k, v, [&](std::int64_t i) { return L.q_index(b, i0 + i, h); },
            [&](std::int64_t j) { return L.kv_index(b, j, g); }, rows, i0, shape.seq, d, scale, tl, m, l,
            [&](std::int64_t i, const float* acc, float inv, float mi, float li) {
              const std::int64_t o = L.o_index(b, i0 + i, h);
              for (std::int64_t c = 0; c < d; ++c) store<T>(out, o + c, acc[c] * inv);
              lse[L.lse_index(b, h, i0 + i)] = math::online_softmax_lse(mi, li);
            });
      }
    });
  });
}

void attention_cached(DType dtype, const CachedAttentionShape& shape, const void* q, const void* k_cache,
                      const void* v_cache, void* out) {
  STRATA_CHECK(shape.kv_heads > 0 && shape.q_heads % shape.kv_heads == 0, "q_heads {} not a multiple of kv_heads {}",
               shape.q_heads, shape.kv_heads);
  STRATA_CHECK(shape.q_rows >= 1 && shape.q_rows <= shape.kv_len, "{} query rows over a cache of {} positions",
               shape.q_rows, shape.kv_len);
  const std::int64_t d = shape.head_dim;
  const std::int64_t group = shape.q_heads / shape.kv_heads;
  const std::int64_t past = shape.kv_len - shape.q_rows;
  const std::int64_t q_tiles = (shape.q_rows + kTile - 1) / kTile;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(shape.q_heads * q_tiles, 1, [&](std::int64_t w0, std::int64_t w1) {
      Tiles tl(d);
      std::vector<float> m(kTile), l(kTile);
      for (std::int64_t w = w0; w < w1; ++w) {
        const std::int64_t qt = w % q_tiles, h = w / q_tiles, g = h / group;
        const std::int64_t i0 = qt * kTile, rows = std::min(kTile, shape.q_rows - i0);
        forward_query_tile<T>(
            q, k_cache, v_cache, [&](std::int64_t i) { return (i0 + i) * shape.q_row_stride + h * d; },
            [&](std::int64_t j) { return j * shape.kv_row_stride + g * d; }, rows, past + i0, shape.kv_len, d, scale,
            tl, m, l, [&](std::int64_t i, const float* acc, float inv, float, float) {
              const std::int64_t o = (i0 + i) * shape.out_row_stride + h * d;
              for (std::int64_t c = 0; c < d; ++c) store<T>(out, o + c, acc[c] * inv);
            });
      }
    });
  });
}

// Kept as one piece (~120 lines): both backward passes share the dtype dispatch, delta and the tile lambdas.
void attention_backward(DType dtype, const AttentionShape& shape, const void* q, const void* k, const void* v,
                        const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv) {
  const Layout L{shape};
  const std::int64_t d = shape.head_dim;
  const std::int64_t group = shape.q_heads / shape.kv_heads;
  const std::int64_t tiles = (shape.seq + kTile - 1) / kTile;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    // delta[b,h,t] = sum_c dout * out: the softmax-backward row term (O(seq) memory).
    std::vector<float> delta(static_cast<std::size_t>(shape.batch * shape.q_heads * shape.seq));
    parallel_rows(shape.batch * shape.q_heads, 1, [&](std::int64_t w0, std::int64_t w1) {
      for (std::int64_t w = w0; w < w1; ++w) {
        const std::int64_t h = w % shape.q_heads, b = w / shape.q_heads;
        for (std::int64_t t = 0; t < shape.seq; ++t) {
          float acc = 0.0f;
          for (std::int64_t c = 0; c < d; ++c) {
            acc += load<T>(dout, L.o_index(b, t, h) + c) * load<T>(out, L.o_index(b, t, h) + c);
          }
          delta[static_cast<std::size_t>(L.delta_index(b, h, t))] = acc;
        }
      }
    });
    // Probabilities p[i][j] and dS[i][j] = p * (dO_i . V_j - delta_i) of one (query tile, key tile).
    auto probs_and_dscores = [&](Tiles& tl, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows,
                                 std::int64_t j0, std::int64_t cols) {
      tile_dot(tl.q.data(), tl.kt.data(), rows, cols, d, tl.s.data());
      tile_dot(tl.dout.data(), tl.vt.data(), rows, cols, d, tl.dp.data());
      for (std::int64_t i = 0; i < rows; ++i) {
        const float row_lse = lse[L.lse_index(b, h, i0 + i)];
        const float row_delta = delta[static_cast<std::size_t>(L.delta_index(b, h, i0 + i))];
        for (std::int64_t j = 0; j < cols; ++j) {
          const bool visible = j0 + j <= i0 + i;
          const float p = visible ? math::attention_prob(tl.s[static_cast<std::size_t>(i * kTile + j)], row_lse) : 0.0f;
          tl.s[static_cast<std::size_t>(i * kTile + j)] = p;
          tl.dp[static_cast<std::size_t>(i * kTile + j)] =
              math::attention_dscore(p, tl.dp[static_cast<std::size_t>(i * kTile + j)], row_delta);
        }
      }
    };
    auto load_query_side = [&](Tiles& tl, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows) {
      load_tile<T>(q, rows, d, [&](std::int64_t i) { return L.q_index(b, i0 + i, h); }, scale, tl.q.data(), false);
      load_tile<T>(dout, rows, d, [&](std::int64_t i) { return L.o_index(b, i0 + i, h); }, 1.0f, tl.dout.data(), false);
    };
    auto load_key_side = [&](Tiles& tl, std::int64_t b, std::int64_t g, std::int64_t j0, std::int64_t cols) {
      auto idx = [&](std::int64_t j) { return L.kv_index(b, j0 + j, g); };
      load_tile<T>(k, cols, d, idx, 1.0f, tl.kt.data(), true);
      load_tile<T>(k, cols, d, idx, 1.0f, tl.k.data(), false);
      load_tile<T>(v, cols, d, idx, 1.0f, tl.vt.data(), true);
    };

    // Pass 1: dK, dV per (b, kv head, key tile).
    parallel_rows(shape.batch * shape.kv_heads * tiles, 1, [&](std::int64_t w0, std::int64_t w1) {
      Tiles tl(d);
      std::vector<float> dk_acc(static_cast<std::size_t>(kTile * d)), dv_acc(dk_acc.size());
      for (std::int64_t w = w0; w < w1; ++w) {
        const std::int64_t kt = w % tiles, g = (w / tiles) % shape.kv_heads, b = w / (tiles * shape.kv_heads);
        const std::int64_t j0 = kt * kTile, cols = std::min(kTile, shape.seq - j0);
        load_key_side(tl, b, g, j0, cols);
        std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
        std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
        for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
          for (std::int64_t qt = kt; qt < tiles; ++qt) {  // causal: query tiles before kt see none of it
            const std::int64_t i0 = qt * kTile, rows = std::min(kTile, shape.seq - i0);
            load_query_side(tl, b, h, i0, rows);
            probs_and_dscores(tl, b, h, i0, rows, j0, cols);
            for (std::int64_t i = 0; i < rows; ++i) {
              const float* qrow = tl.q.data() + i * d;  // already scaled: dK = dS^T (scale q)
              const float* dorow = tl.dout.data() + i * d;
              for (std::int64_t j = 0; j < cols; ++j) {
                const float p = tl.s[static_cast<std::size_t>(i * kTile + j)];
                const float ds = tl.dp[static_cast<std::size_t>(i * kTile + j)];
                float* dvrow = dv_acc.data() + j * d;
                float* dkrow = dk_acc.data() + j * d;
                for (std::int64_t c = 0; c < d; ++c) dvrow[c] += p * dorow[c];
                for (std::int64_t c = 0; c < d; ++c) dkrow[c] += ds * qrow[c];
              }
            }
          }
        }
        for (std::int64_t j = 0; j < cols; ++j) {
          const std::int64_t base = L.dkv_index(b, j0 + j, g);
          for (std::int64_t c = 0; c < d; ++c) {
            store<T>(dk, base + c, dk_acc[static_cast<std::size_t>(j * d + c)]);
            store<T>(dv, base + c, dv_acc[static_cast<std::size_t>(j * d + c)]);
          }
        }
      }
    });

    // Pass 2: dQ per (b, q head, query tile).
    parallel_rows(shape.batch * shape.q_heads * tiles, 1, [&](std::int64_t w0, std::int64_t w1) {
      Tiles tl(d);
      for (std::int64_t w = w0; w < w1; ++w) {
        const std::int64_t qt = w % tiles, h = (w / tiles) % shape.q_heads, b = w / (tiles * shape.q_heads);
        const std::int64_t g = h / group;
        const std::int64_t i0 = qt * kTile, rows = std::min(kTile, shape.seq - i0);
        load_query_side(tl, b, h, i0, rows);
        std::fill(tl.acc.begin(), tl.acc.end(), 0.0f);
        for (std::int64_t kt = 0; kt <= qt; ++kt) {
          const std::int64_t j0 = kt * kTile, cols = std::min(kTile, shape.seq - j0);
          load_key_side(tl, b, g, j0, cols);
          probs_and_dscores(tl, b, h, i0, rows, j0, cols);
          for (std::int64_t i = 0; i < rows; ++i) {
            float* arow = tl.acc.data() + i * d;
            for (std::int64_t j = 0; j < cols; ++j) {
              const float ds = tl.dp[static_cast<std::size_t>(i * kTile + j)];
              const float* krow = tl.k.data() + j * d;
              for (std::int64_t c = 0; c < d; ++c) arow[c] += ds * krow[c];
            }
          }
        }
        for (std::int64_t i = 0; i < rows; ++i) {
          const std::int64_t base = L.q_index(b, i0 + i, h);
          for (std::int64_t c = 0; c < d; ++c) store<T>(dq, base + c, tl.acc[static_cast<std::size_t>(i * d + c)] * scale);
        }
      }
    });
  });
}

}  // namespace strata::models::cpu
