// The norm and element ops of the op set (models/kernels/ops.h) on a cuda device against their CPU
// kernels: layer norm and RMS norm forward and backward, GELU, SwiGLU, RoPE, residual add, for
// fp32, bf16 and fp16 (the method, the margins printed, and the skip without a GPU as in
// ops_cuda_test.cc). Tolerances: see Note [CUDA op tolerances] in tests/models/ops_cuda_test_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/error.h"
#include "models/kernels/cuda_kernels.h"
#include "models/kernels/ops.h"
#include "tests/models/ops_cuda_test_util.h"

namespace strata::models {
namespace {

using namespace strata::models::testing;

class CudaNormElementwiseByDtype : public CudaOpsByDtype {};

// ---------- layer norm, RMS norm ----------

struct NormCase {
  std::int64_t rows, cols;
};
// cols: under one warp, past one block (256 threads), several elements per thread, and 1.
const NormCase kNormCases[] = {{7, 37}, {130, 300}, {3, 1000}, {4, 1}};

// Uniform in [-2, 2] plus a row offset of 0, 1 or 2, so that the mean matters.
Vec norm_input(const NormCase& c, std::uint32_t seed) {
  Vec x = random_vec(c.rows * c.cols, seed, -2, 2);
  for (std::int64_t r = 0; r < c.rows; ++r) {
    for (std::int64_t j = 0; j < c.cols; ++j) x[r * c.cols + j] += static_cast<double>(r % 3);
  }
  return x;
}

// Tolerance: a row's statistics are sums of `cols` terms in different orders (block tree on the
// GPU, a loop on the CPU): mean and rstd within 2 (cols + 8) eps of mean|x| and of rstd. An output
// (x - mean) rstd w + b then moves by rstd |w| (the mean's error + |x - mean| times rstd's relative
// error), plus 8 eps of its own roundings, twice.
TEST_P(CudaNormElementwiseByDtype, LayerNormForwardMatchesCpu) {
  const float eps = 1e-5f;
  for (const NormCase& c : kNormCases) {
    const std::int64_t n = c.rows * c.cols;
    const Vec x = quantize(norm_input(c, 301), dt()), w = quantize(random_vec(c.cols, 302, 0.5, 1.5), dt());
    const Vec b = quantize(random_vec(c.cols, 303), dt());
    Twin X = twin(x, dt()), W = twin(w, dt()), B = twin(b, dt()), Y = twin(Vec(n, 9.0), dt());
    Twin M = twin(Vec(c.rows, 9.0), DType::F32), R = twin(Vec(c.rows, 9.0), DType::F32);
    both([&](Side s) {
      layernorm_forward(ctx(s), dt(), X.at(s), W.at(s), B.at(s), Y.at(s), M.as<float>(s), R.as<float>(s), c.rows,
                        c.cols, eps);
    });
    Vec by(n), bm(c.rows), br(c.rows);
    const double red = (static_cast<double>(c.cols) + 8) * kEps;
    for (std::int64_t r = 0; r < c.rows; ++r) {
      double sum = 0, sum_abs = 0, var = 0;
      for (std::int64_t j = 0; j < c.cols; ++j) sum += x[r * c.cols + j], sum_abs += std::abs(x[r * c.cols + j]);
      const double m = sum / c.cols, mean_abs = sum_abs / c.cols;
      for (std::int64_t j = 0; j < c.cols; ++j) var += (x[r * c.cols + j] - m) * (x[r * c.cols + j] - m);
      const double rstd = 1 / std::sqrt(var / c.cols + eps);
      bm[r] = 2 * red * mean_abs;
      br[r] = 2 * red * rstd;
      for (std::int64_t j = 0; j < c.cols; ++j) {
        const double dev = std::abs(x[r * c.cols + j] - m);
        by[r * c.cols + j] = 2 * (red * rstd * std::abs(w[j]) * (mean_abs + dev) +
                                  8 * kEps * (dev * rstd * std::abs(w[j]) + std::abs(b[j])));
      }
    }
    const std::string shape = " " + shape_name({c.rows, c.cols});
    expect_within_bounds(tag("layernorm_forward out" + shape), fetch(Y), Y.cpu(), by);
    expect_within_bounds(tag("layernorm_forward mean" + shape), fetch(M), M.cpu(), bm);
    expect_within_bounds(tag("layernorm_forward rstd" + shape), fetch(R), R.cpu(), br);
  }
}

// Both backward runs get the CPU forward's mean and rstd, so only the backward is compared.
// Tolerance: dx = (g - mean(g) - xhat mean(g xhat)) rstd with g = dout w: the two row means are
// sums of `cols` terms in different orders, (cols + 8) eps of their |terms|, times rstd, plus 8
// eps of the element's own terms (and of the accumulated dx), twice. dweight = sum over rows of
// dout xhat in the same order on both, but nvcc fuses each step into an FMA: 2 (rows + 4) eps
// sum|terms| (a bound for any order, so it holds for the bf16/fp16 kernel's 32-warp split too).
// dbias: fp32 adds dout in row order on both, bit for bit; bf16/fp16 split the rows over 32 warps
// on the GPU, (rows + 33) eps sum|terms| plus the output ulp.
TEST_P(CudaNormElementwiseByDtype, LayerNormBackwardMatchesCpuWithAndWithoutAccumulation) {
  for (const NormCase& c : kNormCases) {
    for (Accumulate acc : {Accumulate::No, Accumulate::Yes}) {
      const std::int64_t n = c.rows * c.cols;
      const Vec x = quantize(norm_input(c, 311), dt()), w = quantize(random_vec(c.cols, 312, 0.5, 1.5), dt());
      const Vec dy = quantize(random_vec(n, 313), dt()), dx0 = quantize(random_vec(n, 314), dt());
      std::vector<float> mean(static_cast<std::size_t>(c.rows)), rstd(mean.size());
      Buf y = make_buf(Vec(n), dt());
      layernorm_forward(kInline, dt(), make_buf(x, dt()).data(), make_buf(w, dt()).data(),
                        make_buf(Vec(c.cols, 0.0), dt()).data(), y.data(), mean.data(), rstd.data(), c.rows, c.cols,
                        1e-5f);
      Twin X = twin(x, dt()), W = twin(w, dt()), DY = twin(dy, dt()), DX = twin(dx0, dt());
      Twin DW = twin(random_vec(c.cols, 315), dt()), DB = twin(random_vec(c.cols, 316), dt());
      Twin M = twin(Vec(mean.begin(), mean.end()), DType::F32), R = twin(Vec(rstd.begin(), rstd.end()), DType::F32);
      const Vec dw0 = read_buf(DW.cpu()), db0 = read_buf(DB.cpu());
      both([&](Side s) {
        layernorm_backward(ctx(s), dt(), DY.at(s), X.at(s), W.at(s), M.as<float>(s), R.as<float>(s), DX.at(s),
                           DW.at(s), DB.at(s), c.rows, c.cols, acc);
      });
      Vec bdx(n), bdw(c.cols);
      const double red = (static_cast<double>(c.cols) + 8) * kEps;
      for (std::int64_t j = 0; j < c.cols; ++j) bdw[j] = std::abs(dw0[j]);
      for (std::int64_t r = 0; r < c.rows; ++r) {
        const double m = mean[r], s = rstd[r];
        double g_mean = 0, gx_mean = 0, g_abs = 0, gx_abs = 0;
        for (std::int64_t j = 0; j < c.cols; ++j) {
          const double g = dy[r * c.cols + j] * w[j], xhat = (x[r * c.cols + j] - m) * s;
          g_mean += g / c.cols, gx_mean += g * xhat / c.cols;
          g_abs += std::abs(g) / c.cols, gx_abs += std::abs(g * xhat) / c.cols;
          bdw[j] += std::abs(dy[r * c.cols + j] * xhat);
        }
        for (std::int64_t j = 0; j < c.cols; ++j) {
          const std::int64_t i = r * c.cols + j;
          const double g = dy[i] * w[j], xhat = (x[i] - m) * s;
          const double prior = acc == Accumulate::Yes ? std::abs(dx0[i]) : 0.0;
          bdx[i] = 2 * (red * s * (g_abs + std::abs(xhat) * gx_abs) +
                        8 * kEps * (s * (std::abs(g) + std::abs(g_mean) + std::abs(xhat * gx_mean)) + prior));
        }
      }
      for (std::int64_t j = 0; j < c.cols; ++j) bdw[j] *= 2 * (static_cast<double>(c.rows) + 4) * kEps;
      const std::string shape =
          " " + shape_name({c.rows, c.cols}) + (acc == Accumulate::Yes ? " accumulate" : " overwrite");
      expect_within_bounds(tag("layernorm_backward dx" + shape), fetch(DX), DX.cpu(), bdx);
      expect_within_bounds(tag("layernorm_backward dweight" + shape), fetch(DW), DW.cpu(), bdw);
      if (dt() == DType::F32) {
        expect_same_bits(tag("layernorm_backward dbias" + shape), fetch(DB), DB.cpu());
      } else {
        Vec bdb(c.cols);
        for (std::int64_t j = 0; j < c.cols; ++j) {
          double mag = std::abs(db0[j]);
          for (std::int64_t r = 0; r < c.rows; ++r) mag += std::abs(dy[r * c.cols + j]);
          bdb[j] = (static_cast<double>(c.rows) + 33) * kEps * mag;
        }
        expect_within_bounds(tag("layernorm_backward dbias" + shape), fetch(DB), DB.cpu(), bdb);
      }
    }
  }
}

// Tolerance: rstd from a sum of squares in different orders, 2 (cols + 8) eps relative; an output
// x rstd w moves by that relative error plus its own 2 roundings (nvcc may fuse them), twice.
TEST_P(CudaNormElementwiseByDtype, RmsNormForwardMatchesCpu) {
  const float eps = 1e-6f;
  for (const NormCase& c : kNormCases) {
    const std::int64_t n = c.rows * c.cols;
    const Vec x = quantize(norm_input(c, 321), dt()), w = quantize(random_vec(c.cols, 322, 0.5, 1.5), dt());
    Twin X = twin(x, dt()), W = twin(w, dt()), Y = twin(Vec(n, 9.0), dt()), R = twin(Vec(c.rows, 9.0), DType::F32);
    both([&](Side s) {
      rmsnorm_forward(ctx(s), dt(), X.at(s), W.at(s), Y.at(s), R.as<float>(s), c.rows, c.cols, eps);
    });
    Vec by(n), br(c.rows);
    const double red = (static_cast<double>(c.cols) + 8) * kEps;
    for (std::int64_t r = 0; r < c.rows; ++r) {
      double ss = 0;
      for (std::int64_t j = 0; j < c.cols; ++j) ss += x[r * c.cols + j] * x[r * c.cols + j];
      const double rstd = 1 / std::sqrt(ss / c.cols + eps);
      br[r] = 2 * red * rstd;
      for (std::int64_t j = 0; j < c.cols; ++j) {
        by[r * c.cols + j] = 2 * (red + 8 * kEps) * std::abs(x[r * c.cols + j] * rstd * w[j]);
      }
    }
    const std::string shape = " " + shape_name({c.rows, c.cols});
    expect_within_bounds(tag("rmsnorm_forward out" + shape), fetch(Y), Y.cpu(), by);
    expect_within_bounds(tag("rmsnorm_forward rstd" + shape), fetch(R), R.cpu(), br);
  }
}

// Both backward runs get the CPU forward's rstd. Tolerance: dx = (g - xhat mean(g xhat)) rstd with
// g = dout w: the row mean is a sum of `cols` terms in different orders, (cols + 8) eps of its
// |terms| times |xhat| rstd, plus 8 eps of the element's own terms (and the accumulated dx),
// twice. dweight = sum over rows of dout x rstd (fp32: same order, FMA on the GPU; bf16/fp16: 32
// warps split the rows): 2 (rows + 4) eps sum|terms|, a bound for any order.
TEST_P(CudaNormElementwiseByDtype, RmsNormBackwardMatchesCpuWithAndWithoutAccumulation) {
  for (const NormCase& c : kNormCases) {
    for (Accumulate acc : {Accumulate::No, Accumulate::Yes}) {
      const std::int64_t n = c.rows * c.cols;
      const Vec x = quantize(norm_input(c, 331), dt()), w = quantize(random_vec(c.cols, 332, 0.5, 1.5), dt());
      const Vec dy = quantize(random_vec(n, 333), dt()), dx0 = quantize(random_vec(n, 334), dt());
      std::vector<float> rstd(static_cast<std::size_t>(c.rows));
      Buf y = make_buf(Vec(n), dt());
      rmsnorm_forward(kInline, dt(), make_buf(x, dt()).data(), make_buf(w, dt()).data(), y.data(), rstd.data(), c.rows,
                      c.cols, 1e-6f);
      Twin X = twin(x, dt()), W = twin(w, dt()), DY = twin(dy, dt()), DX = twin(dx0, dt());
      Twin DW = twin(random_vec(c.cols, 335), dt()), R = twin(Vec(rstd.begin(), rstd.end()), DType::F32);
      const Vec dw0 = read_buf(DW.cpu());
      both([&](Side s) {
        rmsnorm_backward(ctx(s), dt(), DY.at(s), X.at(s), W.at(s), R.as<float>(s), DX.at(s), DW.at(s), c.rows, c.cols,
                         acc);
      });
      Vec bdx(n), bdw(c.cols);
      const double red = (static_cast<double>(c.cols) + 8) * kEps;
      for (std::int64_t j = 0; j < c.cols; ++j) bdw[j] = std::abs(dw0[j]);
      for (std::int64_t r = 0; r < c.rows; ++r) {
        const double s = rstd[r];
        double dot_mean = 0, dot_abs = 0;
        for (std::int64_t j = 0; j < c.cols; ++j) {
          const double gx = dy[r * c.cols + j] * w[j] * x[r * c.cols + j] * s;
          dot_mean += gx / c.cols, dot_abs += std::abs(gx) / c.cols;
          bdw[j] += std::abs(dy[r * c.cols + j] * x[r * c.cols + j] * s);
        }
        for (std::int64_t j = 0; j < c.cols; ++j) {
          const std::int64_t i = r * c.cols + j;
          const double g = dy[i] * w[j], xhat = x[i] * s;
          const double prior = acc == Accumulate::Yes ? std::abs(dx0[i]) : 0.0;
          bdx[i] = 2 * (red * s * std::abs(xhat) * dot_abs +
                        8 * kEps * (s * (std::abs(g) + std::abs(xhat * dot_mean)) + prior));
        }
      }
      for (std::int64_t j = 0; j < c.cols; ++j) bdw[j] *= 2 * (static_cast<double>(c.rows) + 4) * kEps;
      const std::string shape =
          " " + shape_name({c.rows, c.cols}) + (acc == Accumulate::Yes ? " accumulate" : " overwrite");
      expect_within_bounds(tag("rmsnorm_backward dx" + shape), fetch(DX), DX.cpu(), bdx);
      expect_within_bounds(tag("rmsnorm_backward dweight" + shape), fetch(DW), DW.cpu(), bdw);
    }
  }
}

// ---------- element ops ----------

// Tolerance: the same op_math.h code; tanhf (CUDA 2 ulp, glibc 1) and FMA contraction move
// 1 + tanh(.) by a few eps, so gelu = 0.5 x (1 + tanh) by a few eps |x|: bound 16 eps |x|. The
// gradient also has 0.5 x sech^2 dinner with sech^2 = 1 - t^2 (absolute error a few eps):
// 16 eps |dout| (1 + |x| (1 + 0.134 x^2)), 0.134 = 3 * 0.044715.
TEST_P(CudaNormElementwiseByDtype, GeluForwardAndBackwardMatchCpu) {
  for (std::int64_t n : {1, 1000, 70001}) {
    const Vec x = quantize(random_vec(n, 401, -6, 6), dt()), dy = quantize(random_vec(n, 402), dt());
    Twin X = twin(x, dt()), DY = twin(dy, dt()), Y = twin(Vec(n, 9.0), dt()), DX = twin(Vec(n, 9.0), dt());
    both([&](Side s) {
      gelu_forward(ctx(s), dt(), X.at(s), Y.at(s), n);
      gelu_backward(ctx(s), dt(), X.at(s), DY.at(s), DX.at(s), n);
    });
    Vec by(n), bdx(n);
    for (std::int64_t i = 0; i < n; ++i) {
      by[i] = 16 * kEps * std::abs(x[i]);
      bdx[i] = 16 * kEps * std::abs(dy[i]) * (1 + std::abs(x[i]) * (1 + 0.134 * x[i] * x[i]));
    }
    expect_within_bounds(tag("gelu_forward n" + std::to_string(n)), fetch(Y), Y.cpu(), by);
    expect_within_bounds(tag("gelu_backward n" + std::to_string(n)), fetch(DX), DX.cpu(), bdx);
  }
}

// Tolerance: sigmoid through expf (CUDA 2 ulp, glibc 1) and a division, then 2-3 products: 16 eps
// of |g s u| (forward), |dout g s| (d up) and |dout u s| (1 + |g|) (d gate, whose 1 + g (1 - s)
// may cancel, so its error is relative to the terms, not the result).
TEST_P(CudaNormElementwiseByDtype, SwigluForwardAndBackwardMatchCpu) {
  struct Case {
    std::int64_t rows, hidden;
  };
  for (const Case c : {Case{3, 11}, Case{37, 300}, Case{1, 1}}) {
    const std::int64_t n = c.rows * c.hidden;
    const Vec gu = quantize(random_vec(2 * n, 411, -6, 6), dt()), dy = quantize(random_vec(n, 412), dt());
    Twin GU = twin(gu, dt()), DY = twin(dy, dt()), Y = twin(Vec(n, 9.0), dt()), DGU = twin(Vec(2 * n, 9.0), dt());
    both([&](Side s) {
      swiglu_forward(ctx(s), dt(), GU.at(s), Y.at(s), c.rows, c.hidden);
      swiglu_backward(ctx(s), dt(), GU.at(s), DY.at(s), DGU.at(s), c.rows, c.hidden);
    });
    Vec by(n), bdgu(2 * n);
    for (std::int64_t r = 0; r < c.rows; ++r) {
      for (std::int64_t j = 0; j < c.hidden; ++j) {
        const std::int64_t gi = r * 2 * c.hidden + j, ui = gi + c.hidden, oi = r * c.hidden + j;
        const double g = gu[gi], u = gu[ui], d = dy[oi], sig = 1 / (1 + std::exp(-g));
        by[oi] = 16 * kEps * std::abs(g * sig * u);
        bdgu[gi] = 16 * kEps * std::abs(d * u * sig) * (1 + std::abs(g));
        bdgu[ui] = 16 * kEps * std::abs(d * g * sig);
      }
    }
    const std::string shape = " " + shape_name({c.rows, c.hidden});
    expect_within_bounds(tag("swiglu_forward" + shape), fetch(Y), Y.cpu(), by);
    expect_within_bounds(tag("swiglu_backward" + shape), fetch(DGU), DGU.cpu(), bdgu);
  }
}

// Tolerance: the angle t theta^(-2i/d) goes through powf (CUDA up to 4 ulp, glibc 1) and one
// product, so it differs by at most ~12 eps of itself; cosf/sinf (CUDA 2 ulp) and the rotation's
// products add a few eps: (12 angle + 16) eps (|x1| + |x2|). Elements outside the rotated heads
// (row padding) must not change.
TEST_P(CudaNormElementwiseByDtype, RopeForwardAndInverseMatchCpuAndLeaveRowPaddingAlone) {
  struct Case {
    std::int64_t batch, seq, heads, head_dim, row_stride;
    float theta;
  };
  for (const Case c : {Case{2, 37, 3, 64, 5 * 64, 10000.0f}, Case{1, 130, 2, 24, 53, 500000.0f},
                       Case{3, 1, 4, 8, 32, 10000.0f}}) {
    for (RopeDirection dir : {RopeDirection::Forward, RopeDirection::Inverse}) {
      const std::int64_t rows = c.batch * c.seq, half = c.head_dim / 2;
      const Vec x = quantize(random_vec(rows * c.row_stride, 421), dt());
      Twin X = twin(x, dt());
      both([&](Side s) {
        rope(ctx(s), dt(), X.at(s), c.batch, c.seq, c.heads, c.head_dim, c.row_stride, RopeSpec{c.theta}, dir);
      });
      Vec bound(x.size(), 0.0);
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t h = 0; h < c.heads; ++h) {
          for (std::int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(r % c.seq) *
                                 std::pow(static_cast<double>(c.theta), -2.0 * static_cast<double>(i) / c.head_dim);
            const std::int64_t p = r * c.row_stride + h * c.head_dim + i;
            bound[p] = bound[p + half] = (12 * angle + 16) * kEps * (std::abs(x[p]) + std::abs(x[p + half]));
          }
        }
      }
      expect_within_bounds(tag(std::string(dir == RopeDirection::Forward ? "rope forward " : "rope inverse ") +
                               shape_name({c.batch, c.seq, c.heads, c.head_dim, c.row_stride})),
                           fetch(X), X.cpu(), bound);
    }
  }
}

// Tolerance: bit for bit, in place or not (one addition and one rounding per element).
TEST_P(CudaNormElementwiseByDtype, ResidualAddIsTheCpuBitsInPlaceOrNot) {
  const std::int64_t n = 100003;
  Twin A = twin(random_vec(n, 431, -4, 4), dt()), B = twin(random_vec(n, 432, -4, 4), dt());
  Twin Y = twin(Vec(n, 9.0), dt());
  both([&](Side s) { residual_add(ctx(s), dt(), A.at(s), B.at(s), Y.at(s), n); });
  expect_same_bits(tag("residual_add"), fetch(Y), Y.cpu());
  both([&](Side s) { residual_add(ctx(s), dt(), A.at(s), B.at(s), A.at(s), n); });
  expect_same_bits(tag("residual_add in place"), fetch(A), A.cpu());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaNormElementwiseByDtype, ::testing::ValuesIn(kAllDtypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace strata::models
