// The gradient norm and non-finite check (deterministic for any thread count and SIMD path), the
// clipping coefficient, the fused optimizer phase against the unfused baseline, overflow handling
// (nothing written), SGD with momentum and Lion, and the Adam-shaped memory pass.
#include <gtest/gtest.h>

#include <tbb/task_arena.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "optim/grad_stats.h"
#include "optim/memory_pass.h"
#include "optim/optimizer_phase.h"
#include "tests/optim/optim_test_util.h"

namespace strata::optim {
namespace {

using testing::ShardData;
using testing::same_bits;
using testing::TypedBuffer;

std::vector<SimdLevel> all_levels() {
  std::vector<SimdLevel> levels = {SimdLevel::Scalar};
  for (SimdLevel l : testing::simd_levels_available()) levels.push_back(l);
  return levels;
}

TypedBuffer random_grads(DType dtype, std::size_t n, std::uint32_t seed, float sigma) {
  TypedBuffer b(dtype, n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  for (std::size_t i = 0; i < n; ++i) b.set(i, d(rng));
  return b;
}

TEST(GradStats, SameBitsOnEveryPathAndThreadCountAndCloseToExact) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    const std::size_t sizes[] = {3, 5 * kCpuBlockElems + 77, 1000};
    std::vector<TypedBuffer> bufs;
    std::vector<GradSpan> spans;
    long double exact = 0;
    for (std::size_t i = 0; i < 3; ++i) bufs.push_back(random_grads(dtype, sizes[i], 40 + i, 3.0f));
    for (const TypedBuffer& b : bufs) {
      spans.push_back(GradSpan{b.data(), dtype, b.size()});
      for (std::size_t i = 0; i < b.size(); ++i) exact += static_cast<long double>(b.get(i)) * b.get(i);
    }
    const GradStats first = grad_stats(spans, CpuExec{SimdLevel::Scalar, nullptr});
    EXPECT_TRUE(first.finite());
    EXPECT_NEAR(first.sum_squares, static_cast<double>(exact), 1e-12 * static_cast<double>(exact));
    for (SimdLevel level : all_levels()) {
      for (int threads : {1, 2, 5}) {
        tbb::task_arena arena(threads);
        const GradStats s = grad_stats(spans, CpuExec{level, &arena});
        EXPECT_EQ(s.sum_squares, first.sum_squares)
            << dtype_name(dtype) << " " << simd_level_name(level) << " threads=" << threads;
      }
    }
  }
}

TEST(GradStats, AnyNaNOrInfAnywhereIsFound) {
  const std::size_t n = 2 * kCpuBlockElems + 21;
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      for (std::size_t pos : {std::size_t{0}, std::size_t{15}, kCpuBlockElems + 3, n - 1}) {
        TypedBuffer b = random_grads(dtype, n, 7, 1.0f);
        b.set(pos, bad);
        const GradSpan span{b.data(), dtype, n};
        for (SimdLevel level : all_levels()) {
          EXPECT_FALSE(grad_stats({&span, 1}, CpuExec{level, nullptr}).finite())
              << dtype_name(dtype) << " value " << bad << " at " << pos << " " << simd_level_name(level);
        }
      }
    }
  }
  // Largest finite values are not overflow: squares are taken in double.
  TypedBuffer big(DType::F32, 4);
  for (std::size_t i = 0; i < 4; ++i) big.set(i, std::numeric_limits<float>::max());
  const GradSpan span{big.data(), DType::F32, 4};
  EXPECT_TRUE(grad_stats({&span, 1}, default_cpu_exec()).finite());
}

TEST(GradStats, ClipCoefficientFollowsTorch) {
  EXPECT_EQ(clip_coefficient(10.0, 0.0), 1.0);   // off
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);    // below the limit
  EXPECT_DOUBLE_EQ(clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0), 1.0);
  EXPECT_DOUBLE_EQ(unscaled_norm(GradStats{16.0 * 1024 * 1024}, 1024.0), 4.0);
}

struct PhaseCase {
  DType grad;
  DType out;
};

class Phase : public ::testing::TestWithParam<PhaseCase> {};

