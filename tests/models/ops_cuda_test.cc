// The op set (models/kernels/ops.h) on a cuda device against its CPU kernels. Every op with a CUDA
// launcher runs twice on the same inputs, through the inline CPU path (KernelContext{} over host
// memory; ops_test.cc holds those kernels to double-precision references and finite differences)
// and through the cuda path (device memory, one stream, cuBLAS), and the two results are compared
// element by element for fp32, bf16 and fp16, on shapes that are no multiple of any block or tile.
// The vocabulary-parallel ops (CPU kernels only) must refuse a cuda context with a DeviceError, and
// the CUDA kernels' documented answer to bad ids (NaN rows, cuda_kernels.h) is checked. Every
// comparison prints its margins ("[ margin ]" lines: max abs/rel error, worst error/bound).
// Labelled `gpu` (tests/models/CMakeLists.txt): without a usable cuda device every test skips and
// says why.
//
// Note [CUDA op tolerances]. Both paths widen the same stored inputs to fp32 exactly and compute in
// fp32, so each bound is an fp32 bound on |cuda - cpu| per element, built in double from the
// magnitudes of the terms that element is made of (eps = FLT_EPSILON = 2^-23, u = eps/2):
//  * exact ops (the same additions in the same order, one rounding each: bias_grad and layer-norm
//    dbias in fp32, embedding forward and backward, residual_add, cast) must match bit for bit;
//  * element ops run op_math.h's STRATA_HD math on both sides; they differ only where nvcc
//    contracts a*b+c into one FMA and where CUDA's expf/tanhf/powf/sinf/cosf (2-4 ulp) differ from
//    glibc's (<= 1 ulp): about 16 eps times the operand magnitudes (a few ulp with room to spare,
//    far below any wrong-formula or wrong-index error);
//  * reductions whose order differs (block trees and lane strides on the GPU, loops on the CPU,
//    cuBLAS's blocking against OpenBLAS's): the worst-case bound (n + c) eps sum|terms| for n terms,
//    not the typical sqrt(n) eps, so no input trips it by chance; for our n <= ~1000 that is still
//    below 1e-4 of sum|terms|, while a missing term, a wrong index or a wrong stride moves an
//    element by >~ 1/n of it;
//  * bf16/fp16 outputs: the fp32 bound plus one ulp of the output type (two fp32 values that close
//    may round to neighbouring 16-bit values), plus one ulp per extra rounding a kernel makes
//    (matmul's accumulation of items into one C, its bias prologue with beta != 0).
// Elements an op must not touch (row padding, columns past vocab) get bound 0: equal.
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
#include "tests/models/op_test_util.h"

namespace strata::models {
namespace {

using namespace strata::models::testing;

constexpr double kEps = FLT_EPSILON;  // one fp32 ulp at 1
constexpr double kUnit = kEps / 2;    // fp32 unit roundoff
const KernelContext kInline{};         // null stream: the CPU kernel, on this thread

enum class Side { Cpu, Cuda };

// One tensor of a test in both runs: the CPU run's host bytes and the CUDA run's device copy,
// equal at the start. Token ids (int32) and fp32 statistics use it too; `dtype` says how to read
// the elements back (int32 ids are never read as values, only passed on).
struct Twin {
  DType dtype = DType::F32;
  std::vector<std::uint8_t> host;
  DeviceMemory dev;

  void* at(Side side) { return side == Side::Cpu ? static_cast<void*>(host.data()) : dev.data(); }
  void* at(Side side, std::int64_t elem) {  // element `elem` of a packed buffer
    return static_cast<std::uint8_t*>(at(side)) + static_cast<std::size_t>(elem) * dtype_bytes(dtype);
  }
  template <typename T>
  T* as(Side side) {
    return static_cast<T*>(at(side));
  }
  Buf cpu() const { return Buf{dtype, host}; }
};

std::string shape_name(std::initializer_list<std::int64_t> dims) {
  std::string s;
  for (std::int64_t d : dims) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (list_cuda_devices(&why).empty()) GTEST_SKIP() << "no usable cuda device: " << why;
    device_ = make_cuda_device(CudaDeviceOptions{});
    stream_ = device_->create_stream("models_ops");
    cublas_ = std::make_unique<CublasHandles>(*device_, *stream_);
    cuda_ = KernelContext{DeviceKind::Cuda, stream_.get(), cublas_.get()};
  }

