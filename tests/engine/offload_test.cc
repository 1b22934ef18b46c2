// The ZeRO engine with its state on host memory and NVMe (engine/zero_engine.h, Note [Offload] in
// engine/zero_engine.h): exact mode gives weights bit-identical to the in-memory run for every tier combination, stage,
// accumulation, with the waiting and the backward-overlapped update; the tiers really hold the state
// (device bytes fall, NVMe bytes move, host arrays stay empty when everything is on NVMe); bad
// configs are refused with the numbers. The multi-rank matrix is in engine_mpi_main.cc.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include <fstream>
#include <string>

#include "core/error.h"
#include "engine/zero_engine.h"
#include "tests/engine/toy_model.h"
#include "tests/offload/offload_test_util.h"

namespace strata {
namespace {

using testing_toy::ToyRun;
using testing_toy::ToyShape;

// Wide enough that a block's 256x256 weight spans several 16 Ki-element chunks.
ToyShape wide_toy() {
  ToyShape s;
  s.dim = 256;
  s.vocab = 64;
  s.layers = 2;
  s.tokens = 4;
  return s;
}

ToyRun run(const TrainConfig& config, int steps, bool prepare = false, bool declare_ready = true) {
  testing_toy::ToyRunOptions options;
  options.steps = steps;
  options.shape = wide_toy();
  options.prepare_step = prepare;
  options.declare_ready = declare_ready;
  return testing_toy::run_toy_local(config, options);
}

TrainConfig config(int stage, int accumulation) {
  TrainConfig c = testing_toy::toy_train_config(stage, accumulation);
  c.zero.param_persistence_threshold_elems = 0;
  c.optimizer.lr = 2e-3;
  return c;
}

const char* name(OffloadDevice d) { return d == OffloadDevice::Nvme ? "nvme" : d == OffloadDevice::Cpu ? "cpu" : "none"; }

class EngineOffload : public ::testing::Test {
 protected:
  void SetUp() override { STRATA_SKIP_WITHOUT_DIRECT_IO(dir_.path()); }
  offload::testing::TempDir dir_;
};

TEST_F(EngineOffload, ExactWeightsMatchTheInMemoryRunForEveryTierAndStage) {
  for (int accumulation : {1, 3, 4}) {
    const ToyRun reference = run(config(0, accumulation), 4);
    for (int stage : {1, 2, 3}) {
      for (OffloadDevice opt : {OffloadDevice::Cpu, OffloadDevice::Nvme}) {
        for (OffloadDevice param : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}) {
          if (param != OffloadDevice::None && stage != 3) continue;
          TrainConfig c = config(stage, accumulation);
          testing_toy::toy_offload(c, opt, param, dir_.path());
          const ToyRun r = run(c, 4);
          const std::string what = std::string("stage ") + std::to_string(stage) + " accumulation " +
                                   std::to_string(accumulation) + " optimizer " + name(opt) + " params " + name(param);
          EXPECT_EQ(testing_toy::count_weight_differences(r, reference), 0u) << what;
          EXPECT_EQ(r.losses, reference.losses) << what;
          EXPECT_GT(r.chunk_updates, 0u) << what;
          EXPECT_EQ(r.overlapped_updates, 0u) << what << ": gradient clipping is on, the update must wait";
          if (opt == OffloadDevice::Nvme) {
            EXPECT_GT(r.tiers.nvme_bytes_written, 0u) << what;
            EXPECT_GT(r.tiers.nvme_bytes_read, 0u) << what;
          }
        }
      }
    }
  }
}

TEST_F(EngineOffload, DeclaredGradsReadyCallsGiveTheSameBits) {
  TrainConfig c = config(3, 2);
  testing_toy::toy_offload(c, OffloadDevice::Nvme, OffloadDevice::Nvme, dir_.path());
  const ToyRun learned = run(c, 3, false, /*declare_ready=*/false);
  const ToyRun declared = run(c, 3, false, /*declare_ready=*/true);
  EXPECT_EQ(testing_toy::count_weight_differences(learned, declared), 0u);
  EXPECT_EQ(learned.losses, declared.losses);
}

TEST_F(EngineOffload, OverlappedUpdateGivesTheSameBitsAndRunsDuringBackward) {
  for (int accumulation : {1, 2}) {
    TrainConfig plain = config(3, accumulation);
    plain.gradient_clipping = 0;  // the update no longer depends on the whole step
    const ToyRun reference = run(plain, 4);
    for (OffloadDevice opt : {OffloadDevice::Cpu, OffloadDevice::Nvme}) {
      for (OffloadDevice param : {OffloadDevice::None, OffloadDevice::Nvme}) {
        TrainConfig c = plain;
        testing_toy::toy_offload(c, opt, param, dir_.path());
        const ToyRun overlapped = run(c, 4, /*prepare=*/true);
        const std::string what = std::string("accumulation ") + std::to_string(accumulation) + " optimizer " +
                                 name(opt) + " params " + name(param);
        EXPECT_EQ(testing_toy::count_weight_differences(overlapped, reference), 0u) << what;
        EXPECT_EQ(overlapped.overlapped_updates, overlapped.chunk_updates) << what;
        EXPECT_GT(overlapped.overlapped_updates, 0u) << what;
        // Without prepare_step the engine cannot know the lr early, and waits.
        const ToyRun waiting = run(c, 4, /*prepare=*/false);
        EXPECT_EQ(waiting.overlapped_updates, 0u) << what;
        EXPECT_EQ(testing_toy::count_weight_differences(waiting, reference), 0u) << what;
      }
    }
  }
}

TEST_F(EngineOffload, StateLeavesTheDeviceAndAllNvmeKeepsHostArraysEmpty) {
  const ToyRun resident = run(config(3, 1), 2);
  TrainConfig c = config(3, 1);
  testing_toy::toy_offload(c, OffloadDevice::Nvme, OffloadDevice::Nvme, dir_.path());
  const ToyRun nvme = run(c, 2);
  EXPECT_LT(nvme.state_bytes * 4, resident.state_bytes)
      << "device model-state bytes: " << nvme.state_bytes << " offloaded vs " << resident.state_bytes;
  EXPECT_EQ(nvme.tiers.peak_host_bytes, 0u) << "all state on NVMe must not keep host arrays";
  EXPECT_GT(nvme.tiers.peak_nvme_bytes, 0u);
  // 4 optimizer slots of the 4 MiB budget and 4 parameter slots, each rounded up to whole 2 MiB pages.
  EXPECT_LE(nvme.pinned_pool_bytes, std::size_t{8} * (2u << 20)) << "pinned staging beyond the configured budget";

  // The optimizer's pinned pool does not grow with the model. (Two engines alive at once: each
  // needs its own swap directory, as two runs do: Note [Run locks] in core/run_lock.h.)
  TrainConfig bigger = c;
  testing_toy::toy_offload(bigger, OffloadDevice::Nvme, OffloadDevice::Nvme, dir_.path() + "/deep");
  SimDeviceOptions o;
  o.capacity_bytes = 64 << 20;
  auto device = make_sim_device(o);
  auto comm = make_local_communicator();
  ToyShape deep = wide_toy();
  deep.layers = 6;
  ZeroEngine small_engine(c, *device, *comm, testing_toy::toy_groups(wide_toy(), DType::F32), testing_toy::toy_init);
  ZeroEngine deep_engine(bigger, *device, *comm, testing_toy::toy_groups(deep, DType::F32), testing_toy::toy_init);
  EXPECT_EQ(small_engine.pinned_pool_bytes(), deep_engine.pinned_pool_bytes());
  EXPECT_GT(deep_engine.tier_stats().nvme_bytes, small_engine.tier_stats().nvme_bytes);
}

TEST_F(EngineOffload, CpuOffloadHoldsStateInHostMemory) {
  TrainConfig c = config(2, 1);
  testing_toy::toy_offload(c, OffloadDevice::Cpu, OffloadDevice::None, dir_.path());
  const ToyRun r = run(c, 2);
  EXPECT_GT(r.tiers.peak_host_bytes, 0u);
  EXPECT_EQ(r.tiers.nvme_bytes_written, 0u);
}

TEST_F(EngineOffload, NonFiniteGradientsSkipWhenWaitingAndFailClearlyWhenOverlapped) {
  // A learning rate that blows the weights up: the gradients turn non-finite within a few steps.
  TrainConfig waiting = config(3, 1);
  waiting.optimizer.lr = 1e30;
  waiting.optimizer.type = "SGD";
  waiting.gradient_clipping = 0;
  testing_toy::toy_offload(waiting, OffloadDevice::Nvme, OffloadDevice::None, dir_.path());
  const ToyRun r = run(waiting, 6);
  EXPECT_GT(r.skipped_steps, 0) << "the toy never produced a non-finite gradient; the test needs another trigger";
  try {
    run(waiting, 6, /*prepare=*/true);
    FAIL() << "an overlapped step with non-finite gradients passed silently";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite gradients"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("overlap_optimizer"), std::string::npos) << e.what();
  }
}

TEST_F(EngineOffload, BadOffloadConfigsAreRefusedWithTheNumbers) {
  auto device = make_sim_device(SimDeviceOptions{});
  auto comm = make_local_communicator();
  auto groups = testing_toy::toy_groups(wide_toy(), DType::F32);
  auto expect_refused = [&](const TrainConfig& c, const std::string& needle) {
    try {
      ZeroEngine engine(c, *device, *comm, groups, testing_toy::toy_init);
      ADD_FAILURE() << "accepted; expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TrainConfig c = config(3, 1);
  testing_toy::toy_offload(c, OffloadDevice::Nvme, OffloadDevice::Nvme, dir_.path());
  TrainConfig tiny_pool = c;
  tiny_pool.strata.offload.pinned_buffer_bytes = 1 << 20;
  tiny_pool.zero.offload_optimizer.buffer_count = 8;
  expect_refused(tiny_pool, "strata.offload.pinned_buffer");
  TrainConfig small_param_buffer = c;
  small_param_buffer.zero.offload_param.buffer_size_elems = 1000;
  expect_refused(small_param_buffer, "offload_param.buffer_size");
  // A missing nvme_path is created, its last component only; one that cannot be (its parent is a
  // file) is an error naming it, and so is a path whose parent is missing too (a typo must not grow
  // a chain of directories).
  { std::ofstream(dir_.path() + "/a-file") << "x"; }
  TrainConfig bad_dir = c;
  bad_dir.zero.offload_optimizer.nvme_paths = {dir_.path() + "/a-file/swap"};
  bad_dir.zero.offload_param.nvme_paths = bad_dir.zero.offload_optimizer.nvme_paths;
  expect_refused(bad_dir, "a-file/swap");
  TrainConfig chain = c;
  chain.zero.offload_optimizer.nvme_paths = {dir_.path() + "/typo/swap"};
  chain.zero.offload_param.nvme_paths = chain.zero.offload_optimizer.nvme_paths;
  expect_refused(chain, "creates only the last component");
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/typo"));
  TrainConfig new_dir = c;
  new_dir.zero.offload_optimizer.nvme_paths = {dir_.path() + "/created"};
  new_dir.zero.offload_param.nvme_paths = new_dir.zero.offload_optimizer.nvme_paths;
  EXPECT_NO_THROW(ZeroEngine(new_dir, *device, *comm, groups, testing_toy::toy_init));
}

TEST_F(EngineOffload, TwoEnginesOnOneSwapFileAreRefusedNamingTheHolder) {
  // See Note [Run locks] in core/run_lock.h.
  // The second would truncate the first one's swap file under it.
  auto device = make_sim_device(SimDeviceOptions{});
  auto comm = make_local_communicator();
  auto groups = testing_toy::toy_groups(wide_toy(), DType::F32);
  TrainConfig c = config(3, 1);
  testing_toy::toy_offload(c, OffloadDevice::Nvme, OffloadDevice::None, dir_.path());
  {
    ZeroEngine first(c, *device, *comm, groups, testing_toy::toy_init);
    try {
      ZeroEngine second(c, *device, *comm, groups, testing_toy::toy_init);
      ADD_FAILURE() << "a second engine on the same swap file was accepted";
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("in use by another run"), std::string::npos) << m;
      EXPECT_NE(m.find("pid " + std::to_string(::getpid())), std::string::npos) << m;
      EXPECT_NE(m.find("strata-swap-rank0.bin"), std::string::npos) << m;
    }
  }
  // Released with the first engine: the next one starts.
  EXPECT_NO_THROW(ZeroEngine(c, *device, *comm, groups, testing_toy::toy_init));
}

TEST(EngineOffloadConfig, ParamOffloadNeedsOptimizerOffload) {
  nlohmann::json j = {{"zero_optimization", {{"stage", 3}, {"offload_param", {{"device", "cpu"}}}}}};
  try {
    parse_train_config(j, "t.json");
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("offload_optimizer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata
