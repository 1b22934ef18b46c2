// The op set against naive double-precision references (forward) and finite differences of those
// references (backward), for fp32, bf16 and fp16; plus determinism across thread counts and the
// "accumulating in two calls equals one call" property the micro-batch test relies on.
#include <gtest/gtest.h>

#include <tbb/task_arena.h>

#include <chrono>
#include <cmath>

#include "core/device/device.h"
#include "models/kernels/ops.h"
#include "models/kernels/op_math.h"
#include "tests/models/op_test_util.h"

namespace strata::models {
namespace {

using namespace strata::models::testing;

const KernelContext kInline{};  // null stream: run on this thread

class OpTest : public ::testing::TestWithParam<DType> {
 protected:
  DType dt() const { return GetParam(); }
  double tol() const { return dtype_tolerance(GetParam()); }
};

// ---------- matmul ----------

Vec ref_matmul(const Vec& A, const Vec& B, const Vec* C0, const Vec* bias, std::int64_t m, std::int64_t n,
               std::int64_t k, Trans ta, Trans tb, double beta) {
  Vec C(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double a = ta == Trans::No ? A[i * k + p] : A[p * m + i];
        const double b = tb == Trans::No ? B[p * n + j] : B[j * k + p];
        s += a * b;
      }
      if (C0) s += beta * (*C0)[i * n + j];
      if (bias) s += (*bias)[j];
      C[i * n + j] = s;
    }
  }
  return C;
}

TEST_P(OpTest, MatmulMatchesReferenceForEveryTransposeWithBiasAndBeta) {
  const std::int64_t m = 7, n = 5, k = 9;
  for (Trans ta : {Trans::No, Trans::Yes}) {
    for (Trans tb : {Trans::No, Trans::Yes}) {
      for (double beta : {0.0, 1.0}) {
        const Vec A = quantize(random_vec(m * k, 1), dt()), B = quantize(random_vec(k * n, 2), dt());
        const Vec C0 = quantize(random_vec(m * n, 3), dt()), bias = quantize(random_vec(n, 4), dt());
        Buf a = make_buf(A, dt()), b = make_buf(B, dt()), c = make_buf(C0, dt()), bb = make_buf(bias, dt());
        MatmulArgs args;
        args.dtype = dt();
        args.trans_a = ta;
        args.trans_b = tb;
        args.m = m, args.n = n, args.k = k;
        args.a = a.data(), args.lda = ta == Trans::No ? k : m;
        args.b = b.data(), args.ldb = tb == Trans::No ? n : k;
        args.c = c.data(), args.ldc = n;
        args.bias = bb.data();
        args.beta = static_cast<float>(beta);
        matmul(kInline, args);
        expect_close("matmul", read_buf(c), ref_matmul(A, B, &C0, &bias, m, n, k, ta, tb, beta), tol());
      }
    }
  }
}

TEST_P(OpTest, BatchedMatmulWithStridesAndAccumulationIntoOneOutput) {
  const std::int64_t m = 4, n = 3, k = 5, batch = 3;
  const Vec A = quantize(random_vec(batch * m * k, 5), dt()), B = quantize(random_vec(k * n, 6), dt());
  Buf a = make_buf(A, dt()), b = make_buf(B, dt());
  // Separate outputs: C_i = A_i B.
  Buf c = make_buf(Vec(batch * m * n, 0.0), dt());
  MatmulArgs args{dt(), Trans::No, Trans::No, m, n, k, a.data(), k, m * k, b.data(), n, 0, c.data(), n, m * n, batch};
  matmul(kInline, args);
  Vec want;
  for (std::int64_t i = 0; i < batch; ++i) {
    Vec Ai(A.begin() + i * m * k, A.begin() + (i + 1) * m * k);
    Vec Ci = ref_matmul(Ai, B, nullptr, nullptr, m, n, k, Trans::No, Trans::No, 0);
    want.insert(want.end(), Ci.begin(), Ci.end());
  }
  expect_close("batched matmul", read_buf(c), want, tol());
  // One output, accumulated (the weight-gradient form): C = sum_i A_i^T-shaped products.
  Buf acc = make_buf(Vec(m * n, 0.0), dt());
  args.c = acc.data();
  args.stride_c = 0;
  args.beta = 1.0f;
  matmul(kInline, args);
  Vec sum(m * n, 0.0);
  for (std::int64_t i = 0; i < batch; ++i) {
    for (std::int64_t j = 0; j < m * n; ++j) sum[j] += want[i * m * n + j];
  }
  expect_close("accumulated batched matmul", read_buf(acc), sum, 2 * tol());
}

