// The op set (models/kernels/ops.h) on a cuda device against its CPU kernels. Every op with a CUDA
// launcher runs twice on the same inputs, through the inline CPU path (KernelContext{} over host
// memory; ops_test.cc holds those kernels to double-precision references and finite differences)
// and through the cuda path (device memory, one stream, cuBLAS), and the two results are compared
// element by element for fp32, bf16 and fp16, on shapes that are no multiple of any block or tile.
// The CUDA kernels' documented answer to bad ids (NaN rows, cuda_kernels.h) is checked; the
// vocabulary-parallel ops (tensor parallelism) are in ops_vocab_parallel_cuda_test.cc. Every
// comparison prints its margins ("[ margin ]" lines: max abs/rel error, worst error/bound).
// Tolerances: see Note [CUDA op tolerances] in tests/models/ops_cuda_test_util.h. Attention: ops_attention_cuda_test.cc.
// Labelled `gpu` (tests/models/CMakeLists.txt): without a usable cuda device every test skips and
// says why.
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

// ---------- matmul, bias_grad ----------

enum class BiasArg { None, Given };
enum class COut { PerItem, OneAccumulated };  // stride_c != 0, or stride_c 0 with beta 1
enum class BOperand { PerItem, Shared };      // stride_b != 0, or 0

struct MatmulCase {
  const char* name;
  Trans ta, tb;
  std::int64_t m, n, k, batch, pad;  // pad: extra elements per row of A, B and C (ld > width)
  BiasArg bias;
  float alpha, beta;
  BOperand b_operand;
  COut c_out;
};

const MatmulCase kMatmulCases[] = {
    {"NN bias", Trans::No, Trans::No, 37, 29, 53, 1, 3, BiasArg::Given, 1.0f, 0.0f, BOperand::PerItem, COut::PerItem},
    {"NT alpha beta", Trans::No, Trans::Yes, 37, 29, 53, 1, 2, BiasArg::None, 0.5f, 0.75f, BOperand::PerItem,
     COut::PerItem},
    {"TN bias beta1", Trans::Yes, Trans::No, 37, 29, 53, 1, 1, BiasArg::Given, 1.0f, 1.0f, BOperand::PerItem,
     COut::PerItem},
    {"TT bias alpha beta", Trans::Yes, Trans::Yes, 37, 29, 53, 1, 4, BiasArg::Given, 1.25f, 0.5f, BOperand::PerItem,
     COut::PerItem},
    {"NN batch shared B bias", Trans::No, Trans::No, 16, 24, 40, 3, 1, BiasArg::Given, 1.0f, 0.0f, BOperand::Shared,
     COut::PerItem},
    {"NT batch", Trans::No, Trans::Yes, 33, 17, 65, 4, 0, BiasArg::None, 1.0f, 0.0f, BOperand::PerItem, COut::PerItem},
    {"TN batch into one C bias", Trans::Yes, Trans::No, 24, 33, 70, 3, 2, BiasArg::Given, 1.0f, 1.0f,
     BOperand::PerItem, COut::OneAccumulated},
    {"NN batch into one C alpha", Trans::No, Trans::No, 9, 31, 19, 5, 0, BiasArg::None, 0.5f, 1.0f, BOperand::PerItem,
     COut::OneAccumulated},
    {"NT large bias", Trans::No, Trans::Yes, 128, 96, 320, 1, 0, BiasArg::Given, 1.0f, 0.0f, BOperand::PerItem,
     COut::PerItem},
    {"NT one row", Trans::No, Trans::Yes, 1, 50, 64, 1, 0, BiasArg::Given, 1.0f, 0.0f, BOperand::PerItem,
     COut::PerItem},
    {"TN one column beta1", Trans::Yes, Trans::No, 45, 1, 64, 1, 1, BiasArg::None, 1.0f, 1.0f, BOperand::PerItem,
     COut::PerItem},
    {"k0 bias beta", Trans::No, Trans::No, 5, 7, 0, 1, 1, BiasArg::Given, 1.0f, 0.5f, BOperand::PerItem, COut::PerItem},
    {"k0 batch beta0", Trans::No, Trans::No, 5, 7, 0, 2, 1, BiasArg::None, 1.0f, 0.0f, BOperand::PerItem,
     COut::PerItem},
};

