// Single-process tests of the ZeRO engine on the toy model: exact mode gives bit-identical weights
// for every stage, accumulation and prefetch setting against the stage-0 run; the prefetcher
// gathers ahead along the recorded trace; gradient clipping and bf16 run. The multi-rank matrix is
// tests/engine/engine_mpi_main.cc (ctest runs it under mpirun).
#include <gtest/gtest.h>

#include <cstring>

#include <chrono>
#include <thread>

#include "core/device/sim_kernel.h"
#include "core/error.h"
#include "engine/zero_engine.h"
#include "tests/core/sim_device_test_util.h"
#include "tests/engine/toy_model.h"

namespace strata {
namespace {

using testing_toy::ToyShape;

TrainConfig toy_config(int stage, int accumulation) { return testing_toy::toy_train_config(stage, accumulation); }

using RunResult = testing_toy::ToyRun;

RunResult run_toy(const TrainConfig& config, int steps, const ToyShape& shape = {}) {
  testing_toy::ToyRunOptions options;
  options.steps = steps;
  options.shape = shape;
  return testing_toy::run_toy_local(config, options);
}

void expect_bit_identical(const RunResult& a, const RunResult& b, const std::string& what) {
  EXPECT_EQ(testing_toy::count_weight_differences(a, b), 0u) << what;
}

TEST(ZeroEngine, ToyModelLearns) {
  const RunResult r = run_toy(toy_config(0, 1), 30);
  EXPECT_LT(r.losses.back(), 0.5f * r.losses.front()) << r.losses.front() << " -> " << r.losses.back();
}

TEST(ZeroEngine, ExactModeIsBitIdenticalAcrossStagesAndAccumulation) {
  for (int accumulation : {1, 4}) {
    const RunResult reference = run_toy(toy_config(0, accumulation), 6);
    for (int stage : {1, 2, 3}) {
      expect_bit_identical(run_toy(toy_config(stage, accumulation), 6), reference,
                           "stage " + std::to_string(stage) + " accumulation " + std::to_string(accumulation));
    }
  }
}

TEST(ZeroEngine, Stage3PrefetchesAlongTheTraceWithSameBits) {
  TrainConfig c = toy_config(3, 2);
  c.zero.param_persistence_threshold_elems = 0;  // every group is gathered on use
  c.zero.prefetch_bucket_size_elems = 1 << 20;
  c.zero.max_live_parameters_elems = 1 << 22;
  const RunResult prefetching = run_toy(c, 4);
  EXPECT_GT(prefetching.prefetched, 0u) << "no gather was issued ahead of use";
  c.zero.prefetch_bucket_size_elems = 0;  // no prefetch, no reuse
  const RunResult plain = run_toy(c, 4);
  EXPECT_EQ(plain.prefetched, 0u);
  EXPECT_GE(plain.gathers, prefetching.gathers) << "keeping groups inside the window saves gathers";
  expect_bit_identical(prefetching, plain, "prefetch on/off");
  expect_bit_identical(prefetching, run_toy(toy_config(0, 2), 4), "stage 3 vs stage 0");
}

TEST(ZeroEngine, PersistentSmallGroupsGiveSameBits) {
  TrainConfig c = toy_config(3, 1);
  c.zero.param_persistence_threshold_elems = 1 << 30;  // everything stays gathered
  expect_bit_identical(run_toy(c, 4), run_toy(toy_config(0, 1), 4), "persistent stage 3");
}

TEST(ZeroEngine, FastModeAccumulatesAndLearns) {
  TrainConfig c = toy_config(2, 2);
  c.strata.exact = false;
  const RunResult r = run_toy(c, 30);
  EXPECT_LT(r.losses.back(), 0.5f * r.losses.front());
}

TEST(ZeroEngine, MisuseIsAClearError) {
  SimDeviceOptions o;
  o.capacity_bytes = 16 << 20;
  auto device = make_sim_device(o);
  auto comm = make_local_communicator();
  ZeroEngine engine(toy_config(3, 2), *device, *comm, testing_toy::toy_groups({}, DType::F32), testing_toy::toy_init);
  auto stream = device->create_stream("compute");
  EXPECT_THROW(engine.step(0.1), InternalError);  // no micro-batch ran
  EXPECT_THROW(engine.release_params(1, stream.get()), InternalError);
  EXPECT_THROW(engine.acquire_grads(1, stream.get()), InternalError);  // outside a micro-batch
}

// A gathered group used by two streams is freed after both have passed their last use (the free
// waits on an event of the other stream, as PyTorch's record_stream), never while one still reads
// it: here stream A is held by a gate, and the free queued on B must wait for it.
TEST(ZeroEngine, AGatheredGroupUsedByTwoStreamsIsFreedAfterBoth) {
  SimDeviceOptions o;
  o.capacity_bytes = 16 << 20;
  auto device = make_sim_device(o);
  auto comm = make_local_communicator();
  TrainConfig c = toy_config(3, 1);
  c.zero.param_persistence_threshold_elems = 0;  // every group gathered and freed
  ZeroEngine engine(c, *device, *comm, testing_toy::toy_groups({}, DType::F32), testing_toy::toy_init);
  testing_sim::Gate gate;  // before the streams: they are joined (after the gate opens) first
  struct OpenAtExit {
    testing_sim::Gate& g;
    ~OpenAtExit() { g.open(); }
  } open_at_exit{gate};
  auto a = device->create_stream("a"), b = device->create_stream("b");
  const auto gathered_bytes = [&] {
    const MemoryStats s = device->memory_stats();
    const auto it = s.bytes_by_tag.find("param.gathered");
    return it == s.bytes_by_tag.end() ? std::size_t{0} : it->second;
  };
  launch_sim_kernel(*a, [&gate] { gate.wait(); });  // a's later work (its use of the group) waits
  engine.begin_micro_batch();
  engine.acquire_params(1, ParamPhase::Forward, a.get());
  engine.acquire_params(1, ParamPhase::Forward, b.get());
  engine.acquire_params(2, ParamPhase::Forward, b.get());
  engine.acquire_params(2, ParamPhase::Forward, a.get());
  const std::size_t held = gathered_bytes();  // both groups
  ASSERT_GT(held, 0u);
  engine.release_params(1, b.get());
  engine.release_params(1, a.get());  // last release: freed on a after b (a is held)
  engine.release_params(2, a.get());
  engine.release_params(2, b.get());  // last release on b: must wait for a
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // a premature free would show now
  EXPECT_EQ(gathered_bytes(), held) << "a gathered group was freed while stream a still had to use it";
  gate.open();
  a->synchronize();
  b->synchronize();
  EXPECT_EQ(gathered_bytes(), 0u);
  engine.end_micro_batch();
}

}  // namespace
}  // namespace strata