TEST(OpTest, LinearLayerBackwardThroughMatmulAndBiasGradMatchesFiniteDifferences) {
  // y = x W^T + b; dx = dy W; dW = dy^T x; db = colsum(dy): the three calls the decoder makes.
  const std::int64_t rows = 6, in = 5, out = 4;
  const Vec x = random_vec(rows * in, 7), w = random_vec(out * in, 8), b = random_vec(out, 9), dy = random_vec(rows * out, 10);
  auto fwd = [&](const Vec& xx, const Vec& ww, const Vec& bb) { return ref_matmul(xx, ww, nullptr, &bb, rows, out, in, Trans::No, Trans::Yes, 0); };
  Buf X = make_buf(x, DType::F32), W = make_buf(w, DType::F32), DY = make_buf(dy, DType::F32);
  Buf DX = make_buf(Vec(rows * in, 0), DType::F32), DW = make_buf(Vec(out * in, 0), DType::F32), DB = make_buf(Vec(out, 0), DType::F32);
  matmul(kInline, {DType::F32, Trans::No, Trans::No, rows, in, out, DY.data(), out, 0, W.data(), in, 0, DX.data(), in, 0, 1});
  MatmulArgs dw{DType::F32, Trans::Yes, Trans::No, out, in, rows, DY.data(), out, 0, X.data(), in, 0, DW.data(), in, 0, 1};
  dw.beta = 1.0f;
  matmul(kInline, dw);
  bias_grad(kInline, DType::F32, DY.data(), rows, out, out, DB.data());
  expect_close("dx", read_buf(DX), finite_difference([&](const Vec& v) { return fwd(v, w, b); }, x, dy), 1e-6);
  expect_close("dW", read_buf(DW), finite_difference([&](const Vec& v) { return fwd(x, v, b); }, w, dy), 1e-6);
  expect_close("db", read_buf(DB), finite_difference([&](const Vec& v) { return fwd(x, w, v); }, b, dy), 1e-6);
}

// ---------- norms ----------

Vec ref_layernorm(const Vec& x, const Vec& w, const Vec& b, std::int64_t rows, std::int64_t cols, double eps) {
  Vec y(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (std::int64_t c = 0; c < cols; ++c) m += x[r * cols + c];
    m /= cols;
    for (std::int64_t c = 0; c < cols; ++c) v += (x[r * cols + c] - m) * (x[r * cols + c] - m);
    const double s = 1 / std::sqrt(v / cols + eps);
    for (std::int64_t c = 0; c < cols; ++c) y[r * cols + c] = (x[r * cols + c] - m) * s * w[c] + b[c];
  }
  return y;
}

Vec ref_rmsnorm(const Vec& x, const Vec& w, std::int64_t rows, std::int64_t cols, double eps) {
  Vec y(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (std::int64_t c = 0; c < cols; ++c) ss += x[r * cols + c] * x[r * cols + c];
    const double s = 1 / std::sqrt(ss / cols + eps);
    for (std::int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] * s * w[c];
  }
  return y;
}

TEST_P(OpTest, LayerNormForwardAndBackward) {
  const std::int64_t rows = 5, cols = 70;  // 70: more than one column block of the weight reduction
  const float eps = 1e-5f;
  const Vec x = quantize(random_vec(rows * cols, 11, -2, 2), dt()), w = quantize(random_vec(cols, 12, 0.5, 1.5), dt());
  const Vec b = quantize(random_vec(cols, 13), dt()), dy = quantize(random_vec(rows * cols, 14), dt());
  Buf X = make_buf(x, dt()), W = make_buf(w, dt()), B = make_buf(b, dt()), Y = make_buf(Vec(rows * cols), dt());
  std::vector<float> mean(rows), rstd(rows);
  layernorm_forward(kInline, dt(), X.data(), W.data(), B.data(), Y.data(), mean.data(), rstd.data(), rows, cols, eps);
  expect_close("layernorm y", read_buf(Y), ref_layernorm(x, w, b, rows, cols, eps), tol());

  const Vec dx0 = quantize(random_vec(rows * cols, 15), dt());
  Buf DY = make_buf(dy, dt()), DX = make_buf(dx0, dt()), DW = make_buf(Vec(cols, 0), dt()), DB = make_buf(Vec(cols, 0), dt());
  layernorm_backward(kInline, dt(), DY.data(), X.data(), W.data(), mean.data(), rstd.data(), DX.data(), DW.data(),
                     DB.data(), rows, cols, Accumulate::Yes);
  Vec want_dx = finite_difference([&](const Vec& v) { return ref_layernorm(v, w, b, rows, cols, eps); }, x, dy);
  for (std::size_t i = 0; i < want_dx.size(); ++i) want_dx[i] += dx0[i];
  expect_close("layernorm dx (accumulated)", read_buf(DX), want_dx, 2 * tol());
  expect_close("layernorm dw", read_buf(DW),
               finite_difference([&](const Vec& v) { return ref_layernorm(x, v, b, rows, cols, eps); }, w, dy), 2 * tol());
  expect_close("layernorm db", read_buf(DB),
               finite_difference([&](const Vec& v) { return ref_layernorm(x, w, v, rows, cols, eps); }, b, dy), 2 * tol());
}

