// The op set (models/kernels/ops.h) on a cuda device against its CPU kernels. Every op with a CUDA
// launcher runs twice on the same inputs, through the inline CPU path (KernelContext{} over host
// memory; ops_test.cc holds those kernels to double-precision references and finite differences)
// and through the cuda path (device memory, one stream, cuBLAS), and the two results are compared
// element by element for fp32, bf16 and fp16, on shapes that are no multiple of any block or tile.
// The CUDA kernels' documented answer to bad ids (NaN rows, cuda_kernels.h) is checked; the
// vocabulary-parallel ops (tensor parallelism) are in ops_vocab_parallel_cuda_test.cc, the norm and
// element ops in ops_norm_elementwise_cuda_test.cc. Every
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
