// The vocabulary-parallel ops of tensor parallelism (models/kernels/ops.h; CUDA kernels in
// cuda_embedding.cu and cuda_vocab_parallel.cu) on a cuda device against their CPU kernels, as
// ops_cuda_test.cc does for the rest of the op set (the fixture; see Note [CUDA op tolerances] in tests/models/ops_cuda_test_util.h:
// ops_cuda_test_util.h). Labelled `gpu`: without a usable cuda device every test skips and says why.
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

class CudaVocabParallelByDtype : public CudaOpsByDtype {};

// The vocabulary-parallel embedding and cross-entropy (tensor parallelism, ops.h) for each rank of
// 2 holding 2 of 4 slices of a 1000-row vocabulary, as the sliced head calls them. Tolerances (Note
// [CUDA op tolerances]): the embedding, the row maximum and the target logit are the CPU bits; a
// slice's sum of exp(logit - max) is positive terms, each from expf (CUDA's within 16 eps of
// glibc's), added in double in another order: 16 eps relative. finish takes the CPU's gathered
// statistics on both sides (so it is tested alone): the loss and the gradient as the
// whole-vocabulary cross-entropy's element bounds, with the sum now the same on both sides.
TEST_P(CudaVocabParallelByDtype, OpsMatchCpu) {
  const std::int64_t batch = 2, seq = 3, rows = batch * seq, vocab = 1000, slices = 4, local = 2, channels = 37;
  const float scale = 0.25f;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) ids[r] = static_cast<std::int32_t>((r * 389 + 7) % vocab);
  ids[1] = ids[4] = 600;  // a repeated id in the second rank's rows
  std::vector<std::int32_t> targets = ids;
  targets[2] = -1;  // ignored
  std::vector<std::vector<double>> cpu_sums(2);
  std::vector<float> cpu_max(static_cast<std::size_t>(rows), -INFINITY), cpu_target(static_cast<std::size_t>(rows), 0);
  std::vector<Vec> logits_of(2);
  for (int k = 0; k < 2; ++k) {
    const std::int64_t begin = k * local * vocab / slices, end = (k + 1) * local * vocab / slices;
    const std::int64_t cols = end - begin, ld = cols + 3;
    const std::string shape = " rank " + std::to_string(k) + " rows [" + std::to_string(begin) + ", " +
                              std::to_string(end) + ")";
    // The embedding's slice, forward and backward (a token outside the rank's rows: zeros, no add).
    Twin T = twin_ids(ids), WTE = twin(random_vec(cols * channels, 470 + k), dt());
    Twin WPE = twin(random_vec(seq * channels, 472), dt()), Y = twin(Vec(rows * channels, 9.0), dt());
    Twin DY = twin(random_vec(rows * channels, 473), dt()), DWTE = twin(random_vec(cols * channels, 474), dt());
    Twin DWPE = twin(random_vec(seq * channels, 475), dt());
    both([&](Side s) {
      embedding_forward_vocab_slice(ctx(s), dt(), T.as<std::int32_t>(s), WTE.at(s), begin, end, WPE.at(s), Y.at(s),
                                    batch, seq, channels);
      embedding_backward_vocab_slice(ctx(s), dt(), T.as<std::int32_t>(s), DY.at(s), DWTE.at(s), begin, end, DWPE.at(s),
                                     batch, seq, channels);
    });
    expect_same_bits(tag("embedding_forward_vocab_slice" + shape), fetch(Y), Y.cpu());
    expect_same_bits(tag("embedding_backward_vocab_slice dwte" + shape), fetch(DWTE), DWTE.cpu());
    expect_same_bits(tag("embedding_backward_vocab_slice dwpe" + shape), fetch(DWPE), DWPE.cpu());

    // The cross-entropy's first step: the rank's row maxima (all-reduced below, as the pass does).
    Vec logits = random_vec(rows * ld, 480 + k, -4, 4);
    for (std::int64_t j = 0; j < ld; ++j) logits[3 * ld + j] += 80;
    logits = quantize(logits, dt());
    logits_of[k] = logits;
    Twin L = twin(logits, dt()), MAX = twin(Vec(rows, 9.0), DType::F32);
    both([&](Side s) { cross_entropy_row_max(ctx(s), dt(), L.at(s), rows, cols, ld, MAX.as<float>(s)); });
    expect_same_bits(tag("cross_entropy_row_max" + shape), fetch(MAX), MAX.cpu());
    const Buf mx = MAX.cpu();
    for (std::int64_t r = 0; r < rows; ++r) {
      float m = 0;
      std::memcpy(&m, mx.bytes.data() + r * 4, 4);
      cpu_max[r] = std::max(cpu_max[r], m);
    }
  }
  Buf max_buf{DType::F32, std::vector<std::uint8_t>(cpu_max.size() * 4)};
  std::memcpy(max_buf.bytes.data(), cpu_max.data(), max_buf.bytes.size());
  for (int k = 0; k < 2; ++k) {  // the second step, from the all-reduced maxima
    const std::int64_t begin = k * local * vocab / slices, end = (k + 1) * local * vocab / slices;
    const std::int64_t ld = end - begin + 3;
    const std::string shape = " rank " + std::to_string(k);
    Twin L = twin(logits_of[k], dt()), TG = twin_ids(targets), MAX = twin(max_buf);
    Twin TL = twin(Vec(rows, 9.0), DType::F32);
    Twin SUMS = twin(Buf{DType::F32, std::vector<std::uint8_t>(static_cast<std::size_t>(rows * local) * 8)});
    both([&](Side s) {
      cross_entropy_slice_sums(ctx(s), dt(), L.at(s), TG.as<std::int32_t>(s), rows, ld, vocab, slices, k * local,
                               local, MAX.as<float>(s), SUMS.as<double>(s), TL.as<float>(s));
    });
    expect_same_bits(tag("cross_entropy_slice_sums target logit" + shape), fetch(TL), TL.cpu());
    const Buf got = fetch(SUMS);
    std::vector<double> g(static_cast<std::size_t>(rows * local)), w(g.size());
    std::memcpy(g.data(), got.bytes.data(), g.size() * 8);
    std::memcpy(w.data(), SUMS.host.data(), w.size() * 8);
    for (std::size_t i = 0; i < w.size(); ++i) {
      EXPECT_LE(std::abs(g[i] - w[i]), 16 * kEps * w[i]) << tag("cross_entropy_slice_sums" + shape) << " element " << i;
    }
    cpu_sums[k] = w;
    const Buf tl = TL.cpu();
    for (std::int64_t r = 0; r < rows; ++r) {
      float t = 0;
      std::memcpy(&t, tl.bytes.data() + r * 4, 4);
      cpu_target[r] += t;  // one rank holds the target, the other adds 0
    }
  }
  // The CPU run's statistics as the collectives would leave them, then each rank's finish.
  std::vector<double> all;
  for (int k = 0; k < 2; ++k) all.insert(all.end(), cpu_sums[k].begin(), cpu_sums[k].end());
  Buf all_buf{DType::F32, std::vector<std::uint8_t>(all.size() * 8)};
  std::memcpy(all_buf.bytes.data(), all.data(), all_buf.bytes.size());
  Buf tl_buf = max_buf;
  std::memcpy(tl_buf.bytes.data(), cpu_target.data(), tl_buf.bytes.size());
  for (int k = 0; k < 2; ++k) {
    const std::int64_t begin = k * local * vocab / slices, end = (k + 1) * local * vocab / slices;
    const std::int64_t cols = end - begin, ld = cols + 3;
    Twin L = twin(logits_of[k], dt()), TG = twin_ids(targets), ALL = twin(all_buf), MAX = twin(max_buf);
    Twin TL = twin(tl_buf), LOSS = twin(Vec(rows, 9.0), DType::F32);
    both([&](Side s) {
      cross_entropy_finish(ctx(s), dt(), L.at(s), TG.as<std::int32_t>(s), LOSS.as<float>(s), L.at(s), rows, ld, vocab,
                           slices, k * local, local, MAX.as<float>(s), ALL.as<double>(s), TL.as<float>(s), scale);
    });
    const Vec& x = logits_of[k];
    Vec bloss(rows, 0.0), bgrad(rows * ld, 0.0);
    for (std::int64_t r = 0; r < rows; ++r) {
      if (targets[r] < 0) continue;
      double sum = 0;
      for (std::int64_t q = 0; q < 2; ++q) {
        for (std::int64_t l = 0; l < local; ++l) sum += all[(q * rows + r) * local + l];
      }
      bloss[r] = 4 * kEps * (std::abs(cpu_max[r]) + std::abs(std::log(sum)) + std::abs(cpu_target[r]) + 1);
      for (std::int64_t j = 0; j < cols; ++j) {
        const double p = std::exp(x[r * ld + j] - cpu_max[r]) / sum, hot = j + begin == targets[r] ? 1.0 : 0.0;
        bgrad[r * ld + j] = scale * (24 * kEps * p + 2 * kEps * std::abs(p - hot));
      }
    }
    const std::string shape = " rank " + std::to_string(k);
    expect_within_bounds(tag("cross_entropy_finish loss" + shape), fetch(LOSS), LOSS.cpu(), bloss);
    expect_within_bounds(tag("cross_entropy_finish dlogits in place" + shape), fetch(L), L.cpu(), bgrad);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaVocabParallelByDtype, ::testing::ValuesIn(kAllDtypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace strata::models