// Tolerance: cuBLAS (CUBLAS_COMPUTE_32F) and OpenBLAS each sum k products in fp32 in their own
// order; the difference is at most 2 (k + 2) eps (|alpha| sum_p |a_ip b_pj| + |beta c| + |bias|)
// per item (the classic gamma_k bound, twice), summed over the items accumulated into one C; a
// TF32 path (2^-11 per product) would exceed it on the small-k cases. 16-bit: one ulp per item
// rounded into one C and one for the bias prologue with beta != 0 (cuda_matmul.cu rounds it, the
// CPU does not). C's row padding must stay as it was.
TEST_P(CudaOpsByDtype, MatmulMatchesCpuForTransposesBatchesStridesBiasAndAccumulation) {
  for (const MatmulCase& c : kMatmulCases) {
    const std::int64_t a_rows = c.ta == Trans::No ? c.m : c.k, a_cols = c.ta == Trans::No ? c.k : c.m;
    const std::int64_t b_rows = c.tb == Trans::No ? c.k : c.n, b_cols = c.tb == Trans::No ? c.n : c.k;
    const std::int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.n + c.pad;
    const std::int64_t a_item = a_rows * lda + 5, b_item = b_rows * ldb + 5, c_item = c.m * ldc + 5;
    const bool one_c = c.c_out == COut::OneAccumulated;
    const bool shared_b = c.b_operand == BOperand::Shared;
    const std::int64_t stride_b = shared_b ? 0 : b_item, stride_c = one_c ? 0 : c_item;
    const Vec a = quantize(random_vec(c.batch * a_item, 101), dt());
    const Vec b = quantize(random_vec((shared_b ? 1 : c.batch) * b_item, 102), dt());
    const Vec c0 = quantize(random_vec((one_c ? 1 : c.batch) * c_item, 103), dt());
    const Vec bias = quantize(random_vec(c.n, 104), dt());
    Twin A = twin(a, dt()), B = twin(b, dt()), C = twin(c0, dt()), Bias = twin(bias, dt());
    both([&](Side s) {
      MatmulArgs args;
      args.dtype = dt();
      args.trans_a = c.ta;
      args.trans_b = c.tb;
      args.m = c.m, args.n = c.n, args.k = c.k;
      args.a = A.at(s), args.lda = lda, args.stride_a = a_item;
      args.b = B.at(s), args.ldb = ldb, args.stride_b = stride_b;
      args.c = C.at(s), args.ldc = ldc, args.stride_c = stride_c;
      args.batch = c.batch;
      args.bias = c.bias == BiasArg::Given ? Bias.at(s) : nullptr;
      args.alpha = c.alpha;
      args.beta = c.beta;
      matmul(ctx(s), args);
    });
    auto a_at = [&](std::int64_t item, std::int64_t i, std::int64_t p) {
      return a[item * a_item + (c.ta == Trans::No ? i * lda + p : p * lda + i)];
    };
    auto b_at = [&](std::int64_t item, std::int64_t p, std::int64_t j) {
      return b[item * stride_b + (c.tb == Trans::No ? p * ldb + j : j * ldb + p)];
    };
    Vec bound(c0.size(), 0.0);  // 0 on the padding of C: untouched
    for (std::int64_t ci = 0; ci < (one_c ? 1 : c.batch); ++ci) {
      const std::int64_t first = one_c ? 0 : ci, last = one_c ? c.batch : ci + 1;
      for (std::int64_t i = 0; i < c.m; ++i) {
        for (std::int64_t j = 0; j < c.n; ++j) {
          const std::int64_t at = ci * c_item + i * ldc + j;
          double products = 0;
          for (std::int64_t item = first; item < last; ++item) {
            for (std::int64_t p = 0; p < c.k; ++p) products += std::abs(a_at(item, i, p) * b_at(item, p, j));
          }
          const bool has_bias = c.bias == BiasArg::Given;
          const double mag =
              std::abs(c.alpha) * products + std::abs(c.beta * c0[at]) + (has_bias ? std::abs(bias[j]) : 0.0);
          const std::int64_t items = last - first;
          const int extra_roundings = (one_c ? static_cast<int>(items) : 0) + (has_bias && c.beta != 0 ? 1 : 0);
          bound[at] = 2.0 * static_cast<double>(c.k * items + 2 + items) * kEps * mag +
                      extra_roundings * ulp16(dt(), mag);
        }
      }
    }
    expect_within_bounds(tag(std::string("matmul ") + c.name + " " + shape_name({c.m, c.n, c.k, c.batch})), fetch(C),
                         C.cpu(), bound);
  }
}