TEST_P(OpTest, RmsNormForwardAndBackward) {
  const std::int64_t rows = 4, cols = 67;
  const float eps = 1e-6f;
  const Vec x = quantize(random_vec(rows * cols, 16, -2, 2), dt()), w = quantize(random_vec(cols, 17, 0.5, 1.5), dt());
  const Vec dy = quantize(random_vec(rows * cols, 18), dt());
  Buf X = make_buf(x, dt()), W = make_buf(w, dt()), Y = make_buf(Vec(rows * cols), dt());
  std::vector<float> rstd(rows);
  rmsnorm_forward(kInline, dt(), X.data(), W.data(), Y.data(), rstd.data(), rows, cols, eps);
  expect_close("rmsnorm y", read_buf(Y), ref_rmsnorm(x, w, rows, cols, eps), tol());
  Buf DY = make_buf(dy, dt()), DX = make_buf(Vec(rows * cols, 0), dt()), DW = make_buf(Vec(cols, 0), dt());
  rmsnorm_backward(kInline, dt(), DY.data(), X.data(), W.data(), rstd.data(), DX.data(), DW.data(), rows, cols,
                   Accumulate::No);
  expect_close("rmsnorm dx", read_buf(DX),
               finite_difference([&](const Vec& v) { return ref_rmsnorm(v, w, rows, cols, eps); }, x, dy), 2 * tol());
  expect_close("rmsnorm dw", read_buf(DW),
               finite_difference([&](const Vec& v) { return ref_rmsnorm(x, v, rows, cols, eps); }, w, dy), 2 * tol());
}

// ---------- activations ----------

Vec ref_gelu(const Vec& x) {
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    y[i] = 0.5 * x[i] * (1 + std::tanh(std::sqrt(2 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  }
  return y;
}

TEST_P(OpTest, GeluForwardAndBackward) {
  const std::int64_t n = 301;
  const Vec x = quantize(random_vec(n, 19, -4, 4), dt()), dy = quantize(random_vec(n, 20), dt());
  Buf X = make_buf(x, dt()), Y = make_buf(Vec(n), dt()), DY = make_buf(dy, dt()), DX = make_buf(Vec(n), dt());
  gelu_forward(kInline, dt(), X.data(), Y.data(), n);
  expect_close("gelu", read_buf(Y), ref_gelu(x), tol());
  gelu_backward(kInline, dt(), X.data(), DY.data(), DX.data(), n);
  expect_close("gelu dx", read_buf(DX), finite_difference(ref_gelu, x, dy), tol());
}

Vec ref_swiglu(const Vec& gu, std::int64_t rows, std::int64_t hidden) {
  Vec y(static_cast<std::size_t>(rows * hidden));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < hidden; ++j) {
      const double g = gu[r * 2 * hidden + j], u = gu[r * 2 * hidden + hidden + j];
      y[r * hidden + j] = g / (1 + std::exp(-g)) * u;
    }
  }
  return y;
}

TEST_P(OpTest, SwigluForwardAndBackward) {
  const std::int64_t rows = 3, hidden = 11;
  const Vec gu = quantize(random_vec(rows * 2 * hidden, 21, -3, 3), dt()), dy = quantize(random_vec(rows * hidden, 22), dt());
  Buf GU = make_buf(gu, dt()), Y = make_buf(Vec(rows * hidden), dt()), DY = make_buf(dy, dt()),
      DGU = make_buf(Vec(rows * 2 * hidden), dt());
  swiglu_forward(kInline, dt(), GU.data(), Y.data(), rows, hidden);
  expect_close("swiglu", read_buf(Y), ref_swiglu(gu, rows, hidden), tol());
  swiglu_backward(kInline, dt(), GU.data(), DY.data(), DGU.data(), rows, hidden);
  expect_close("swiglu dgate_up", read_buf(DGU),
               finite_difference([&](const Vec& v) { return ref_swiglu(v, rows, hidden); }, gu, dy), tol());
}

// ---------- attention ----------

struct AttnCase {
  std::int64_t batch, seq, q_heads, kv_heads, head_dim;
};

