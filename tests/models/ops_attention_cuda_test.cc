// Causal attention (models/kernels/ops.h) on a cuda device against its CPU kernel, forward and
// backward, fp32/bf16/fp16, grouped-query heads, odd sequence lengths and head dims, the
// tensor-core path (cuda_attention_tc.cu) included; and the decoder's per-KV-group calls giving
// the whole call's bits. Fixture and Note [CUDA op tolerances] in tests/models/ops_cuda_test_util.h. Labelled
// `gpu`: without a usable cuda device every test skips and says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "models/kernels/ops.h"
#include "tests/models/ops_cuda_test_util.h"

namespace strata::models {
namespace {

using namespace strata::models::testing;

class CudaAttentionByDtype : public CudaOpsByDtype {};

// ---------- attention ----------

struct AttnCase {
  const char* name;
  std::int64_t batch, seq, q_heads, kv_heads, head_dim, out_pad;  // out_pad: extra elements per out row
};
// Sequences of 1, under one tile, a tile and a bit, exactly two tiles, several tiles and a part;
// head_dim under a warp (24), odd multiples of 8 (40), 64 and 128 (over 48 KiB of shared memory).
const AttnCase kAttnCases[] = {
    {"gqa", 2, 37, 4, 2, 64, 0},  {"mha", 1, 130, 2, 2, 64, 3}, {"mqa", 2, 1, 3, 1, 40, 0},
    {"mqa", 1, 70, 4, 1, 24, 5},  {"mha", 2, 64, 2, 2, 32, 0},  {"gqa", 1, 33, 2, 1, 128, 0},
    // Tensor-core path (16-bit): several 64-key tiles and a part, at both head dims, batch > 1; past
    // three 128-query tiles (the forward and dQ blocks) and 128-key tiles (dK/dV), so that whole
    // causally skipped tiles and a ragged last tile both occur.
    {"gqa", 1, 200, 4, 2, 64, 0}, {"mha", 1, 129, 2, 2, 128, 0}, {"gqa", 2, 200, 4, 2, 128, 0},
    {"gqa", 3, 130, 8, 2, 64, 0}, {"mha", 1, 389, 2, 2, 64, 0},  {"gqa", 2, 300, 4, 2, 128, 0},
};

// Packed qkv rows [q heads | k heads | v heads] (as the decoders lay them out); out, dout at their
// own row stride; lse [batch, q_heads, seq].
struct AttnLayout {
  AttnCase c;
  std::int64_t qkv_stride() const { return (c.q_heads + 2 * c.kv_heads) * c.head_dim; }
  std::int64_t k_offset() const { return c.q_heads * c.head_dim; }
  std::int64_t v_offset() const { return (c.q_heads + c.kv_heads) * c.head_dim; }
  std::int64_t out_stride() const { return c.q_heads * c.head_dim + c.out_pad; }
  std::int64_t rows() const { return c.batch * c.seq; }
  std::int64_t q(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return (b * c.seq + t) * qkv_stride() + h * c.head_dim;
  }
  std::int64_t k(std::int64_t b, std::int64_t t, std::int64_t g) const {
    return q(b, t, 0) + k_offset() + g * c.head_dim;
  }
  std::int64_t v(std::int64_t b, std::int64_t t, std::int64_t g) const {
    return q(b, t, 0) + v_offset() + g * c.head_dim;
  }
  std::int64_t o(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return (b * c.seq + t) * out_stride() + h * c.head_dim;
  }
  std::int64_t lse(std::int64_t b, std::int64_t h, std::int64_t t) const { return (b * c.q_heads + h) * c.seq + t; }
  AttentionShape shape() const {
    return {c.batch, c.seq, c.q_heads, c.kv_heads, c.head_dim, qkv_stride(), qkv_stride(), out_stride()};
  }
};

struct AttnBounds {
  Vec out, lse, dqkv;
};

// Per-element bounds on |cuda - cpu| for attention, from the exact (double) probabilities. One
// run's errors, each doubled at the end for the two runs:
//  * a score q.k scale is a sum of d products in either order: E = (d + 4) u max_j scale sum|q k_j|;
//  * a probability exp(s - lse): relative perr = 2 E (its score and the log-sum-exp) + 2 eps (expf);
//  * the online sums of p and of p v over `seq` keys with per-tile rescales: (seq + 16) u relative;
//  * out_c: (perr + 2 (seq + 16) u + eps) sum_j p_j |v_jc|; lse: E + (seq + 16) u + 2 eps (|max| +
//    |log sum| + 1);
//  * backward, from the same out and lse: dp_j = dout.v_j and delta = dout.out within (d + 4) u of
//    their |terms|; dS_j = p_j (dp_j - delta) within eds_j = perr p_j |dp_j - delta| + p_j (their
//    errors) + eps |dS_j|; dQ = scale sum_j dS_j k_j, dK_j = sum_i dS_ij scale q_i, dV_j = sum_i
//    p_ij dout_i: the terms' errors plus (terms + 4) u sum|terms| for the summation.
//  * on the tensor-core path (bf16/fp16 at head_dim 64 or 128 with aligned rows, as
//    attention::tc_supported in cuda_attention.cuh decides), P and dS are rounded to the element
//    type (unit roundoff u16) before their products, as flash-attention does: out_c gains u16
//    sum_j p_j |v_jc|, dV_j u16 sum_i p_ij |dout_i|, dK_j u16 sum_i |dS_ij| scale |q_i| and dQ u16
//    scale sum_j |dS_j k_j|.
AttnBounds attention_bounds(const AttnLayout& L, const Vec& qkv, const Vec& out, const Vec& dout, double u16) {
  const AttnCase& c = L.c;
  const std::int64_t d = c.head_dim, group = c.q_heads / c.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const double dot_err = (static_cast<double>(d) + 4) * kUnit;
  const double sum_err = (static_cast<double>(c.seq) + 16) * kUnit;
  const double kv_sum_err = (static_cast<double>(group * c.seq) + 4) * kUnit;
  AttnBounds bd{Vec(static_cast<std::size_t>(L.rows() * L.out_stride()), 0.0),
                Vec(static_cast<std::size_t>(c.batch * c.q_heads * c.seq), 0.0),
                Vec(static_cast<std::size_t>(L.rows() * L.qkv_stride()), 0.0)};
  Vec p(static_cast<std::size_t>(c.seq)), ds(p.size()), eds(p.size());
  for (std::int64_t b = 0; b < c.batch; ++b) {
    for (std::int64_t h = 0; h < c.q_heads; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t i = 0; i < c.seq; ++i) {
        const double* qi = &qkv[L.q(b, i, h)];
        double mx = -INFINITY, score_mag = 0, sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0, mag = 0;
          for (std::int64_t e = 0; e < d; ++e) {
            dot += qi[e] * qkv[L.k(b, j, g) + e];
            mag += std::abs(qi[e] * qkv[L.k(b, j, g) + e]);
          }
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
          score_mag = std::max(score_mag, mag * scale);
        }
        for (std::int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (std::int64_t j = 0; j <= i; ++j) p[j] /= sum;
        const double E = dot_err * score_mag, perr = 2 * E + 2 * kEps;
        bd.lse[L.lse(b, h, i)] = 2 * (E + sum_err + 2 * kEps * (std::abs(mx) + std::abs(std::log(sum)) + 1));
        const double* oi = &out[L.o(b, i, h)];
        const double* doi = &dout[L.o(b, i, h)];
        double delta = 0, delta_mag = 0;
        for (std::int64_t e = 0; e < d; ++e) delta += doi[e] * oi[e], delta_mag += std::abs(doi[e] * oi[e]);
        for (std::int64_t j = 0; j <= i; ++j) {
          double dp = 0, dp_mag = 0;
          for (std::int64_t e = 0; e < d; ++e) {
            dp += doi[e] * qkv[L.v(b, j, g) + e];
            dp_mag += std::abs(doi[e] * qkv[L.v(b, j, g) + e]);
          }
          ds[j] = p[j] * (dp - delta);
          eds[j] = perr * p[j] * std::abs(dp - delta) + p[j] * dot_err * (dp_mag + delta_mag) + kEps * std::abs(ds[j]);
        }
        for (std::int64_t e = 0; e < d; ++e) {
          double pv = 0, dq_err = 0, dq_mag = 0;
          for (std::int64_t j = 0; j <= i; ++j) {
            const double kje = qkv[L.k(b, j, g) + e];
            pv += p[j] * std::abs(qkv[L.v(b, j, g) + e]);
            dq_err += eds[j] * std::abs(kje), dq_mag += std::abs(ds[j] * kje);
          }
          bd.out[L.o(b, i, h) + e] = 2 * (perr + 2 * sum_err + kEps + u16) * pv;
          bd.dqkv[L.q(b, i, h) + e] =
              2 * scale * (dq_err + (static_cast<double>(c.seq) + 4) * kUnit * dq_mag + (kEps + u16) * dq_mag);
          const double qs = scale * std::abs(qi[e]), dout_e = std::abs(doi[e]);
          for (std::int64_t j = 0; j <= i; ++j) {
            bd.dqkv[L.k(b, j, g) + e] += 2 * (eds[j] + (kv_sum_err + u16) * std::abs(ds[j])) * qs;
            bd.dqkv[L.v(b, j, g) + e] += 2 * (perr + kv_sum_err + u16) * p[j] * dout_e;
          }
        }
      }
    }
  }
  return bd;
}

// Forward (out, lse), then backward from the CPU forward's out and lse on both sides, into one
// packed dq|dk|dv buffer that starts as garbage (every q/k/v element must be written). out's row
// padding must stay as it was. Tolerance: attention_bounds.
TEST_P(CudaAttentionByDtype, AttentionForwardAndBackwardMatchCpu) {
  for (const AttnCase& c : kAttnCases) {
    const AttnLayout L{c};
    const std::string name =
        std::string(c.name) + " " + shape_name({c.batch, c.seq, c.q_heads, c.kv_heads, c.head_dim});
    const Vec qkv = quantize(random_vec(L.rows() * L.qkv_stride(), 481, -2, 2), dt());
    const Vec dout = quantize(random_vec(L.rows() * L.out_stride(), 482), dt());
    Twin QKV = twin(qkv, dt()), O = twin(random_vec(L.rows() * L.out_stride(), 483), dt());
    Twin LSE = twin(Vec(c.batch * c.q_heads * c.seq, 9.0), DType::F32);
    const AttentionShape shape = L.shape();
    both([&](Side s) {
      attention_forward(ctx(s), dt(), shape, QKV.at(s, 0), QKV.at(s, L.k_offset()), QKV.at(s, L.v_offset()), O.at(s),
                        LSE.as<float>(s));
    });
    // The tensor-core path's condition (attention::tc_supported): the buffers here are 256-byte
    // aligned device allocations and every offset a multiple of head_dim.
    const bool tc = dt() != DType::F32 && (c.head_dim == 64 || c.head_dim == 128) && L.qkv_stride() % 8 == 0 &&
                    L.out_stride() % 8 == 0;
    const double u16 = !tc ? 0.0 : dt() == DType::BF16 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -12);
    const AttnBounds bd = attention_bounds(L, qkv, read_buf(O.cpu()), dout, u16);
    expect_within_bounds(tag("attention_forward out " + name), fetch(O), O.cpu(), bd.out);
    expect_within_bounds(tag("attention_forward lse " + name), fetch(LSE), LSE.cpu(), bd.lse);

    Twin OUT = twin(O.cpu()), LSE_IN = twin(LSE.cpu()), DO = twin(dout, dt());
    Twin DQKV = twin(Vec(L.rows() * L.qkv_stride(), 7.0), dt());
    both([&](Side s) {
      attention_backward(ctx(s), dt(), shape, QKV.at(s, 0), QKV.at(s, L.k_offset()), QKV.at(s, L.v_offset()),
                         OUT.at(s), LSE_IN.as<float>(s), DO.at(s), DQKV.at(s, 0), DQKV.at(s, L.k_offset()),
                         DQKV.at(s, L.v_offset()));
    });
    expect_within_bounds(tag("attention_backward dq|dk|dv " + name), fetch(DQKV), DQKV.cpu(), bd.dqkv);
  }
}

