// Tests of the CPU Adam yardstick (optim/adam_yardstick.h): the shard `strata bench adam`,
// `strata doctor --measure` and the simulator's machine measurement time holds what each run needs,
// its fill does not depend on the threads, the rates come back as rates, and a shard too large for
// the host is one clear error. No figure is judged against a speed: timing is never a test.
#include <gtest/gtest.h>

#include <tbb/task_arena.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "optim/adam_yardstick.h"

namespace strata::optim {
namespace {

constexpr std::size_t kElems = kCpuBlockElems + 19;  // a whole block and a tail

YardstickShard filled_shard(DType grad_dtype, YardstickRun run, int threads) {
  YardstickShard st;
  st.n = kElems;
  st.grad_dtype = grad_dtype;
  allocate_yardstick_shard(st, {"--params 16403", "use a smaller --params"}, run);
  tbb::task_arena arena(threads);
  fill_yardstick_shard(st, 1e-3f, arena);
  return st;
}

bool same_bytes(const HostBuffer& a, const HostBuffer& b, std::size_t bytes) {
  return std::memcmp(a.data(), b.data(), bytes) == 0;
}

TEST(AdamYardstick, UpdateShardHoldsOnlyTheAdamStreams) {
  const YardstickShard st = filled_shard(DType::F32, YardstickRun::Update, 2);
  EXPECT_TRUE(st.out.empty());
  EXPECT_TRUE(st.g_pristine.empty());
  EXPECT_TRUE(st.scratch.empty());
  const OptimShard s = st.shard(YardstickRun::Update);
  EXPECT_EQ(s.master.size(), kElems);
  EXPECT_EQ(s.out.data, nullptr);
  for (std::size_t i = 0; i < kElems; ++i) {
    ASSERT_LT(std::fabs(s.master[i]), 1.0f) << "element " << i;
    ASSERT_GE(s.moment2[i], 0.0f) << "element " << i;  // a second moment is never negative
  }
}

TEST(AdamYardstick, PhaseShardKeepsPristineGradientsAndZeroedOutputs) {
  const YardstickShard st = filled_shard(DType::BF16, YardstickRun::Phase, 2);
  ASSERT_FALSE(st.g_pristine.empty());
  EXPECT_TRUE(same_bytes(st.g, st.g_pristine, kElems * 2));
  const OptimShard s = st.shard(YardstickRun::Phase);
  EXPECT_EQ(s.out.data, st.out.data());
  EXPECT_EQ(s.out.dtype, DType::BF16);
  const auto* out = static_cast<const std::uint16_t*>(st.out.data());
  const float* scratch = st.scratch.as<float>().data();
  for (std::size_t i = 0; i < kElems; ++i) {
    ASSERT_EQ(out[i], 0u) << "element " << i;
    ASSERT_EQ(scratch[i], 0.0f) << "element " << i;
  }
}

TEST(AdamYardstick, FillIsTheSameForAnyThreadCount) {
  const YardstickShard one = filled_shard(DType::F16, YardstickRun::Update, 1);
  const YardstickShard three = filled_shard(DType::F16, YardstickRun::Update, 3);
  EXPECT_TRUE(same_bytes(one.p, three.p, kElems * 4));
  EXPECT_TRUE(same_bytes(one.m, three.m, kElems * 4));
  EXPECT_TRUE(same_bytes(one.v, three.v, kElems * 4));
  EXPECT_TRUE(same_bytes(one.g, three.g, kElems * 2));
}

TEST(AdamYardstick, BytesPerParamAreTheAdamStreams) {
  EXPECT_EQ(adam_bytes_per_param(DType::F32), 28u);  // read p, m, v, g; write p, m, v
  EXPECT_EQ(adam_bytes_per_param(DType::BF16), 26u);
}

TEST(AdamYardstick, RatesAreFinitePositiveRates) {
  const AdamRates r = measure_adam_rates(kElems, 1);
  EXPECT_TRUE(std::isfinite(r.adam_params_per_s) && r.adam_params_per_s > 0) << r.adam_params_per_s;
  EXPECT_TRUE(std::isfinite(r.memory_gbps) && r.memory_gbps > 0) << r.memory_gbps;
}

TEST(AdamYardstick, ShardLargerThanTheHostIsOneClearError) {
  YardstickShard st;
  st.n = std::size_t{1} << 40;  // 16 TiB of fp32 streams
  try {
    allocate_yardstick_shard(st, {"--params 1T", "use a smaller --params"}, YardstickRun::Update);
    FAIL() << "a 16 TiB shard was allocated";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--params 1T needs"), std::string::npos) << what;
    EXPECT_NE(what.find("use a smaller --params"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace strata::optim