// Packed qkv rows [q heads | k heads | v heads], as the decoders lay them out.
Vec ref_attention(const Vec& qkv, const AttnCase& c, Vec* lse_out = nullptr) {
  const std::int64_t stride = (c.q_heads + 2 * c.kv_heads) * c.head_dim;
  const std::int64_t koff = c.q_heads * c.head_dim, voff = koff + c.kv_heads * c.head_dim;
  Vec out(static_cast<std::size_t>(c.batch * c.seq * c.q_heads * c.head_dim));
  if (lse_out) lse_out->assign(static_cast<std::size_t>(c.batch * c.q_heads * c.seq), 0);
  const double scale = 1 / std::sqrt(static_cast<double>(c.head_dim));
  for (std::int64_t b = 0; b < c.batch; ++b) {
    for (std::int64_t h = 0; h < c.q_heads; ++h) {
      const std::int64_t g = h / (c.q_heads / c.kv_heads);
      for (std::int64_t i = 0; i < c.seq; ++i) {
        Vec s(static_cast<std::size_t>(i + 1));
        double mx = -INFINITY;
        for (std::int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (std::int64_t e = 0; e < c.head_dim; ++e) {
            d += qkv[(b * c.seq + i) * stride + h * c.head_dim + e] * qkv[(b * c.seq + j) * stride + koff + g * c.head_dim + e];
          }
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& v : s) sum += std::exp(v - mx);
        if (lse_out) (*lse_out)[(b * c.q_heads + h) * c.seq + i] = mx + std::log(sum);
        for (std::int64_t e = 0; e < c.head_dim; ++e) {
          double o = 0;
          for (std::int64_t j = 0; j <= i; ++j) {
            o += std::exp(s[j] - mx) / sum * qkv[(b * c.seq + j) * stride + voff + g * c.head_dim + e];
          }
          out[((b * c.seq + i) * c.q_heads + h) * c.head_dim + e] = o;
        }
      }
    }
  }
  return out;
}

void check_attention(DType dt, const AttnCase& c, double tol) {
  const std::int64_t stride = (c.q_heads + 2 * c.kv_heads) * c.head_dim;
  const std::int64_t rows = c.batch * c.seq, odim = c.q_heads * c.head_dim;
  const Vec qkv = quantize(random_vec(rows * stride, 23, -2, 2), dt);
  const Vec dout = quantize(random_vec(rows * odim, 24), dt);
  Buf QKV = make_buf(qkv, dt), O = make_buf(Vec(rows * odim), dt), DO = make_buf(dout, dt);
  Buf DQKV = make_buf(Vec(rows * stride, 7.0), dt);  // garbage: backward must overwrite all of it
  std::vector<float> lse(static_cast<std::size_t>(c.batch * c.q_heads * c.seq));
  AttentionShape s{c.batch, c.seq, c.q_heads, c.kv_heads, c.head_dim, stride, stride, odim};
  const std::size_t esize = dtype_bytes(dt);
  auto* base = static_cast<std::uint8_t*>(QKV.data());
  auto* dbase = static_cast<std::uint8_t*>(DQKV.data());
  const std::size_t koff = static_cast<std::size_t>(c.q_heads * c.head_dim) * esize;
  const std::size_t voff = koff + static_cast<std::size_t>(c.kv_heads * c.head_dim) * esize;
  attention_forward(kInline, dt, s, base, base + koff, base + voff, O.data(), lse.data());
  Vec want_lse;
  expect_close("attention out", read_buf(O), ref_attention(qkv, c, &want_lse), tol);
  expect_close("attention lse", Vec(lse.begin(), lse.end()), want_lse, tol);
  attention_backward(kInline, dt, s, base, base + koff, base + voff, O.data(), lse.data(), DO.data(), dbase,
                     dbase + koff, dbase + voff);
  const auto which = sample_indices(qkv.size(), 300, 25);
  const Vec fd = finite_difference([&](const Vec& v) { return ref_attention(v, c); }, qkv, dout, which);
  expect_close("attention dqkv", pick(read_buf(DQKV), which), pick(fd, which), 2 * tol);
}

TEST_P(OpTest, AttentionMultiHeadAcrossSeveralTiles) { check_attention(dt(), {2, 45, 2, 2, 8}, tol()); }
TEST_P(OpTest, AttentionGroupedQueryHeads) { check_attention(dt(), {1, 33, 4, 2, 4}, tol()); }
TEST(OpTest, AttentionMultiQueryShortSequence) { check_attention(DType::F32, {3, 5, 3, 1, 6}, 2e-4); }

// ---------- rotary, embedding, loss, add, cast ----------