  const KernelContext& ctx(Side side) const { return side == Side::Cpu ? kInline : cuda_; }

  // op(Side::Cpu) runs inline; op(Side::Cuda) enqueues on the stream, which is then drained (a
  // kernel fault surfaces here as the stream's error).
  template <typename Op>
  void both(Op&& op) {
    op(Side::Cpu);
    op(Side::Cuda);
    stream_->synchronize();
  }

  Twin twin(const Buf& buf) {
    Twin t{buf.dtype, buf.bytes, device_->allocate(std::max<std::size_t>(buf.bytes.size(), 1), "ops_cuda_test")};
    stream_->copy_h2d(t.dev.data(), t.host.data(), t.host.size());
    stream_->synchronize();  // the CPU run may write t.host next
    return t;
  }
  Twin twin(const Vec& values, DType dtype) { return twin(make_buf(values, dtype)); }
  Twin twin_ids(const std::vector<std::int32_t>& ids) {
    Buf b{DType::F32, std::vector<std::uint8_t>(ids.size() * 4)};
    std::memcpy(b.bytes.data(), ids.data(), b.bytes.size());
    return twin(b);
  }

  // The CUDA run's result.
  Buf fetch(const Twin& t) {
    Buf b{t.dtype, std::vector<std::uint8_t>(t.host.size())};
    stream_->copy_d2h(b.bytes.data(), t.dev.data(), b.bytes.size());
    stream_->synchronize();
    return b;
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<CublasHandles> cublas_;  // declared after device_: destroyed before it
  KernelContext cuda_;
};

class CudaOpsByDtype : public CudaOps, public ::testing::WithParamInterface<DType> {
 protected:
  DType dt() const { return GetParam(); }
  std::string tag(const std::string& what) const { return what + " " + std::string(dtype_name(dt())); }
};

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
        rope(ctx(s), dt(), X.at(s), c.batch, c.seq, c.heads, c.head_dim, c.row_stride, c.theta, dir);
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
    // Tensor-core path (16-bit): several 64-row tiles and a part, at both head dims, batch > 1.
    {"gqa", 1, 200, 4, 2, 64, 0}, {"mha", 1, 129, 2, 2, 128, 0}, {"gqa", 2, 200, 4, 2, 128, 0},
    {"gqa", 3, 130, 8, 2, 64, 0},
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
TEST_P(CudaOpsByDtype, AttentionForwardAndBackwardMatchCpu) {
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

// GPU only: the decoder's per-KV-group calls (Note [Replicated KV heads], ops_test.cc) over some
// query heads with the whole lse (lse_heads) and dK|dV in a buffer of their own (dkv_row_stride)
// give the whole call's bits, and a repeated backward gives the same bits (no atomics).
TEST_P(CudaOpsByDtype, AttentionOverSomeHeadsIsTheWholeCallBitForBitAndRepeatsExactly) {
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

// ops.h: the vocabulary-parallel ops have CPU kernels only; a cuda context gets a DeviceError that
// says so (nothing is launched, so null pointers are fine).
TEST_F(CudaOps, VocabParallelOpsSayTheyHaveNoCudaKernel) {
  const DType f = DType::F32;
  const std::string says = "has no CUDA kernel";
  expect_device_error("embedding_forward_vocab_slice", [&] {
    embedding_forward_vocab_slice(cuda_, f, nullptr, nullptr, 0, 8, nullptr, nullptr, 1, 2, 4);
  }, says);
  expect_device_error("embedding_backward_vocab_slice", [&] {
    embedding_backward_vocab_slice(cuda_, f, nullptr, nullptr, nullptr, 0, 8, nullptr, 1, 2, 4);
  }, says);
  expect_device_error("cross_entropy_row_max", [&] { cross_entropy_row_max(cuda_, f, nullptr, 2, 8, 8, nullptr); },
                      says);
  expect_device_error("cross_entropy_slice_sums", [&] {
    cross_entropy_slice_sums(cuda_, f, nullptr, nullptr, 2, 8, 16, 2, 0, 1, nullptr, nullptr, nullptr);
  }, says);
  expect_device_error("cross_entropy_finish", [&] {
    cross_entropy_finish(cuda_, f, nullptr, nullptr, nullptr, nullptr, 2, 8, 16, 2, 0, 1, nullptr, nullptr, nullptr,
                         1.0f);
  }, says);
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
