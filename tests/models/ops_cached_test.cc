// The KV cache's ops (models/kernels/ops.h attention_cached and rope_at; Note [KV cache] in
// models/kv_decoder.h) on the CPU: against plain double references, and bit for bit against the
// full forward's rows (attention_forward, rope), which is what lets cached decoding give a full
// forward's logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "models/kernels/ops.h"
#include "tests/models/op_test_util.h"

namespace strata::models {
namespace {

using namespace strata::models::testing;

const KernelContext kInline{};

class CachedOpTest : public ::testing::TestWithParam<DType> {
 protected:
  DType dt() const { return GetParam(); }
  double tol() const { return dtype_tolerance(GetParam()); }
};

// Plain causal attention in double of rows past..past+q_rows-1 over keys 0..kv_len-1 of a cache
// (k, v [kv_len, kv_heads * d]); q [q_rows, q_heads * d]; out [q_rows, q_heads * d].
Vec ref_attention_cached(const Vec& q, const Vec& k, const Vec& v, std::int64_t q_rows, std::int64_t kv_len,
                         std::int64_t q_heads, std::int64_t kv_heads, std::int64_t d) {
  Vec out(static_cast<std::size_t>(q_rows * q_heads * d));
  const std::int64_t past = kv_len - q_rows, kvw = kv_heads * d;
  for (std::int64_t i = 0; i < q_rows; ++i) {
    for (std::int64_t h = 0; h < q_heads; ++h) {
      const std::int64_t g = h / (q_heads / kv_heads), pos = past + i;
      Vec s(static_cast<std::size_t>(pos + 1));
      double mx = -INFINITY, sum = 0;
      for (std::int64_t j = 0; j <= pos; ++j) {
        double dot = 0;
        for (std::int64_t e = 0; e < d; ++e) dot += q[(i * q_heads + h) * d + e] * k[j * kvw + g * d + e];
        s[j] = dot / std::sqrt(static_cast<double>(d));
        mx = std::max(mx, s[j]);
      }
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (std::int64_t e = 0; e < d; ++e) {
        double o = 0;
        for (std::int64_t j = 0; j <= pos; ++j) o += s[j] / sum * v[j * kvw + g * d + e];
        out[(i * q_heads + h) * d + e] = o;
      }
    }
  }
  return out;
}

struct CachedCase {
  std::int64_t q_rows, kv_len, q_heads, kv_heads, d;
};

void check_cached(DType dt, const CachedCase& c, double tol) {
  const std::int64_t qw = c.q_heads * c.d, kvw = c.kv_heads * c.d;
  const Vec q = quantize(random_vec(c.q_rows * qw, 31, -2, 2), dt);
  const Vec k = quantize(random_vec(c.kv_len * kvw, 32, -2, 2), dt);
  const Vec v = quantize(random_vec(c.kv_len * kvw, 33), dt);
  Buf Q = make_buf(q, dt), K = make_buf(k, dt), V = make_buf(v, dt), O = make_buf(Vec(q.size(), 7.0), dt);
  attention_cached(kInline, dt, {c.q_rows, c.kv_len, c.q_heads, c.kv_heads, c.d, qw, kvw, qw}, Q.data(), K.data(),
                   V.data(), O.data());
  expect_close("attention_cached", read_buf(O), ref_attention_cached(q, k, v, c.q_rows, c.kv_len, c.q_heads,
                                                                     c.kv_heads, c.d), tol);
}

// Decode (one row) at a tile boundary and past several tiles, a few rows, a whole sequence, GQA and MQA.
TEST_P(CachedOpTest, AttentionCachedMatchesPlainReference) {
  for (const CachedCase& c : {CachedCase{1, 1, 2, 2, 8}, CachedCase{1, 32, 4, 2, 8}, CachedCase{1, 70, 4, 1, 6},
                              CachedCase{5, 45, 2, 2, 16}, CachedCase{33, 33, 4, 2, 4}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.q_rows << " over " << c.kv_len);
    check_cached(dt(), c, tol());
  }
}

// The forward's rows, bit for bit: a causal sequence of 77 (past two 32-key tiles) run whole by
// attention_forward, and its rows p..p+n-1 by attention_cached over keys 0..p+n-1 of the same
// buffer, for decode steps and chunks that straddle tiles.
TEST_P(CachedOpTest, AttentionCachedRowsAreTheFullForwardsBits) {
  const std::int64_t seq = 77, H = 4, KV = 2, d = 8, stride = (H + 2 * KV) * d, ow = H * d;
  const std::size_t e = dtype_bytes(dt());
  Buf QKV = make_buf(random_vec(seq * stride, 41, -2, 2), dt());
  Buf full = make_buf(Vec(seq * ow), dt());
  std::vector<float> lse(static_cast<std::size_t>(H * seq));
  auto* base = static_cast<std::uint8_t*>(QKV.data());
  const std::uint8_t* k = base + H * d * e;
  const std::uint8_t* v = base + (H + KV) * d * e;
  attention_forward(kInline, dt(), {1, seq, H, KV, d, stride, stride, ow}, base, k, v, full.data(), lse.data());
  struct Piece {
    std::int64_t past, rows;
  };
  for (const Piece pc : {Piece{0, 1}, Piece{31, 1}, Piece{32, 1}, Piece{76, 1}, Piece{0, 77}, Piece{20, 30},
                         Piece{60, 17}}) {
    Buf out = make_buf(Vec(pc.rows * ow, 5.0), dt());
    attention_cached(kInline, dt(), {pc.rows, pc.past + pc.rows, H, KV, d, stride, stride, ow}, base + pc.past * stride * e,
                     k, v, out.data());
    EXPECT_EQ(0, std::memcmp(out.data(), static_cast<std::uint8_t*>(full.data()) + pc.past * ow * e,
                             static_cast<std::size_t>(pc.rows * ow) * e))
        << "rows " << pc.past << ".." << pc.past + pc.rows - 1;
  }
}

// rope_at of rows at positions first.. gives the bits rope gives those rows of a whole sequence
// (llama3 scaling, head_dim 32, positions past the original context), and matches the reference.
TEST_P(CachedOpTest, RopeAtIsRopesRowsAtTheirPositions) {
  RopeSpec spec;
  spec.theta = 500000.0f;
  spec.scaling = RopeScaling::Llama3;
  spec.factor = 8;
  spec.original_max_positions = 64;
  const std::int64_t seq = 150, heads = 3, d = 32, stride = heads * d + 5;
  const std::size_t e = dtype_bytes(dt());
  const Vec x = quantize(random_vec(seq * stride, 51), dt());
  Buf whole = make_buf(x, dt());
  rope(kInline, dt(), whole.data(), 1, seq, heads, d, stride, spec, RopeDirection::Forward);
  for (const std::int64_t first : {std::int64_t{0}, std::int64_t{1}, std::int64_t{97}, std::int64_t{149}}) {
    const std::int64_t rows = std::min<std::int64_t>(seq - first, 40);
    Buf part = make_buf(Vec(x.begin() + first * stride, x.begin() + (first + rows) * stride), dt());
    rope_at(kInline, dt(), part.data(), rows, first, heads, d, stride, spec);
    EXPECT_EQ(0, std::memcmp(part.data(), static_cast<std::uint8_t*>(whole.data()) + first * stride * e,
                             static_cast<std::size_t>(rows * stride) * e))
        << "rows from position " << first;
  }
  // Against transformers' formula in double: x rotated by position * inv_freq (llama3), at position 120.
  const std::int64_t pos = 120;
  Buf one = make_buf(Vec(x.begin() + pos * stride, x.begin() + (pos + 1) * stride), dt());
  rope_at(kInline, dt(), one.data(), 1, pos, heads, d, stride, spec);
  Vec want(x.begin() + pos * stride, x.begin() + (pos + 1) * stride);
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t i = 0; i < d / 2; ++i) {
      const double f = std::pow(500000.0, -2.0 * static_cast<double>(i) / d), wavelen = 2 * M_PI / f;
      double inv = f;
      if (wavelen > 64.0) inv = f / 8;  // low_freq_factor 1: every wavelength over the context is scaled
      if (wavelen >= 64.0 / 4 && wavelen <= 64.0) {
        const double smooth = (64.0 / wavelen - 1) / (4 - 1);
        inv = (1 - smooth) * f / 8 + smooth * f;
      }
      const double a = static_cast<double>(pos) * inv, x1 = want[h * d + i], x2 = want[h * d + i + d / 2];
      want[h * d + i] = x1 * std::cos(a) - x2 * std::sin(a);
      want[h * d + i + d / 2] = x2 * std::cos(a) + x1 * std::sin(a);
    }
  }
  expect_close("rope_at vs reference", read_buf(one), want, std::max(tol(), 1e-3));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CachedOpTest, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace strata::models