// Hugging Face's frequencies in double, written from transformers' modeling_rope_utils (default,
// linear, llama3), independently of models/kernels/rope_spec.h.
double ref_inv_freq(std::int64_t i, std::int64_t d, const RopeSpec& r) {
  const double f = std::pow(static_cast<double>(r.theta), -2.0 * static_cast<double>(i) / static_cast<double>(d));
  if (r.scaling == RopeScaling::Linear) return f / r.factor;
  if (r.scaling != RopeScaling::Llama3) return f;
  const double wavelen = 2 * M_PI / f, old = r.original_max_positions;
  const double scaled = wavelen > old / r.low_freq_factor ? f / r.factor : f;
  const bool medium = !(wavelen < old / r.high_freq_factor) && !(wavelen > old / r.low_freq_factor);
  if (!medium) return scaled;
  const double smooth = (old / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  return (1 - smooth) * scaled / r.factor + smooth * scaled;
}

Vec ref_rope(const Vec& x, std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t d, const RopeSpec& r) {
  Vec y = x;
  for (std::int64_t row = 0; row < batch * seq; ++row) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t i = 0; i < d / 2; ++i) {
        const double a = static_cast<double>(row % seq) * ref_inv_freq(i, d, r);
        const std::int64_t p = row * heads * d + h * d + i;
        y[p] = x[p] * std::cos(a) - x[p + d / 2] * std::sin(a);
        y[p + d / 2] = x[p + d / 2] * std::cos(a) + x[p] * std::sin(a);
      }
    }
  }
  return y;
}

void check_rope(DType dtype, double tolerance, const RopeSpec& spec, std::int64_t d) {
  const std::int64_t batch = 2, seq = 9, heads = 3;
  const Vec x = quantize(random_vec(batch * seq * heads * d, 26), dtype), dy = quantize(random_vec(x.size(), 27), dtype);
  Buf X = make_buf(x, dtype);
  rope(kInline, dtype, X.data(), batch, seq, heads, d, heads * d, spec, RopeDirection::Forward);
  expect_close("rope", read_buf(X), ref_rope(x, batch, seq, heads, d, spec), tolerance);
  Buf DY = make_buf(dy, dtype);
  rope(kInline, dtype, DY.data(), batch, seq, heads, d, heads * d, spec, RopeDirection::Inverse);
  expect_close("rope backward", read_buf(DY),
               finite_difference([&](const Vec& v) { return ref_rope(v, batch, seq, heads, d, spec); }, x, dy),
               tolerance);
}

TEST_P(OpTest, RopeForwardMatchesReferenceAndInverseIsItsBackward) { check_rope(dt(), tol(), RopeSpec{}, 8); }

// rope_scaling: linear divides every frequency; llama3 at head_dim 32 with an original context of
// 64 keeps pairs 0-1 (wavelength under 16), blends pairs 2-4 and divides pairs 5-15 (over 64).
TEST_P(OpTest, RopeScalingLinearAndLlama3MatchHuggingFacesFormulas) {
  RopeSpec linear;
  linear.scaling = RopeScaling::Linear;
  linear.factor = 4.0f;
  check_rope(dt(), tol(), linear, 8);
  RopeSpec llama3;
  llama3.theta = 10000.0f;
  llama3.scaling = RopeScaling::Llama3;
  llama3.factor = 8.0f;
  llama3.low_freq_factor = 1.0f;
  llama3.high_freq_factor = 4.0f;
  llama3.original_max_positions = 64.0f;
  int kept = 0, blended = 0, divided = 0;
  for (int i = 0; i < 16; ++i) {
    const double f = ref_inv_freq(i, 32, RopeSpec{}), g = ref_inv_freq(i, 32, llama3);
    kept += g == f;
    divided += std::abs(g - f / 8) < 1e-12 * f;
    blended += g < f && g > f / 8 * (1 + 1e-9);
    EXPECT_NEAR(math::rope_inv_freq(i, 32, llama3), g, 1e-6 * g) << "pair " << i;
  }
  EXPECT_EQ(kept, 2);
  EXPECT_EQ(blended, 3);
  EXPECT_EQ(divided, 11);
  check_rope(dt(), tol(), llama3, 32);
}

TEST_P(OpTest, EmbeddingForwardAndBackwardWithRepeatedTokens) {
  const std::int64_t batch = 2, seq = 5, ch = 70, vocab = 6;
  const std::vector<std::int32_t> tokens = {1, 3, 1, 0, 5, 3, 3, 2, 1, 4};
  const Vec wte = quantize(random_vec(vocab * ch, 28), dt()), wpe = quantize(random_vec(seq * ch, 29), dt());
  const Vec dy = quantize(random_vec(batch * seq * ch, 30), dt());
  auto fwd = [&](const Vec& te, const Vec& pe) {
    Vec y(static_cast<std::size_t>(batch * seq * ch));
    for (std::int64_t r = 0; r < batch * seq; ++r) {
      for (std::int64_t c = 0; c < ch; ++c) y[r * ch + c] = te[tokens[r] * ch + c] + pe[(r % seq) * ch + c];
    }
    return y;
  };
  Buf TE = make_buf(wte, dt()), PE = make_buf(wpe, dt()), Y = make_buf(Vec(batch * seq * ch), dt());
  embedding_forward(kInline, dt(), tokens.data(), TE.data(), PE.data(), Y.data(), batch, seq, ch);
  expect_close("embedding", read_buf(Y), fwd(wte, wpe), tol());
  Buf DY = make_buf(dy, dt()), DTE = make_buf(Vec(vocab * ch, 0), dt()), DPE = make_buf(Vec(seq * ch, 0), dt());
  embedding_backward(kInline, dt(), tokens.data(), DY.data(), DTE.data(), DPE.data(), batch, seq, ch);
  expect_close("embedding dwte", read_buf(DTE), finite_difference([&](const Vec& v) { return fwd(v, wpe); }, wte, dy), 2 * tol());
  expect_close("embedding dwpe", read_buf(DPE), finite_difference([&](const Vec& v) { return fwd(wte, v); }, wpe, dy), 2 * tol());
}