// GPU only: the decoder's per-KV-group calls (Note [Replicated KV heads] in models/tensor_parallel.h, ops_test.cc) over
// some query heads with the whole lse (lse_heads) and dK|dV in a buffer of their own (dkv_row_stride)
// give the whole call's bits, and a repeated backward gives the same bits (no atomics).
TEST_P(CudaAttentionByDtype, AttentionOverSomeHeadsIsTheWholeCallBitForBitAndRepeatsExactly) {
  const AttnLayout L{AttnCase{"gqa", 2, 45, 4, 2, 64, 0}};
  const std::int64_t hd = L.c.head_dim, group = L.c.q_heads / L.c.kv_heads, rows = L.rows();
  const std::int64_t lse_size = L.c.batch * L.c.q_heads * L.c.seq;
  Twin QKV = twin(random_vec(rows * L.qkv_stride(), 491, -2, 2), dt());
  Twin DO = twin(random_vec(rows * L.out_stride(), 492), dt());
  Twin O = twin(Vec(rows * L.out_stride(), 0.0), dt()), LSE = twin(Vec(lse_size, 0.0), DType::F32);
  Twin D = twin(Vec(rows * L.qkv_stride(), 7.0), dt()), D2 = twin(Vec(rows * L.qkv_stride(), 7.0), dt());
  const Side s = Side::Cuda;
  const AttentionShape whole = L.shape();
  attention_forward(cuda_, dt(), whole, QKV.at(s, 0), QKV.at(s, L.k_offset()), QKV.at(s, L.v_offset()), O.at(s),
                    LSE.as<float>(s));
  auto backward = [&](Twin& into) {
    attention_backward(cuda_, dt(), whole, QKV.at(s, 0), QKV.at(s, L.k_offset()), QKV.at(s, L.v_offset()), O.at(s),
                       LSE.as<float>(s), DO.at(s), into.at(s, 0), into.at(s, L.k_offset()), into.at(s, L.v_offset()));
  };
  backward(D);
  backward(D2);
  const Buf d = fetch(D), o = fetch(O), lse = fetch(LSE);
  expect_same_bits(tag("attention_backward repeated"), fetch(D2), d);

  Twin OP = twin(Vec(rows * L.out_stride(), 0.0), dt()), LSEP = twin(Vec(lse_size, 0.0), DType::F32);
  Twin DQ = twin(Vec(rows * L.qkv_stride(), 7.0), dt());
  for (std::int64_t g = 0; g < L.c.kv_heads; ++g) {
    AttentionShape part = whole;
    part.q_heads = group;
    part.kv_heads = 1;
    part.lse_heads = L.c.q_heads;
    part.dkv_row_stride = 2 * hd;
    const std::int64_t h0 = g * group;
    Twin DKV = twin(Vec(rows * 2 * hd, 7.0), dt());
    attention_forward(cuda_, dt(), part, QKV.at(s, h0 * hd), QKV.at(s, L.k_offset() + g * hd),
                      QKV.at(s, L.v_offset() + g * hd), OP.at(s, h0 * hd), LSEP.as<float>(s) + h0 * L.c.seq);
    attention_backward(cuda_, dt(), part, QKV.at(s, h0 * hd), QKV.at(s, L.k_offset() + g * hd),
                       QKV.at(s, L.v_offset() + g * hd), O.at(s, h0 * hd), LSE.as<float>(s) + h0 * L.c.seq,
                       DO.at(s, h0 * hd), DQ.at(s, h0 * hd), DKV.at(s, 0), DKV.at(s, hd));
    // dK|dV of group g, gathered from the whole call's packed buffer.
    const std::size_t esize = dtype_bytes(dt());
    Buf want{dt(), std::vector<std::uint8_t>(static_cast<std::size_t>(rows * 2 * hd) * esize)};
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t half = 0; half < 2; ++half) {
        const std::int64_t from = r * L.qkv_stride() + (half == 0 ? L.k_offset() : L.v_offset()) + g * hd;
        std::memcpy(want.bytes.data() + static_cast<std::size_t>(r * 2 * hd + half * hd) * esize,
                    d.bytes.data() + static_cast<std::size_t>(from) * esize, static_cast<std::size_t>(hd) * esize);
      }
    }
    expect_same_bits(tag("attention_backward dk|dv of kv head " + std::to_string(g) + " alone"), fetch(DKV), want);
  }
  expect_same_bits(tag("attention_forward out by kv group"), fetch(OP), o);
  expect_same_bits(tag("attention_forward lse by kv group"), fetch(LSEP), lse);
  // dq: the q columns of the whole call's buffer; the k and v columns of DQ stay 7.
  Buf want_dq = fetch(DQ);
  const std::size_t esize = dtype_bytes(dt());
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(want_dq.bytes.data() + static_cast<std::size_t>(r * L.qkv_stride()) * esize,
                d.bytes.data() + static_cast<std::size_t>(r * L.qkv_stride()) * esize,
                static_cast<std::size_t>(L.k_offset()) * esize);
  }
  expect_same_bits(tag("attention_backward dq by kv group"), fetch(DQ), want_dq);
}

