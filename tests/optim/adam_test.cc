// AdamW/Adam on the CPU: every path (scalar, AVX2, AVX-512 where the CPU has them) against the
// plain scalar reference, the reference against the textbook formula in double, edge cases,
// thread-count determinism, multi-shard calls and hyper-parameter validation.
//
// Exactness claim: the scalar path and the SIMD paths are BIT-EXACT against the reference (not
// "within 1 ulp"): all of them evaluate optim/optim_math.h's operations in the same order with
// explicit fma at the same places (Note [Explicit fma] in optim/optim_math.h), so these tests compare bits.
#include <gtest/gtest.h>

#include <tbb/task_arena.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "optim/optimizer.h"
#include "tests/optim/optim_test_util.h"

namespace strata::optim {
namespace {

using testing::ShardData;
using testing::same_bits;

struct AdamCase {
  DType grad;
  bool with_out;
  DType out;
  WeightDecayMode mode;
};

std::string case_name(const ::testing::TestParamInfo<AdamCase>& info) {
  const AdamCase& c = info.param;
  std::string name = std::string(dtype_name(c.grad)) + "_grad_";
  name += c.with_out ? std::string(dtype_name(c.out)) + "_out_" : "no_out_";
  name += c.mode == WeightDecayMode::Decoupled ? "adamw" : "adam_l2";
  return name;
}

class AdamPaths : public ::testing::TestWithParam<AdamCase> {};

// Sizes around the vector widths (8, 16), the 16-lane sum rule and the block size (16384).
const std::size_t kSizes[] = {1, 7, 8, 15, 16, 17, 31, 33, 1000, kCpuBlockElems + 13, 3 * kCpuBlockElems + 5};

TEST_P(AdamPaths, EveryPathIsBitExactAgainstTheReference) {
  const AdamCase& tc = GetParam();
  AdamParams params;
  params.weight_decay = 0.05;
  params.weight_decay_mode = tc.mode;
  std::vector<SimdLevel> levels = {SimdLevel::Scalar};
  for (SimdLevel l : testing::simd_levels_available()) levels.push_back(l);
  for (std::size_t n : kSizes) {
    for (std::int64_t step : {std::int64_t{1}, std::int64_t{7}}) {
      const AdamStepConsts c = make_adam_consts(params, step, 0.5f);
      ShardData ref(n, tc.grad, tc.out, tc.with_out);
      ref.fill(static_cast<std::uint32_t>(n));
      testing::reference_adam(c, tc.mode, ref);
      for (SimdLevel level : levels) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " step=" << step << " path=" << simd_level_name(level));
        ShardData d(n, tc.grad, tc.out, tc.with_out);
        d.fill(static_cast<std::uint32_t>(n));
        const OptimShard shard = d.shard();
        adam_step(c, tc.mode, {&shard, 1}, CpuExec{level, nullptr});
        EXPECT_TRUE(same_bits(d.p, ref.p, "master"));
        EXPECT_TRUE(same_bits(d.m, ref.m, "exp_avg"));
        EXPECT_TRUE(same_bits(d.v, ref.v, "exp_avg_sq"));
        if (tc.with_out) {
          EXPECT_TRUE(d.out == ref.out) << "low-precision copy differs";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optim, AdamPaths,
    ::testing::Values(AdamCase{DType::F32, false, DType::BF16, WeightDecayMode::Decoupled},
                      AdamCase{DType::F32, true, DType::BF16, WeightDecayMode::Decoupled},
                      AdamCase{DType::BF16, true, DType::BF16, WeightDecayMode::Decoupled},
                      AdamCase{DType::F16, true, DType::F16, WeightDecayMode::Decoupled},
                      AdamCase{DType::BF16, false, DType::BF16, WeightDecayMode::L2},
                      AdamCase{DType::F32, true, DType::F16, WeightDecayMode::L2},
                      AdamCase{DType::F16, true, DType::BF16, WeightDecayMode::L2}),
    case_name);

// The reference itself against torch.optim.AdamW / Adam's formula evaluated in double.
TEST(Adam, ReferenceFollowsTheTorchFormula) {
  for (WeightDecayMode mode : {WeightDecayMode::Decoupled, WeightDecayMode::L2}) {
    AdamParams params;
    params.lr = 1e-2;
    params.weight_decay = 0.1;
    params.weight_decay_mode = mode;
    const std::size_t n = 257;
    ShardData d(n, DType::F32, DType::BF16, false);
    d.fill(11);
    std::vector<double> p(d.p.begin(), d.p.end()), m(d.m.begin(), d.m.end()), v(d.v.begin(), d.v.end());
    const float grad_scale = 0.25f;
    for (std::int64_t t = 1; t <= 5; ++t) {
      const OptimShard shard = d.shard();
      adam_step(make_adam_consts(params, t, grad_scale), mode, {&shard, 1}, CpuExec{SimdLevel::Scalar, nullptr});
      const double bc1 = 1.0 - std::pow(params.beta1, static_cast<double>(t));
      const double bc2 = 1.0 - std::pow(params.beta2, static_cast<double>(t));
      for (std::size_t i = 0; i < n; ++i) {
        double g = static_cast<double>(d.g.get(i)) * grad_scale;
        if (mode == WeightDecayMode::L2) g += params.weight_decay * p[i];
        m[i] = params.beta1 * m[i] + (1 - params.beta1) * g;
        v[i] = params.beta2 * v[i] + (1 - params.beta2) * g * g;
        const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + params.eps;
        if (mode == WeightDecayMode::Decoupled) p[i] *= 1 - params.lr * params.weight_decay;
        p[i] -= params.lr / bc1 * m[i] / denom;
      }
    }
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i) {
      // Float rounding over 5 steps: a few ulps of p plus a small part of one lr-sized update.
      const double tol = 1e-6 * std::fabs(p[i]) + 1e-5 * params.lr;
      worst = std::max(worst, std::fabs(d.p[i] - p[i]) / tol);
      ASSERT_NEAR(d.p[i], p[i], tol) << "element " << i;
      ASSERT_NEAR(d.m[i], m[i], 1e-6 * std::fabs(m[i]) + 1e-9) << "element " << i;
      ASSERT_NEAR(d.v[i], v[i], 1e-6 * std::fabs(v[i]) + 1e-15) << "element " << i;
    }
    RecordProperty("worst_error_over_tolerance", std::to_string(worst));
  }
}

TEST(Adam, BiasCorrectionAtStepOneAndAMillion) {
  AdamParams params;
  params.lr = 1e-3;
  params.weight_decay = 0.0;
  // Step 1 from zero moments: the update is lr * g / (|g| + eps'), i.e. -lr * sign(g).
  const std::size_t n = 64;
  ShardData d(n, DType::F32, DType::BF16, false);
  d.fill(3, 1.0f);
  std::fill(d.m.begin(), d.m.end(), 0.0f);
  std::fill(d.v.begin(), d.v.end(), 0.0f);
  const std::vector<float> p0 = d.p;
  const OptimShard shard = d.shard();
  adam_step(make_adam_consts(params, 1, 1.0f), WeightDecayMode::Decoupled, {&shard, 1}, default_cpu_exec());
  for (std::size_t i = 0; i < n; ++i) {
    const double g = d.g.get(i);
    const double expected = p0[i] - params.lr * (g > 0 ? 1.0 : -1.0);
    EXPECT_NEAR(d.p[i], expected, 1e-6 + 1e-4 * params.lr) << "element " << i << " g=" << g;
  }
  // Step 10^6: both corrections are exactly 1.
  const AdamStepConsts late = make_adam_consts(params, 1'000'000, 1.0f);
  EXPECT_EQ(late.neg_step_size, static_cast<float>(-params.lr));
  EXPECT_EQ(late.inv_bias_correction2_sqrt, 1.0f);
  AdamParams off = params;
  off.bias_correction = BiasCorrection::Off;
  const AdamStepConsts no_bc = make_adam_consts(off, 1, 1.0f);
  EXPECT_EQ(no_bc.neg_step_size, static_cast<float>(-params.lr));
  EXPECT_EQ(no_bc.inv_bias_correction2_sqrt, 1.0f);
  const AdamStepConsts first = make_adam_consts(params, 1, 1.0f);
  EXPECT_FLOAT_EQ(first.neg_step_size, static_cast<float>(-params.lr / 0.1));
  EXPECT_FLOAT_EQ(first.inv_bias_correction2_sqrt, static_cast<float>(1.0 / std::sqrt(0.001)));
}

// Zero, huge, tiny, subnormal and signed-zero gradients: every path agrees bit for bit and the
// results are what the formula says.
TEST(Adam, EdgeGradientsAgreeOnEveryPath) {
  for (DType gt : {DType::F32, DType::BF16, DType::F16}) {
    const std::vector<float> specials =
        gt == DType::F16 ? std::vector<float>{0.0f, -0.0f, 65504.0f, -60000.0f, 6e-8f, -1e-7f, 1e-4f, 3.0f}
                         : std::vector<float>{0.0f, -0.0f, 1e30f, -3e38f, 1e-30f, 1e-40f, -1e-45f, 3.0f};
    for (double wd : {0.0, 0.1}) {
      const std::size_t n = 16 * specials.size() + 5;
      AdamParams params;
      params.weight_decay = wd;
      const AdamStepConsts c = make_adam_consts(params, 2, 1.0f);
      ShardData ref(n, gt, DType::BF16, true);
      ref.fill(5);
      for (std::size_t i = 0; i < n; ++i) ref.g.set(i, specials[i % specials.size()]);
      ShardData start = ref;
      testing::reference_adam(c, WeightDecayMode::Decoupled, ref);
      for (SimdLevel level : testing::simd_levels_available()) {
        ShardData d = start;
        const OptimShard shard = d.shard();
        adam_step(c, WeightDecayMode::Decoupled, {&shard, 1}, CpuExec{level, nullptr});
        SCOPED_TRACE(::testing::Message() << dtype_name(gt) << " wd=" << wd << " " << simd_level_name(level));
        EXPECT_TRUE(same_bits(d.p, ref.p, "master"));
        EXPECT_TRUE(same_bits(d.m, ref.m, "exp_avg"));
        EXPECT_TRUE(same_bits(d.v, ref.v, "exp_avg_sq"));
        EXPECT_TRUE(d.out == ref.out);
      }
      for (std::size_t i = 0; i < n; ++i) {
        // Every result stays finite: a huge gradient saturates v to Inf, so its update is m/Inf = 0.
        ASSERT_TRUE(std::isfinite(ref.p[i])) << "element " << i << " g=" << ref.g.get(i);
        if (ref.g.get(i) == 0.0f) {
          // Zero gradient: moments only decay.
          EXPECT_EQ(ref.m[i], c.beta1 * start.m[i]);
        }
      }
    }
  }
  // Zero gradient and zero moments: the weights only decay (denominator eps, update 0).
  AdamParams params;
  params.weight_decay = 0.1;
  ShardData d(40, DType::F32, DType::BF16, false);
  d.fill(9);
  std::fill(d.m.begin(), d.m.end(), 0.0f);
  std::fill(d.v.begin(), d.v.end(), 0.0f);
  for (std::size_t i = 0; i < 40; ++i) d.g.set(i, 0.0f);
  const std::vector<float> p0 = d.p;
  const OptimShard shard = d.shard();
  const AdamStepConsts c = make_adam_consts(params, 1, 1.0f);
  adam_step(c, WeightDecayMode::Decoupled, {&shard, 1}, default_cpu_exec());
  for (std::size_t i = 0; i < 40; ++i) EXPECT_EQ(d.p[i], p0[i] * c.decay);
}

TEST(Adam, SameBitsForAnyThreadCount) {
  const std::size_t n = 11 * kCpuBlockElems + 123;
  AdamParams params;
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3, 8}) {
    tbb::task_arena arena(threads);
    ShardData d(n, DType::BF16, DType::BF16, true);
    d.fill(21);
    const OptimShard shard = d.shard();
    for (std::int64_t t = 1; t <= 3; ++t) {
      adam_step(make_adam_consts(params, t, 1.0f), WeightDecayMode::Decoupled, {&shard, 1},
                CpuExec{simd_level(), &arena});
    }
    results.push_back(d.p);
    results.push_back(d.v);
  }
  for (std::size_t r = 2; r < results.size(); ++r) EXPECT_TRUE(same_bits(results[r], results[r % 2], "threads"));
}

TEST(Adam, ManyShardsInOneCallEqualOneCallEach) {
  const std::size_t sizes[] = {5, kCpuBlockElems + 1, 0, 3000};
  std::vector<ShardData> together, alone;
  for (std::size_t i = 0; i < 4; ++i) {
    together.emplace_back(sizes[i], DType::F16, DType::BF16, true);
    together.back().fill(static_cast<std::uint32_t>(100 + i));
  }
  alone = together;
  const AdamStepConsts c = make_adam_consts(AdamParams{}, 4, 2.0f);
  std::vector<OptimShard> shards;
  for (ShardData& d : together) shards.push_back(d.shard());
  adam_step(c, WeightDecayMode::Decoupled, shards, default_cpu_exec());
  for (std::size_t i = 0; i < 4; ++i) {
    const OptimShard one = alone[i].shard();
    adam_step(c, WeightDecayMode::Decoupled, {&one, 1}, CpuExec{SimdLevel::Scalar, nullptr});
    EXPECT_TRUE(same_bits(together[i].p, alone[i].p, "master"));
    EXPECT_TRUE(together[i].out == alone[i].out);
  }
}

TEST(Adam, BadHyperParametersAreRejectedByName) {
  struct Bad {
    AdamParams params;
    const char* name;
    const char* range;
  };
  auto with = [](auto change) {
    AdamParams p;
    change(p);
    return p;
  };
  const Bad bad[] = {
      {with([](AdamParams& p) { p.lr = -1e-3; }), "lr", ">= 0"},
      {with([](AdamParams& p) { p.beta1 = 1.0; }), "beta1", "[0, 1)"},
      {with([](AdamParams& p) { p.beta1 = -0.1; }), "beta1", "[0, 1)"},
      {with([](AdamParams& p) { p.beta2 = 1.5; }), "beta2", "[0, 1)"},
      {with([](AdamParams& p) { p.eps = 0.0; }), "eps", "> 0"},
      {with([](AdamParams& p) { p.eps = -1e-8; }), "eps", "> 0"},
      {with([](AdamParams& p) { p.weight_decay = -0.01; }), "weight_decay", ">= 0"},
      {with([](AdamParams& p) { p.lr = std::numeric_limits<double>::quiet_NaN(); }), "lr", "finite"},
  };
  for (const Bad& b : bad) {
    try {
      validate(b.params, "optimizer.params");
      ADD_FAILURE() << b.name << " was accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("optimizer.params"), std::string::npos) << what;
      EXPECT_NE(what.find(b.name), std::string::npos) << what;
      EXPECT_NE(what.find(b.range), std::string::npos) << what;
    }
    EXPECT_THROW(ParamGroup::adam("g", OptimizerKind::AdamW, b.params), ConfigError);
  }
  EXPECT_NO_THROW(validate(AdamParams{}, "defaults"));
}

TEST(Adam, ShardSizeMismatchIsAConfigError) {
  ShardData d(10, DType::F32, DType::BF16, false);
  OptimShard s = d.shard();
  s.moment2 = s.moment2.subspan(0, 9);
  EXPECT_THROW(adam_step(make_adam_consts(AdamParams{}, 1, 1.0f), WeightDecayMode::Decoupled, {&s, 1},
                         default_cpu_exec()),
               ConfigError);
}

TEST(ParamGroup, CountsStepsAndForcesTheDecayMode) {
  AdamParams params;
  params.weight_decay_mode = WeightDecayMode::Decoupled;
  ParamGroup adam = ParamGroup::adam("blocks.0", OptimizerKind::Adam, params);
  EXPECT_EQ(adam.adam_params().weight_decay_mode, WeightDecayMode::L2);
  ParamGroup adamw = ParamGroup::adam("blocks.1", OptimizerKind::AdamW, params);
  ShardData d(100, DType::F32, DType::BF16, true);
  d.fill(1);
  ShardData ref = d;
  const OptimShard shard = d.shard();
  adamw.step({&shard, 1}, 1.0f, default_cpu_exec());
  adamw.step({&shard, 1}, 1.0f, default_cpu_exec());
  EXPECT_EQ(adamw.step_count(), 2);
  testing::reference_adam(make_adam_consts(params, 1, 1.0f), WeightDecayMode::Decoupled, ref);
  testing::reference_adam(make_adam_consts(params, 2, 1.0f), WeightDecayMode::Decoupled, ref);
  EXPECT_TRUE(same_bits(d.p, ref.p, "master"));
  EXPECT_THROW(adamw.set_lr(-1.0), ConfigError);
  adamw.set_lr(5e-4);
  EXPECT_EQ(adamw.adam_params().lr, 5e-4);
}

}  // namespace
}  // namespace strata::optim