TEST_P(OpTest, CrossEntropyLossAndGradientWithIgnoredTarget) {
  const std::int64_t rows = 4, vocab = 37, ld = 40;
  const std::vector<std::int32_t> targets = {3, 36, -1, 0};
  const Vec logits = quantize(random_vec(rows * ld, 31, -4, 4), dt());
  const double scale = 0.25;
  auto losses = [&](const Vec& l) {
    Vec out(rows, 0);
    for (std::int64_t r = 0; r < rows; ++r) {
      if (targets[r] < 0) continue;
      double mx = -INFINITY, s = 0;
      for (std::int64_t j = 0; j < vocab; ++j) mx = std::max(mx, l[r * ld + j]);
      for (std::int64_t j = 0; j < vocab; ++j) s += std::exp(l[r * ld + j] - mx);
      out[r] = std::log(s) + mx - l[r * ld + targets[r]];
    }
    return out;
  };
  Buf L = make_buf(logits, dt());
  std::vector<float> got(rows);
  cross_entropy(kInline, dt(), L.data(), targets.data(), got.data(), L.data(), rows, vocab, ld, static_cast<float>(scale));
  expect_close("cross-entropy loss", Vec(got.begin(), got.end()), losses(logits), tol());
  Vec fd = finite_difference(losses, logits, Vec(rows, scale));
  const Vec d = read_buf(L);
  Vec got_d, want_d;  // the padding columns [vocab, ld) are not the op's
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < vocab; ++j) {
      got_d.push_back(d[r * ld + j]);
      want_d.push_back(fd[r * ld + j]);
    }
  }
  expect_close("cross-entropy dlogits (in place)", got_d, want_d, tol());
}