// With a power-of-two loss scale, unscaling is exact, so folding 1/scale and the clip coefficient
// into one multiplier changes nothing: the fused phase must give the unfused phase's bits.
TEST_P(Phase, FusedEqualsUnfusedBitForBit) {
  const PhaseCase& pc = GetParam();
  const std::size_t sizes[] = {kCpuBlockElems * 2 + 9, 100};
  LossScalerConfig lc;
  lc.initial_scale_power = 12;
  for (double max_norm : {0.0, 1.0}) {
    std::vector<ShardData> fused_data, unfused_data;
    for (std::size_t i = 0; i < 2; ++i) {
      fused_data.emplace_back(sizes[i], pc.grad, pc.out, true);
      fused_data.back().fill(static_cast<std::uint32_t>(60 + i), 4096.0f * 1e-2f);  // scaled by 2^12
    }
    unfused_data = fused_data;
    std::vector<OptimShard> fused_shards, unfused_shards;
    std::vector<std::vector<float>> scratch;
    std::vector<std::span<float>> grad_f32;
    for (std::size_t i = 0; i < 2; ++i) {
      fused_shards.push_back(fused_data[i].shard());
      unfused_shards.push_back(unfused_data[i].shard());
      if (pc.grad == DType::F32) {
        grad_f32.emplace_back(static_cast<float*>(unfused_data[i].g.data()), sizes[i]);
      } else {
        scratch.emplace_back(sizes[i]);
      }
    }
    for (auto& s : scratch) grad_f32.emplace_back(s);
    ParamGroup g1 = ParamGroup::adam("g", OptimizerKind::AdamW, AdamParams{});
    ParamGroup g2 = g1;
    LossScaler s1(lc), s2(lc);
    const PhaseResult a = fused_optimizer_phase(g1, fused_shards, &s1, PhaseOptions{max_norm}, default_cpu_exec());
    const PhaseResult b = unfused_optimizer_phase(g2, unfused_shards, grad_f32, &s2, PhaseOptions{max_norm},
                                                  default_cpu_exec());
    ASSERT_TRUE(a.applied);
    ASSERT_TRUE(b.applied);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
    EXPECT_EQ(a.clip_coef, b.clip_coef);
    if (max_norm > 0) {
      EXPECT_LT(a.clip_coef, 1.0) << "the test should exercise clipping";
    }
    for (std::size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(same_bits(fused_data[i].p, unfused_data[i].p, "master"));
      EXPECT_TRUE(same_bits(fused_data[i].v, unfused_data[i].v, "exp_avg_sq"));
      EXPECT_TRUE(fused_data[i].out == unfused_data[i].out) << "low-precision copy";
    }
    EXPECT_EQ(g1.step_count(), 1);
    EXPECT_EQ(s1.iteration(), 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Optim, Phase,
                         ::testing::Values(PhaseCase{DType::F32, DType::BF16}, PhaseCase{DType::BF16, DType::BF16},
                                           PhaseCase{DType::F16, DType::F16}));

TEST(Phase, OverflowWritesNothingAndLowersTheScale) {
  LossScalerConfig lc;
  lc.hysteresis = 1;
  LossScaler scaler(lc);
  ShardData d(3 * kCpuBlockElems + 1, DType::F16, DType::BF16, true);
  d.fill(5);
  d.g.set(2 * kCpuBlockElems + 7, std::numeric_limits<float>::infinity());
  const ShardData before = d;
  const OptimShard shard = d.shard();
  ParamGroup group = ParamGroup::adam("g", OptimizerKind::AdamW, AdamParams{});
  const PhaseResult r = fused_optimizer_phase(group, {&shard, 1}, &scaler, PhaseOptions{1.0}, default_cpu_exec());
  EXPECT_FALSE(r.applied);
  EXPECT_FALSE(std::isfinite(r.grad_norm));
  EXPECT_EQ(group.step_count(), 0);
  EXPECT_EQ(scaler.scale(), 32768.0);
  EXPECT_TRUE(same_bits(d.p, before.p, "master"));
  EXPECT_TRUE(same_bits(d.m, before.m, "exp_avg"));
  EXPECT_TRUE(same_bits(d.v, before.v, "exp_avg_sq"));
  EXPECT_TRUE(d.out == before.out);
  // The unfused baseline skips too.
  std::vector<float> scratch(d.p.size());
  const std::span<float> g32(scratch);
  const PhaseResult u = unfused_optimizer_phase(group, {&shard, 1}, {&g32, 1}, &scaler, PhaseOptions{}, default_cpu_exec());
  EXPECT_FALSE(u.applied);
  EXPECT_TRUE(same_bits(d.p, before.p, "master"));
  EXPECT_EQ(scaler.scale(), 16384.0);
}

// decide_phase is the decision the ZeRO engine's step takes over gradients summed from several
// units: the norm and grad_scale of the mean, with the loss scale, by the same expressions.
TEST(Phase, DecisionOfSummedGradientsUsesTheirMean) {
  LossScalerConfig lc;
  lc.initial_scale_power = 4;
  lc.hysteresis = 1;
  LossScaler scaler(lc);
  PhaseOptions o;
  o.max_grad_norm = 0.1;
  o.grad_divisor = 6.0;  // e.g. 3 micro-batches on 2 ranks
  const GradStats stats{1234.5};
  const PhaseResult r = decide_phase(stats, &scaler, o);
  ASSERT_TRUE(r.applied);
  EXPECT_EQ(r.loss_scale, 16.0);
  const double norm = std::sqrt(1234.5) / (16.0 * 6.0);
  EXPECT_EQ(r.grad_norm, norm);
  EXPECT_EQ(r.clip_coef, clip_coefficient(norm, 0.1));
  EXPECT_LT(r.clip_coef, 1.0);  // the clip is active, so grad_scale carries it
  EXPECT_EQ(r.grad_scale, static_cast<float>(r.clip_coef / (16.0 * 6.0)));
  // Without clipping and scaler the mean alone remains.
  const PhaseResult plain = decide_phase(stats, nullptr, PhaseOptions{0.0, 6.0});
  EXPECT_EQ(plain.grad_scale, static_cast<float>(1.0 / 6.0));
  // A non-finite sum skips and lowers the scale, whatever the divisor.
  const PhaseResult skip = decide_phase(GradStats{std::numeric_limits<double>::infinity()}, &scaler, o);
  EXPECT_FALSE(skip.applied);
  EXPECT_EQ(scaler.scale(), 8.0);
}

// SGD and Lion: the baseline scalar clone (libm fmaf) and the FMA clone agree bit for bit, and
// both follow the formulas evaluated in double.
TEST(Sgd, MomentumNesterovAndWeightDecayFollowTorch) {
  for (bool nesterov : {false, true}) {
    SgdParams params;
    params.lr = 0.05;
    params.momentum = 0.9;
    params.weight_decay = 0.01;
    params.nesterov = nesterov;
    params.dampening = 0.0;
    const std::size_t n = 1003;
    std::vector<ShardData> runs;
    for (SimdLevel level : all_levels()) {
      ShardData d(n, DType::BF16, DType::BF16, true);
      d.fill(8, 1.0f);
      std::vector<double> p(d.p.begin(), d.p.end()), buf(n, 0.0);
      ParamGroup group = ParamGroup::sgd("g", params);
      const OptimShard shard = d.shard();
      for (int t = 1; t <= 3; ++t) {
        group.step({&shard, 1}, 0.5f, CpuExec{level, nullptr});
        for (std::size_t i = 0; i < n; ++i) {
          double g = d.g.get(i) * 0.5 + params.weight_decay * p[i];
          buf[i] = t == 1 ? g : params.momentum * buf[i] + g;
          g = nesterov ? g + params.momentum * buf[i] : buf[i];
          p[i] -= params.lr * g;
        }
      }
      for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(d.p[i], p[i], 1e-6 * (1 + std::fabs(p[i]))) << i;
      runs.push_back(d);
    }
    for (std::size_t r = 1; r < runs.size(); ++r) {
      EXPECT_TRUE(same_bits(runs[r].p, runs[0].p, "sgd master"));
      EXPECT_TRUE(same_bits(runs[r].m, runs[0].m, "sgd momentum"));
      EXPECT_TRUE(runs[r].out == runs[0].out);
    }
  }
  SgdParams bad;
  bad.momentum = 1.0;
  EXPECT_THROW(validate(bad, "optimizer.params"), ConfigError);
  bad = {};
  bad.nesterov = true;  // needs momentum
  EXPECT_THROW(validate(bad, "optimizer.params"), ConfigError);
}

TEST(Lion, SignUpdateFollowsThePaper) {
  LionParams params;
  params.lr = 1e-3;
  params.weight_decay = 0.1;
  const std::size_t n = 517;
  std::vector<ShardData> runs;
  for (SimdLevel level : all_levels()) {
    ShardData d(n, DType::F32, DType::BF16, false);
    d.fill(12, 1.0f);
    std::vector<double> p(d.p.begin(), d.p.end()), m(d.m.begin(), d.m.end());
    ParamGroup group = ParamGroup::lion("g", params);
    const OptimShard shard = d.shard();
    for (int t = 1; t <= 3; ++t) {
      group.step({&shard, 1}, 1.0f, CpuExec{level, nullptr});
      for (std::size_t i = 0; i < n; ++i) {
        const double g = d.g.get(i);
        const double c = params.beta1 * m[i] + (1 - params.beta1) * g;
        p[i] = p[i] * (1 - params.lr * params.weight_decay) - params.lr * (c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0));
        m[i] = params.beta2 * m[i] + (1 - params.beta2) * g;
      }
    }
    for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(d.p[i], p[i], 1e-6 * (1 + std::fabs(p[i]))) << i;
    runs.push_back(d);
  }
  for (std::size_t r = 1; r < runs.size(); ++r) EXPECT_TRUE(same_bits(runs[r].p, runs[0].p, "lion master"));
  LionParams bad;
  bad.beta2 = 1.0;
  EXPECT_THROW(validate(bad, "optimizer.params"), ConfigError);
}

TEST(MemoryPass, MovesTheAdamStreamsWithTrivialMath) {
  for (SimdLevel level : all_levels()) {
    ShardData d(kCpuBlockElems + 19, DType::BF16, DType::BF16, false);
    d.fill(2);
    const ShardData before = d;
    const OptimShard shard = d.shard();
    adam_shaped_memory_pass({&shard, 1}, CpuExec{level, nullptr});
    for (std::size_t i = 0; i < d.p.size(); ++i) {
      const float g = before.g.get(i);
      ASSERT_EQ(d.m[i], before.m[i] + g);
      ASSERT_EQ(d.v[i], before.v[i] + g);
      ASSERT_EQ(d.p[i], before.p[i] + d.m[i]);
    }
  }
}

}  // namespace
}  // namespace strata::optim