// Tolerance: fp32 bit for bit: both add the rows in order into an fp32 running sum that starts from
// dbias and round once (no multiply, so no FMA to differ by). bf16/fp16 (never exact mode) sum on
// the GPU over 32 warps of strided rows, then the warps in order (cuda_matmul.cu): the worst case
// for two fp32 summation orders of rows + 1 terms, (rows + 33) eps sum|terms|, plus the output ulp.
TEST_P(CudaOpsByDtype, BiasGradIsTheCpuSumBitForBitInFp32AndWithinTheSumBoundIn16Bit) {
  struct Case {
    std::int64_t rows, cols, ld;
  };
  for (const Case c : {Case{300, 200, 203}, Case{1, 7, 7}, Case{37, 129, 130}, Case{4096, 70, 72}}) {
    const Vec d = quantize(random_vec(c.rows * c.ld, 201), dt()), db = quantize(random_vec(c.cols, 202), dt());
    Twin D = twin(d, dt()), DB = twin(db, dt());
    both([&](Side s) { bias_grad(ctx(s), dt(), D.at(s), c.rows, c.cols, c.ld, DB.at(s)); });
    const std::string name = "bias_grad " + shape_name({c.rows, c.cols, c.ld});
    if (dt() == DType::F32) {
      expect_same_bits(tag(name), fetch(DB), DB.cpu());
      continue;
    }
    Vec bound(static_cast<std::size_t>(c.cols));
    for (std::int64_t j = 0; j < c.cols; ++j) {
      double mag = std::abs(db[static_cast<std::size_t>(j)]);
      for (std::int64_t r = 0; r < c.rows; ++r) mag += std::abs(d[static_cast<std::size_t>(r * c.ld + j)]);
      bound[static_cast<std::size_t>(j)] = static_cast<double>(c.rows + 33) * kEps * mag;
    }
    expect_within_bounds(tag(name), fetch(DB), DB.cpu(), bound);
  }
}

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
TEST_P(CudaOpsByDtype, LayerNormForwardMatchesCpu) {
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
TEST_P(CudaOpsByDtype, LayerNormBackwardMatchesCpuWithAndWithoutAccumulation) {
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
TEST_P(CudaOpsByDtype, RmsNormForwardMatchesCpu) {
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
TEST_P(CudaOpsByDtype, RmsNormBackwardMatchesCpuWithAndWithoutAccumulation) {
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
TEST_P(CudaOpsByDtype, GeluForwardAndBackwardMatchCpu) {
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
TEST_P(CudaOpsByDtype, SwigluForwardAndBackwardMatchCpu) {
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
TEST_P(CudaOpsByDtype, RopeForwardAndInverseMatchCpuAndLeaveRowPaddingAlone) {
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
TEST_P(CudaOpsByDtype, ResidualAddIsTheCpuBitsInPlaceOrNot) {
  const std::int64_t n = 100003;
  Twin A = twin(random_vec(n, 431, -4, 4), dt()), B = twin(random_vec(n, 432, -4, 4), dt());
  Twin Y = twin(Vec(n, 9.0), dt());
  both([&](Side s) { residual_add(ctx(s), dt(), A.at(s), B.at(s), Y.at(s), n); });
  expect_same_bits(tag("residual_add"), fetch(Y), Y.cpu());
  both([&](Side s) { residual_add(ctx(s), dt(), A.at(s), B.at(s), A.at(s), n); });
  expect_same_bits(tag("residual_add in place"), fetch(A), A.cpu());
}

// Tolerance: bit for bit (a NaN as any NaN) for every pair of dtypes, over random bit patterns
// (NaNs, infinities, subnormals) and values exactly halfway between two bf16 or fp16 values.
TEST_F(CudaOps, CastBetweenEveryPairOfDtypesIsTheCpuBits) {
  const std::size_t n = 4099;
  std::mt19937 rng(441);
  for (DType from : kAllDtypes) {
    Buf src{from, std::vector<std::uint8_t>(n * dtype_bytes(from))};
    for (auto& byte : src.bytes) byte = static_cast<std::uint8_t>(rng());
    if (from == DType::F32) {
      for (std::size_t i = 0; i < 256; ++i) {  // rounding ties of bf16 (low 16 bits 0x8000) and fp16
        const std::uint32_t hi = static_cast<std::uint32_t>(rng()) & 0x47ff0000u;  // |x| < 2^16: fp16-finite
        const std::uint32_t bits = i % 2 == 0 ? (hi | 0x8000u) : (hi | 0x1000u);
        std::memcpy(src.bytes.data() + 4 * i, &bits, 4);
      }
    }
    for (DType to : kAllDtypes) {
      Twin S = twin(src), D = twin(Vec(n, 0.0), to);
      both([&](Side s) { cast(ctx(s), from, S.at(s), to, D.at(s), static_cast<std::int64_t>(n)); });
      expect_same_bits("cast " + std::string(dtype_name(from)) + " to " + std::string(dtype_name(to)), fetch(D),
                       D.cpu());
    }
  }
}

// ---------- embedding, cross-entropy ----------

// Tolerance: bit for bit. The forward adds one wpe element to one wte element; the backward adds
// dout rows into dwte in token order and into dwpe in batch order, rounding to the element type
// after every addition, on both sides (cuda_embedding.cu). 390 rows make the CUDA backward's id
// scan take two tiles of 256; ids repeat across them; backward rows with id -1 are skipped.
TEST_P(CudaOpsByDtype, EmbeddingForwardAndBackwardAreTheCpuBitsWithRepeatedTokens) {
  const std::int64_t batch = 3, seq = 130, vocab = 50, rows = batch * seq;
  std::mt19937 rng(451);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % vocab);
  ids[0] = vocab - 1, ids[300] = vocab - 1, ids[7] = 0;
  std::vector<std::int32_t> ids_with_skips = ids;
  ids_with_skips[5] = ids_with_skips[260] = -1;
  enum class Positions { None, Learned };
  for (std::int64_t channels : {37, 300}) {
    for (Positions pos : {Positions::None, Positions::Learned}) {
      const bool learned = pos == Positions::Learned;
      const std::string shape =
          " " + shape_name({batch, seq, channels}) + (learned ? " with wpe" : " without wpe");
      Twin T = twin_ids(ids), TS = twin_ids(ids_with_skips);
      Twin WTE = twin(random_vec(vocab * channels, 452), dt()), WPE = twin(random_vec(seq * channels, 453), dt());
      Twin Y = twin(Vec(rows * channels, 9.0), dt()), DY = twin(random_vec(rows * channels, 454), dt());
      Twin DWTE = twin(random_vec(vocab * channels, 455), dt()), DWPE = twin(random_vec(seq * channels, 456), dt());
      both([&](Side s) {
        embedding_forward(ctx(s), dt(), T.as<std::int32_t>(s), WTE.at(s), learned ? WPE.at(s) : nullptr, Y.at(s),
                          batch, seq, channels);
        embedding_backward(ctx(s), dt(), TS.as<std::int32_t>(s), DY.at(s), DWTE.at(s),
                           learned ? DWPE.at(s) : nullptr, batch, seq, channels);
      });
      expect_same_bits(tag("embedding_forward" + shape), fetch(Y), Y.cpu());
      expect_same_bits(tag("embedding_backward dwte" + shape), fetch(DWTE), DWTE.cpu());
      expect_same_bits(tag("embedding_backward dwpe" + shape), fetch(DWPE), DWPE.cpu());
    }
  }
}

enum class Dlogits { None, InPlace, Separate };

// Tolerance. The row's sum of exp(logit - max): the CPU adds in double, the GPU in fp32 over a
// block (ceil(vocab/256) terms per thread, then a tree); relative difference at most
// rel = (vocab/32 + 8) eps (8x the GPU's worst case, plus expf's 2 ulp). Loss = log(sum) + max -
// target logit: rel + 4 eps (|max| + |log sum| + |target| + 1). A gradient (p - onehot) scale:
// scale ((rel + 8 eps) p + 2 eps |p - onehot|). Ignored rows (target -1): loss and gradient exactly
// 0; columns [vocab, ld) untouched. Row 3 is shifted by +80 (exp overflows without the max).
TEST_P(CudaOpsByDtype, CrossEntropyMatchesCpuWithIgnoredTargetsRowStrideAndInPlaceGradient) {
  struct Case {
    std::int64_t rows, vocab, ld;
    Dlogits dlogits;
  };
  const float scale = 0.125f;
  for (const Case c : {Case{4, 37, 40, Dlogits::InPlace}, Case{6, 1000, 1003, Dlogits::Separate},
                       Case{5, 3001, 3008, Dlogits::None}}) {
    Vec logits = random_vec(c.rows * c.ld, 461, -4, 4);
    for (std::int64_t j = 0; j < c.ld; ++j) logits[3 * c.ld + j] += 80;
    logits = quantize(logits, dt());
    std::vector<std::int32_t> targets(static_cast<std::size_t>(c.rows));
    for (std::int64_t r = 0; r < c.rows; ++r) targets[r] = static_cast<std::int32_t>((r * 7919 + 13) % c.vocab);
    targets[0] = 0, targets[1] = -1, targets[2] = static_cast<std::int32_t>(c.vocab - 1);
    Twin L = twin(logits, dt()), T = twin_ids(targets), LOSS = twin(Vec(c.rows, 9.0), DType::F32);
    Twin DL = twin(Vec(c.rows * c.ld, 9.0), dt());
    Twin* grad = c.dlogits == Dlogits::InPlace ? &L : c.dlogits == Dlogits::Separate ? &DL : nullptr;
    both([&](Side s) {
      cross_entropy(ctx(s), dt(), L.at(s), T.as<std::int32_t>(s), LOSS.as<float>(s),
                    grad != nullptr ? grad->at(s) : nullptr, c.rows, c.vocab, c.ld, scale);
    });
    const double rel = (static_cast<double>(c.vocab) / 32 + 8) * kEps;
    Vec bloss(c.rows, 0.0), bgrad(c.rows * c.ld, 0.0);
    for (std::int64_t r = 0; r < c.rows; ++r) {
      if (targets[r] < 0) continue;
      double mx = -INFINITY, sum = 0;
      for (std::int64_t j = 0; j < c.vocab; ++j) mx = std::max(mx, logits[r * c.ld + j]);
      for (std::int64_t j = 0; j < c.vocab; ++j) sum += std::exp(logits[r * c.ld + j] - mx);
      bloss[r] = rel + 4 * kEps * (std::abs(mx) + std::abs(std::log(sum)) +
                                   std::abs(logits[r * c.ld + targets[r]]) + 1);
      for (std::int64_t j = 0; j < c.vocab; ++j) {
        const double p = std::exp(logits[r * c.ld + j] - mx) / sum, hot = j == targets[r] ? 1.0 : 0.0;
        bgrad[r * c.ld + j] = scale * ((rel + 8 * kEps) * p + 2 * kEps * std::abs(p - hot));
      }
    }
    const std::string shape = " " + shape_name({c.rows, c.vocab, c.ld}) +
                              (c.dlogits == Dlogits::InPlace    ? " in place"
                               : c.dlogits == Dlogits::Separate ? " separate"
                                                                : " loss only");
    expect_within_bounds(tag("cross_entropy loss" + shape), fetch(LOSS), LOSS.cpu(), bloss);
    if (grad != nullptr) expect_within_bounds(tag("cross_entropy dlogits" + shape), fetch(*grad), grad->cpu(), bgrad);
  }
}

// cuda_kernels.h: a GPU kernel cannot throw, so a negative token id makes its embedding row NaN
// and a target >= vocab its loss and gradient row (the CPU kernels throw instead).
TEST_F(CudaOps, BadTokenAndTargetIdsBecomeNaNRows) {
  const std::int64_t channels = 5, vocab = 5;
  const Vec wte = random_vec(4 * channels, 471);
  Twin T = twin_ids({2, -1, 0}), WTE = twin(wte, DType::F32), Y = twin(Vec(3 * channels, 9.0), DType::F32);
  embedding_forward(cuda_, DType::F32, T.as<std::int32_t>(Side::Cuda), WTE.at(Side::Cuda), nullptr,
                    Y.at(Side::Cuda), 1, 3, channels);
  const Vec y = read_buf(fetch(Y));
  for (std::int64_t c = 0; c < channels; ++c) {
    EXPECT_EQ(y[c], static_cast<double>(static_cast<float>(wte[2 * channels + c]))) << "row 0, channel " << c;
    EXPECT_TRUE(std::isnan(y[channels + c])) << "row 1 (token -1), channel " << c << ": " << y[channels + c];
    EXPECT_EQ(y[2 * channels + c], static_cast<double>(static_cast<float>(wte[c]))) << "row 2, channel " << c;
  }
  Twin L = twin(random_vec(2 * vocab, 472), DType::F32), TG = twin_ids({1, static_cast<std::int32_t>(vocab)});
  Twin LOSS = twin(Vec(2, 9.0), DType::F32), DL = twin(Vec(2 * vocab, 9.0), DType::F32);
  cross_entropy(cuda_, DType::F32, L.at(Side::Cuda), TG.as<std::int32_t>(Side::Cuda), LOSS.as<float>(Side::Cuda),
                DL.at(Side::Cuda), 2, vocab, vocab, 1.0f);
  const Vec loss = read_buf(fetch(LOSS)), dl = read_buf(fetch(DL));
  EXPECT_TRUE(std::isfinite(loss[0])) << loss[0];
  EXPECT_TRUE(std::isnan(loss[1])) << "target == vocab: " << loss[1];
  for (std::int64_t j = 0; j < vocab; ++j) {
    EXPECT_TRUE(std::isfinite(dl[j])) << "row 0, column " << j;
    EXPECT_TRUE(std::isnan(dl[vocab + j])) << "row 1 (target == vocab), column " << j << ": " << dl[vocab + j];
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOpsByDtype, ::testing::ValuesIn(kAllDtypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---------- what a cuda context refuses ----------

template <typename Fn>
void expect_device_error(const char* what, Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << what << ": no DeviceError";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
  }
}

// A cuda context without a stream, a matmul without cuBLAS handles, and an attention head too wide
// for one block's shared memory are DeviceErrors naming the problem, before anything is launched.
TEST_F(CudaOps, MisusedCudaContextsAreDeviceErrorsThatSayWhy) {
  const KernelContext no_stream{DeviceKind::Cuda, nullptr, nullptr};
  expect_device_error("gelu without a stream", [&] { gelu_forward(no_stream, DType::F32, nullptr, nullptr, 4); },
                      "needs a stream");
  const KernelContext no_cublas{DeviceKind::Cuda, stream_.get(), nullptr};
  expect_device_error("matmul without cuBLAS", [&] {
    matmul(no_cublas,
           MatmulArgs{DType::F32, Trans::No, Trans::No, 2, 2, 2, nullptr, 2, 0, nullptr, 2, 0, nullptr, 2, 0, 1});
  }, "KernelContext::cublas");
  const AttentionShape wide{1, 1, 1, 1, 1024, 3072, 3072, 1024};
  expect_device_error("attention head_dim 1024", [&] {
    attention_forward(cuda_, DType::F32, wide, nullptr, nullptr, nullptr, nullptr, nullptr);
  }, "head_dim 1024");
  stream_->synchronize();  // the stream is still usable
}

}  // namespace
}  // namespace strata::models
