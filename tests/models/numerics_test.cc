// How close the fp32 ops come to float64 on the long sums of a real model (Note [Long sums in
// double], models/kernels/cpu_matmul.cc): the cross-entropy of a GPT-2-sized vocabulary with
// spread-out logits, against a float64 evaluation of the same fp32 logits, must be within a few
// fp32 roundings of the loss, not the 1e-6 that adding 50257 exponentials one by one in fp32 gave.
// The whole-model check (a random GPT-2 124M, Strata's fp32 eval against float64 and PyTorch's
// fp32) is tools/numerics/gpt2_reference.py; its figures are in docs/MEASUREMENTS.md.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "models/kernels/ops.h"

namespace strata::models {
namespace {

const KernelContext kInline{};  // null stream: run on this thread

// -log softmax(logits)[target] in float64 from the fp32 logits.
double reference_loss(const float* row, std::int64_t vocab, std::int32_t target) {
  double mx = -INFINITY;
  for (std::int64_t j = 0; j < vocab; ++j) mx = std::max(mx, static_cast<double>(row[j]));
  double s = 0;
  for (std::int64_t j = 0; j < vocab; ++j) s += std::exp(static_cast<double>(row[j]) - mx);
  return std::log(s) + mx - row[target];
}

TEST(Numerics, CrossEntropyOverAGpt2VocabularyIsWithinAFewFp32RoundingsOfFloat64) {
  const std::int64_t rows = 8, vocab = 50257;
  for (const float spread : {1.0f, 5.0f, 20.0f}) {
    std::mt19937 gen(42);
    std::normal_distribution<float> normal(0.0f, spread);
    std::vector<float> logits(static_cast<std::size_t>(rows * vocab));
    for (float& v : logits) v = normal(gen);
    std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) targets[static_cast<std::size_t>(r)] = static_cast<std::int32_t>((r * 7919) % vocab);
    std::vector<float> losses(static_cast<std::size_t>(rows));
    cross_entropy(kInline, DType::F32, logits.data(), targets.data(), losses.data(), nullptr, rows, vocab, vocab, 1.0f);
    double worst = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const double want = reference_loss(logits.data() + r * vocab, vocab, targets[static_cast<std::size_t>(r)]);
      worst = std::max(worst, std::fabs(losses[static_cast<std::size_t>(r)] - want) / std::fabs(want));
    }
    // The loss is a few fp32 operations on an accurate sum: allow 4 roundings of it (2^-24 each).
    EXPECT_LE(worst, 4 * 0x1p-24) << "logit spread " << spread << ": worst relative error " << worst;
  }
}

}  // namespace
}  // namespace strata::models