// The KV cache's attention (ops.h attention_cached, cuda_attention_cached.cu) against its CPU
// kernel: the last q_rows rows of a batch-1 causal case as new rows over a cache of its seq keys
// (q in the packed qkv rows, the cache its k and v columns), decode (1 row), a few rows, and the
// whole sequence, within the forward's bounds for those rows (attention_bounds; the scalar kernel's
// order, no tensor cores). Rows outside the new ones and out's padding stay untouched.
TEST_P(CudaAttentionByDtype, AttentionCachedMatchesCpu) {
  const AttnCase cases[] = {{"gqa", 1, 37, 4, 2, 64, 0}, {"mha", 1, 130, 2, 2, 40, 3}, {"mqa", 1, 70, 4, 1, 24, 5},
                            {"gqa", 1, 33, 2, 1, 128, 0}};
  for (const AttnCase& c : cases) {
    const AttnLayout L{c};
    for (const std::int64_t q_rows : {std::int64_t{1}, std::int64_t{5}, c.seq}) {
      const std::string name = std::string(c.name) + " " + shape_name({c.seq, c.q_heads, c.kv_heads, c.head_dim}) +
                               " rows " + std::to_string(q_rows);
      const std::int64_t past = c.seq - q_rows;
      const Vec qkv = quantize(random_vec(L.rows() * L.qkv_stride(), 501, -2, 2), dt());
      Twin QKV = twin(qkv, dt()), O = twin(random_vec(L.rows() * L.out_stride(), 502), dt());
      const CachedAttentionShape shape{q_rows, c.seq, c.q_heads, c.kv_heads, c.head_dim,
                                       L.qkv_stride(), L.qkv_stride(), L.out_stride()};
      both([&](Side s) {
        attention_cached(ctx(s), dt(), shape, QKV.at(s, past * L.qkv_stride()), QKV.at(s, L.k_offset()),
                         QKV.at(s, L.v_offset()), O.at(s, past * L.out_stride()));
      });
      const AttnBounds bd = attention_bounds(L, qkv, read_buf(O.cpu()), Vec(L.rows() * L.out_stride(), 0.0), 0.0);
      Vec bounds = bd.out;
      std::fill(bounds.begin(), bounds.begin() + past * L.out_stride(), 0.0);  // rows before the new ones: untouched
      expect_within_bounds(tag("attention_cached out " + name), fetch(O), O.cpu(), bounds);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaAttentionByDtype, ::testing::ValuesIn(kAllDtypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace strata::models