TEST_P(OpTest, ResidualAddAndCasts) {
  const std::int64_t n = 100;
  const Vec a = quantize(random_vec(n, 32), dt()), b = quantize(random_vec(n, 33), dt());
  Buf A = make_buf(a, dt()), B = make_buf(b, dt()), Y = make_buf(Vec(n), dt());
  residual_add(kInline, dt(), A.data(), B.data(), Y.data(), n);
  Vec want(n);
  for (std::int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
  expect_close("residual add", read_buf(Y), want, tol());
  const Vec src = random_vec(n, 34, -1000, 1000);
  Buf S = make_buf(src, DType::F32);
  for (DType to : kAllDtypes) {
    Buf D = make_buf(Vec(n), to);
    cast(kInline, DType::F32, S.data(), to, D.data(), n);
    EXPECT_EQ(D.bytes, make_buf(src, to).bytes) << "cast fp32 -> " << dtype_name(to) << " must round like core/dtype.h";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OpTest, ::testing::ValuesIn(kAllDtypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---------- determinism ----------

TEST(OpDeterminism, BackwardKernelsGiveTheSameBitsForAnyThreadCount) {
  const AttnCase c{2, 70, 4, 2, 16};
  const std::int64_t stride = (c.q_heads + 2 * c.kv_heads) * c.head_dim, rows = c.batch * c.seq;
  const std::int64_t odim = c.q_heads * c.head_dim;
  const Vec qkv = random_vec(rows * stride, 40), dout = random_vec(rows * odim, 41);
  auto run = [&](int threads) {
    tbb::task_arena arena(threads);
    Buf QKV = make_buf(qkv, DType::F32), O = make_buf(Vec(rows * odim), DType::F32), DO = make_buf(dout, DType::F32);
    Buf D = make_buf(Vec(rows * stride), DType::F32), W = make_buf(Vec(stride, 1.0), DType::F32);
    Buf B = make_buf(Vec(stride, 0.0), DType::F32), DW = make_buf(Vec(stride), DType::F32), DB = make_buf(Vec(stride), DType::F32);
    Buf LN = make_buf(Vec(rows * stride), DType::F32), DLN = make_buf(Vec(rows * stride), DType::F32);
    std::vector<float> lse(static_cast<std::size_t>(c.batch * c.q_heads * c.seq)), mean(rows), rstd(rows);
    arena.execute([&] {
      auto* q = static_cast<float*>(QKV.data());
      auto* d = static_cast<float*>(D.data());
      AttentionShape s{c.batch, c.seq, c.q_heads, c.kv_heads, c.head_dim, stride, stride, odim};
      attention_forward(kInline, DType::F32, s, q, q + odim, q + odim + c.kv_heads * c.head_dim, O.data(), lse.data());
      attention_backward(kInline, DType::F32, s, q, q + odim, q + odim + c.kv_heads * c.head_dim, O.data(), lse.data(),
                         DO.data(), d, d + odim, d + odim + c.kv_heads * c.head_dim);
      layernorm_forward(kInline, DType::F32, QKV.data(), W.data(), B.data(), LN.data(), mean.data(), rstd.data(), rows,
                        stride, 1e-5f);
      layernorm_backward(kInline, DType::F32, QKV.data(), QKV.data(), W.data(), mean.data(), rstd.data(), DLN.data(),
                         DW.data(), DB.data(), rows, stride, Accumulate::No);
    });
    std::vector<std::uint8_t> all = O.bytes;
    for (const Buf* b : {&D, &LN, &DLN, &DW, &DB}) all.insert(all.end(), b->bytes.begin(), b->bytes.end());
    return all;
  };
  const auto one = run(1);
  EXPECT_EQ(one, run(2));
  EXPECT_EQ(one, run(3));
}

TEST(OpDeterminism, AttentionBackwardOverSomeHeadsIsTheWholeCallBitForBit) {
  // See Note [Replicated KV heads] in models/tensor_parallel.h.
  // The decoder runs the backward once per slice of query heads (one KV
  // head's), with the whole lse (lse_heads) and dK|dV in a buffer of their own (dkv_row_stride).
  const AttnCase c{2, 40, 4, 2, 8};
  const std::int64_t hd = c.head_dim, stride = (c.q_heads + 2 * c.kv_heads) * hd, rows = c.batch * c.seq;
  const std::int64_t odim = c.q_heads * hd, koff = odim, voff = odim + c.kv_heads * hd, group = c.q_heads / c.kv_heads;
  const Vec qkv = random_vec(rows * stride, 42), dout = random_vec(rows * odim, 43);
  Buf QKV = make_buf(qkv, DType::F32), O = make_buf(Vec(rows * odim), DType::F32), DO = make_buf(dout, DType::F32);
  Buf D = make_buf(Vec(rows * stride), DType::F32), DQ = make_buf(Vec(rows * stride, 7.0), DType::F32);
  std::vector<float> lse(static_cast<std::size_t>(c.batch * c.q_heads * c.seq));
  auto* q = static_cast<float*>(QKV.data());
  auto* d = static_cast<float*>(D.data());
  const AttentionShape s{c.batch, c.seq, c.q_heads, c.kv_heads, hd, stride, stride, odim};
  attention_forward(kInline, DType::F32, s, q, q + koff, q + voff, O.data(), lse.data());
  attention_backward(kInline, DType::F32, s, q, q + koff, q + voff, O.data(), lse.data(), DO.data(), d, d + koff,
                     d + voff);
  const auto* o = static_cast<const float*>(O.data());
  const auto* dout_p = static_cast<const float*>(DO.data());
  auto* dq = static_cast<float*>(DQ.data());
  for (std::int64_t g = 0; g < c.kv_heads; ++g) {
    std::vector<float> dkv(static_cast<std::size_t>(rows * 2 * hd), 7.0f);
    AttentionShape part = s;
    part.q_heads = group;
    part.kv_heads = 1;
    part.lse_heads = c.q_heads;
    part.dkv_row_stride = 2 * hd;
    const std::int64_t h0 = g * group;
    attention_backward(kInline, DType::F32, part, q + h0 * hd, q + koff + g * hd, q + voff + g * hd, o + h0 * hd,
                       lse.data() + h0 * c.seq, dout_p + h0 * hd, dq + h0 * hd, dkv.data(), dkv.data() + hd);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t e = 0; e < hd; ++e) {
        ASSERT_EQ(dkv[static_cast<std::size_t>(r * 2 * hd + e)], d[r * stride + koff + g * hd + e]) << "dK " << g;
        ASSERT_EQ(dkv[static_cast<std::size_t>(r * 2 * hd + hd + e)], d[r * stride + voff + g * hd + e]) << "dV " << g;
      }
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t e = 0; e < odim; ++e) ASSERT_EQ(dq[r * stride + e], d[r * stride + e]) << "dQ row " << r;
  }
}

TEST(OpModeledCompute, MatmulAndAttentionTakeTheirFlopsAtTheRateAndKeepTheirBits) {
  // See Note [Modeled compute] in models/kernels/ops.h.
  // On a sim stream, each op lasts at least its FLOPs at the modeled rate;
  // the results are the inline run's, bit for bit.
  const std::int64_t m = 48, n = 40, k = 32;
  const Vec a = random_vec(m * k, 51), b = random_vec(k * n, 52);
  const AttnCase c{1, 40, 2, 1, 8};
  const std::int64_t stride = (c.q_heads + 2 * c.kv_heads) * c.head_dim, rows = c.batch * c.seq;
  const std::int64_t odim = c.q_heads * c.head_dim;
  const Vec qkv = random_vec(rows * stride, 53);
  const double rate = 1e7;  // FLOP/s
  const double matmul_flops = 2.0 * m * n * k;
  const double attention_flops = 2.0 * c.batch * c.q_heads * c.seq * c.seq * c.head_dim;
  auto run = [&](const KernelContext& ctx, Stream* stream) {
    Buf A = make_buf(a, DType::F32), B = make_buf(b, DType::F32), C = make_buf(Vec(m * n), DType::F32);
    Buf QKV = make_buf(qkv, DType::F32), O = make_buf(Vec(rows * odim), DType::F32);
    std::vector<float> lse(static_cast<std::size_t>(c.q_heads * c.seq));
    const auto t0 = std::chrono::steady_clock::now();
    matmul(ctx, MatmulArgs{DType::F32, Trans::No, Trans::No, m, n, k, A.data(), k, 0, B.data(), n, 0, C.data(), n, 0, 1});
    auto* q = static_cast<float*>(QKV.data());
    attention_forward(ctx, DType::F32, {c.batch, c.seq, c.q_heads, c.kv_heads, c.head_dim, stride, stride, odim}, q,
                      q + odim, q + odim + c.head_dim, O.data(), lse.data());
    if (stream != nullptr) stream->synchronize();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<std::uint8_t> bits = C.bytes;
    bits.insert(bits.end(), O.bytes.begin(), O.bytes.end());
    return std::pair{bits, seconds};
  };
  const auto [want, inline_seconds] = run(kInline, nullptr);
  SimDeviceOptions opts;
  opts.capacity_bytes = 1 << 20;
  auto dev = make_sim_device(opts);
  auto stream = dev->create_stream("compute");
  KernelContext paced{DeviceKind::Sim, stream.get(), nullptr};
  paced.modeled_flops_per_s = rate;
  const auto [got, paced_seconds] = run(paced, stream.get());
  EXPECT_EQ(got, want);
  EXPECT_GE(paced_seconds, (matmul_flops + attention_flops) / rate)
      << "a matmul of " << matmul_flops << " and an attention of " << attention_flops << " FLOPs at " << rate
      << " FLOP/s (inline: " << inline_seconds << " s)";
}

TEST(OpDeterminism, AccumulatingRowsInTwoCallsEqualsOneCall) {
  // The property that makes 4 micro-batches of 2 give the gradients of 1 of 8, bit for bit.
  const std::int64_t rows = 10, cols = 130;
  const Vec dy = random_vec(rows * cols, 42), x = random_vec(rows * cols, 43), w = random_vec(cols, 44);
  Buf DY = make_buf(dy, DType::F32), X = make_buf(x, DType::F32), W = make_buf(w, DType::F32), B = make_buf(Vec(cols, 0), DType::F32);
  Buf Y = make_buf(Vec(rows * cols), DType::F32), DX = make_buf(Vec(rows * cols), DType::F32);
  std::vector<float> mean(rows), rstd(rows);
  layernorm_forward(kInline, DType::F32, X.data(), W.data(), B.data(), Y.data(), mean.data(), rstd.data(), rows, cols, 1e-5f);
  auto run = [&](std::int64_t split) {
    Buf DW = make_buf(Vec(cols, 0.5), DType::F32), DB = make_buf(Vec(cols, 0.5), DType::F32), BG = make_buf(Vec(cols, 0.5), DType::F32);
    const auto* dyp = static_cast<const float*>(DY.data());
    const auto* xp = static_cast<const float*>(X.data());
    auto* dxp = static_cast<float*>(DX.data());
    for (std::int64_t r0 = 0; r0 < rows; r0 += split) {
      bias_grad(kInline, DType::F32, dyp + r0 * cols, split, cols, cols, BG.data());
      layernorm_backward(kInline, DType::F32, dyp + r0 * cols, xp + r0 * cols, W.data(), mean.data() + r0,
                         rstd.data() + r0, dxp + r0 * cols, DW.data(), DB.data(), split, cols, Accumulate::No);
    }
    std::vector<std::uint8_t> all = DW.bytes;
    all.insert(all.end(), DB.bytes.begin(), DB.bytes.end());
    all.insert(all.end(), BG.bytes.begin(), BG.bytes.end());
    return all;
  };
  EXPECT_EQ(run(rows), run(2));
}

}  // namespace
}  // namespace strata::models
