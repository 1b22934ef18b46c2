// The run plan (plan/run_plan.h) against what the engine really allocates: for every stage,
// optimizer tier, parameter tier and precision, the bytes the tier planner sums over the plan are
// the bytes the engine holds on the device, in host arrays, in the swap store and in pinned pools
// once it is built; and after training, the most the host and NVMe tiers held is what the plan
// allowed for the gradient partial sums on top. Placement rules exist once (Note [Run plan] in plan/run_plan.h); this
// test is what keeps the planner and the engine from drifting apart.
#include <gtest/gtest.h>

#include <filesystem>

#include <string>

#include <fmt/format.h>

#include "core/device/device.h"
#include "plan/run_plan.h"
#include "plan/tier_plan.h"
#include "engine/zero_engine.h"
#include "tests/engine/toy_model.h"
#include "tests/offload/offload_test_util.h"

namespace strata {
namespace {

using testing_toy::ToyShape;

struct Case {
  int stage;
  OffloadDevice optimizer;
  OffloadDevice params;
  Precision precision;
};

std::string name(const Case& c) {
  return fmt::format("stage {} optimizer {} params {} {}", c.stage, offload_device_name(c.optimizer),
                     offload_device_name(c.params), precision_name(c.precision));
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (Precision p : {Precision::Fp32, Precision::Bf16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      out.push_back({stage, OffloadDevice::None, OffloadDevice::None, p});
      if (stage == 0) continue;
      for (OffloadDevice o : {OffloadDevice::Cpu, OffloadDevice::Nvme}) {
        out.push_back({stage, o, OffloadDevice::None, p});
        if (stage != 3) continue;
        for (OffloadDevice w : {OffloadDevice::Cpu, OffloadDevice::Nvme}) out.push_back({stage, o, w, p});
      }
    }
  }
  return out;
}

TrainConfig config_of(const Case& k, int accumulation, const std::string& dir) {
  TrainConfig c = testing_toy::toy_train_config(k.stage, accumulation);
  c.precision = k.precision;
  c.strata.exact = k.precision == Precision::Fp32;
  c.zero.param_persistence_threshold_elems = 100;  // the bias-only tail stays gathered; blocks are sharded
  if (k.optimizer != OffloadDevice::None) testing_toy::toy_offload(c, k.optimizer, k.params, dir);
  return c;
}

std::uint64_t tag_bytes(const Device& device, const std::string& prefix) {
  std::uint64_t bytes = 0;
  for (const auto& [tag, b] : device.memory_stats().bytes_by_tag) {
    if (tag.rfind(prefix, 0) == 0) bytes += b;
  }
  return bytes;
}

std::vector<std::pair<Case, int>> cases_by_accumulation() {
  std::vector<std::pair<Case, int>> out;
  for (const Case& k : all_cases()) {
    for (int accumulation : {1, 2}) out.emplace_back(k, accumulation);
  }
  return out;
}

class RunPlanTest : public ::testing::Test {
 protected:
  offload::testing::TempDir dir_;
};

TEST_F(RunPlanTest, EngineAllocatesWhatThePlanSums) {
  const ToyShape shape{64, 96, 3, 6};
  for (const auto& [k, accumulation] : cases_by_accumulation()) {
    SCOPED_TRACE(name(k) + " accumulation " + std::to_string(accumulation));
    const TrainConfig c = config_of(k, accumulation, dir_.path() + "/swap");
    const auto groups = testing_toy::toy_groups(shape, working_dtype_of(k.precision));
    const RunPlan plan = make_run_plan(c, groups, 1, 0);
    const TierPlan bytes = plan_tiers(plan, 1, 0);
    SimDeviceOptions d;
    d.capacity_bytes = 64 << 20;
    auto device = make_sim_device(d);
    auto comm = make_local_communicator();
    ZeroEngine engine(c, *device, *comm, groups, testing_toy::toy_init, plan);
    EXPECT_EQ(tag_bytes(*device, "optim."), bytes.device_optimizer);
    EXPECT_EQ(tag_bytes(*device, "param.w"), bytes.device_weights);
    // The step's gradient buffers live across steps (Note [Gradient buffers kept across steps] in
    // engine/state_home_device.cc): the plan's device gradient bytes.
    EXPECT_EQ(tag_bytes(*device, "grad."),
              plan.optimizer_offloaded() ? 0u : bytes.device_state - bytes.device_optimizer);
    const TierIoStats tiers = engine.tier_stats();
    EXPECT_EQ(tiers.host_bytes, bytes.host_arrays - bytes.host_gradients);
    EXPECT_EQ(tiers.nvme_bytes, bytes.nvme - bytes.nvme_gradients);
    EXPECT_EQ(engine.pinned_pool_bytes(), bytes.pinned);
    // Every case places something somewhere the plan names.
    EXPECT_GT(bytes.device_optimizer + bytes.host_arrays + bytes.nvme, 0u);
    EXPECT_EQ(bytes.nvme > 0, !plan.offload.nvme_dirs.empty());
    // The swap files take on disk exactly what the plan says they do.
    std::uint64_t on_disk = 0;
    for (const std::string& d : plan.offload.nvme_dirs) {
      const std::string swap = d + "/" + plan.offload.swap_file_name;
      if (std::filesystem::exists(swap)) on_disk += std::filesystem::file_size(swap);
    }
    EXPECT_EQ(on_disk, bytes.nvme_files);
    EXPECT_GE(bytes.nvme_files, bytes.nvme);
  }
}

TEST_F(RunPlanTest, TiersDuringTrainingStayInsideThePlan) {
  const ToyShape shape{64, 96, 3, 6};
  for (int accumulation : {1, 3, 4}) {
    for (bool exact : {true, false}) {
      for (const Case& k : all_cases()) {
        if (k.precision != Precision::Fp32 || k.optimizer == OffloadDevice::None) continue;
        SCOPED_TRACE(fmt::format("{}, {} micro-batches, exact {}", name(k), accumulation, exact));
        TrainConfig c = config_of(k, accumulation, dir_.path() + "/swap");
        c.strata.exact = exact;
        const TierPlan bytes = plan_tiers(c, testing_toy::toy_groups(shape, DType::F32), 1, 0);
        testing_toy::ToyRunOptions o;
        o.shape = shape;
        o.steps = 2;
        const testing_toy::ToyRun r = testing_toy::run_toy_local(c, o);
        // The gradient partial sums come and go inside a step, on top of the resident state.
        EXPECT_LE(r.tiers.peak_host_bytes, bytes.host_arrays);
        const std::uint64_t host_resident = bytes.host_arrays - bytes.host_gradients;
        if (bytes.host_gradients > 0) {
          EXPECT_GT(r.tiers.peak_host_bytes, host_resident);
        }
        if (bytes.nvme_gradients > 0) {
          EXPECT_GT(r.tiers.peak_nvme_bytes, bytes.nvme - bytes.nvme_gradients);
        }
        if (!exact) {  // fast mode keeps one accumulator: the plan is exact there
          EXPECT_EQ(r.tiers.peak_host_bytes, bytes.host_arrays);
          EXPECT_EQ(r.tiers.peak_nvme_bytes, bytes.nvme);
        }
        EXPECT_LE(r.tiers.peak_nvme_bytes, bytes.nvme);
        EXPECT_EQ(r.tiers.nvme_bytes, bytes.nvme - bytes.nvme_gradients);  // gradients dropped after the step
        EXPECT_EQ(r.tiers.host_bytes, bytes.host_arrays - bytes.host_gradients);
      }
    }
  }
}

}  // namespace
}  // namespace strata
