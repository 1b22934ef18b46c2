// Spill across tiers (Note [Spill across tiers], plan/run_plan.cc): offload sections with device
// "auto" fill host memory up to strata.offload.host_budget and put the remaining chunks on NVMe.
// The planner's choices (parameters before optimizer state, the budget kept, refusals before any
// work), the engine holding exactly what the plan places, and the master test: a run whose state
// is split between host and NVMe gives the bits of the run that keeps everything on the device,
// with and without overlapped updates, at every accumulation, and through a checkpoint.
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>

#include "core/device/device.h"
#include "core/error.h"
#include "plan/run_plan.h"
#include "plan/tier_plan.h"
#include "engine/zero_engine.h"
#include "tests/engine/checkpoint_test_util.h"
#include "tests/engine/toy_model.h"
#include "tests/offload/offload_test_util.h"

namespace strata {
namespace {

using testing_toy::ToyRun;
using testing_toy::ToyShape;

ToyShape spill_shape() {
  ToyShape s;
  // A block's weight spans several 16 Ki-element chunks, and the shards together are several
  // times one pinned fetch slot (a whole 2 MiB huge page), so they can spill in part.
  s.dim = 384;
  s.vocab = 64;
  s.layers = 4;
  s.tokens = 4;
  return s;
}

// The pinned fetch slots of `c` with its parameters on NVMe (0 without parameter offload).
std::uint64_t fetch_slot_bytes(TrainConfig c, const std::vector<ParamGroupSpec>& groups) {
  if (c.zero.offload_param.device == OffloadDevice::None) return 0;
  c.strata.offload.host_budget_bytes = 0;
  const std::uint64_t host = make_run_plan(c, groups, 1, 0).offload.pinned_bytes();
  c.zero.offload_param.device = OffloadDevice::Nvme;
  return make_run_plan(c, groups, 1, 0).offload.pinned_bytes() - host;
}

// `c` with its offloaded sections on "auto" and a host budget that holds the pinned pools (with the
// fetch slots spilled parameters need) and about `fraction` of the host arrays the all-host plan
// would need.
// With `auto_params` false the parameters keep their tier and only the optimizer state spills.
TrainConfig spilled(TrainConfig c, const std::vector<ParamGroupSpec>& groups, double fraction = 0.5,
                    bool auto_params = true) {
  if (c.zero.offload_optimizer.device != OffloadDevice::None) c.zero.offload_optimizer.device = OffloadDevice::Auto;
  if (auto_params && c.zero.offload_param.device != OffloadDevice::None) {
    c.zero.offload_param.device = OffloadDevice::Auto;
  }
  c.strata.offload.host_budget_auto = false;
  c.strata.offload.host_budget_bytes = 0;  // no limit: everything on the host
  const TierPlan all_host = plan_tiers(make_run_plan(c, groups, 1, 0), 1, 0);
  c.strata.offload.host_budget_bytes = all_host.pinned + (auto_params ? fetch_slot_bytes(c, groups) : 0) +
                                       static_cast<std::uint64_t>(fraction * static_cast<double>(all_host.host_arrays));
  return c;
}

TrainConfig offloaded(int stage, int accumulation, bool params, const std::string& dir) {
  TrainConfig c = testing_toy::toy_train_config(stage, accumulation);
  c.zero.param_persistence_threshold_elems = 0;
  c.optimizer.lr = 2e-3;
  testing_toy::toy_offload(c, OffloadDevice::Cpu, params ? OffloadDevice::Cpu : OffloadDevice::None, dir);
  c.zero.offload_param.buffer_count = 1;
  return c;
}

class Spill : public ::testing::Test {
 protected:
  void SetUp() override { STRATA_SKIP_WITHOUT_DIRECT_IO(dir_.path()); }
  std::vector<ParamGroupSpec> groups_ = testing_toy::toy_groups(spill_shape(), DType::F32);
  offload::testing::TempDir dir_;
};

TEST_F(Spill, ExactBitsEqualTheDeviceRunWhateverIsSpilled) {
  struct Mode {
    int accumulation;
    bool clipping;  // off: the updates overlap backward
  };
  // In at least one run: some shards on the host and some on NVMe; every gradient sum on the host
  // with state on NVMe; the gradient sums split between the tiers.
  bool partial_params = false, grads_host_state_nvme = false, partial_grads = false;
  for (const Mode m : {Mode{1, true}, Mode{3, true}, Mode{2, false}}) {
    testing_toy::ToyRunOptions o;
    o.steps = 3;
    o.shape = spill_shape();
    o.prepare_step = !m.clipping;
    TrainConfig device_cfg = offloaded(1, m.accumulation, false, dir_.path());
    device_cfg.zero.offload_optimizer.device = OffloadDevice::None;
    if (!m.clipping) device_cfg.gradient_clipping = 0;
    const ToyRun reference = testing_toy::run_toy_local(device_cfg, o);
    for (int stage : {1, 2, 3}) {
      for (double fraction : {0.0, 0.02, 0.3, 0.7}) {
        TrainConfig c = spilled(offloaded(stage, m.accumulation, stage == 3, dir_.path()), groups_, fraction);
        if (!m.clipping) c.gradient_clipping = 0;
        const RunPlan plan = make_run_plan(c, groups_, 1, 0);
        const std::string what = fmt::format("stage {}, {} micro-batches, clipping {}, budget {:.0f}% of the arrays",
                                             stage, m.accumulation, m.clipping, 100 * fraction);
        const OffloadPlan& op = plan.offload;
        ASSERT_GT(op.spilled_state_chunks, 0u) << what;
        if (fraction >= 0.3) {  // something of the optimizer's chunks on each tier
          ASSERT_LT(std::min(op.spilled_state_chunks, op.spilled_grad_chunks), op.state_chunks) << what;
        }
        partial_params |= op.spilled_param_chunks > 0 && op.spilled_param_chunks < op.param_chunks;
        grads_host_state_nvme |= op.spilled_grad_chunks == 0 && op.spilled_state_chunks > 0;
        partial_grads |= op.spilled_grad_chunks > 0 && op.spilled_grad_chunks < op.state_chunks;
        const ToyRun r = testing_toy::run_toy_local(c, o);
        EXPECT_EQ(testing_toy::count_weight_differences(r, reference), 0u) << what;
        EXPECT_EQ(r.losses, reference.losses) << what;
        EXPECT_GT(r.tiers.peak_nvme_bytes, 0u) << what;
        EXPECT_EQ(r.tiers.peak_host_bytes > 0, plan_tiers(plan, 1, 0).host_arrays > 0) << what;
        if (!m.clipping) {
          EXPECT_GT(r.overlapped_updates, 0u) << what;
        }
      }
    }
  }
  EXPECT_TRUE(partial_params);
  EXPECT_TRUE(grads_host_state_nvme);
  EXPECT_TRUE(partial_grads);
}

TEST_F(Spill, ShardsThenGradientSumsThenStateTakeTheHost) {
  const TrainConfig all_host = spilled(offloaded(3, 2, true, dir_.path()), groups_, 1.0);
  const RunPlan whole = make_run_plan(all_host, groups_, 1, 0);
  EXPECT_EQ(whole.offload.spilled_state_chunks, 0u);
  EXPECT_EQ(whole.offload.spilled_grad_chunks, 0u);
  EXPECT_EQ(whole.offload.spilled_param_chunks, 0u);
  EXPECT_EQ(whole.offload.param_slot_count, 0u) << "no shard on NVMe: no fetch slots";
  EXPECT_FALSE(whole.state_on_nvme());

  const TierPlan t = plan_tiers(whole, 1, 0);
  std::uint64_t params = 0, grads = 0, state = 0;
  for (const GroupPlan& G : whole.groups) {
    for (const StateChunk& ch : G.chunks) {
      params += whole.host_param_bytes(ch);
      grads += whole.host_gradient_bytes(ch);
      state += whole.host_state_bytes(ch);
    }
  }
  ASSERT_EQ(params + grads + state, t.host_arrays);
  const auto placed_with = [&](std::uint64_t budget) {
    TrainConfig c = all_host;
    c.strata.offload.host_budget_bytes = budget;
    const RunPlan plan = make_run_plan(c, groups_, 1, 0);
    EXPECT_LE(plan_tiers(plan, 1, 0).host_total(), budget);
    EXPECT_GT(plan_tiers(plan, 1, 0).nvme, 0u);
    return plan;
  };
  // Room for the pools, every shard, every gradient sum and half the state: only state spills.
  const RunPlan half_state = placed_with(t.pinned + params + grads + state / 2);
  EXPECT_EQ(half_state.offload.spilled_param_chunks, 0u);
  EXPECT_EQ(half_state.offload.spilled_grad_chunks, 0u);
  EXPECT_GT(half_state.offload.spilled_state_chunks, 0u);
  EXPECT_LT(half_state.offload.spilled_state_chunks, half_state.offload.state_chunks);
  EXPECT_TRUE(half_state.state_on_nvme());
  EXPECT_FALSE(half_state.grads_on_nvme());
  // Room for the shards and half the gradient sums: the rest of the sums and all the state spill.
  const RunPlan half_grads = placed_with(t.pinned + params + grads / 2);
  EXPECT_EQ(half_grads.offload.spilled_param_chunks, 0u);
  EXPECT_GT(half_grads.offload.spilled_grad_chunks, 0u);
  EXPECT_LT(half_grads.offload.spilled_grad_chunks, half_grads.offload.state_chunks);
  EXPECT_EQ(half_grads.offload.spilled_state_chunks, half_grads.offload.state_chunks);
  TrainConfig c = all_host;

  // Less room than the shards: some shards spill too, and the budget pays their fetch slots first.
  const std::uint64_t fetch_slots = fetch_slot_bytes(all_host, groups_);
  ASSERT_GT(fetch_slots, 0u);
  ASSERT_LT(fetch_slots, params);
  c.strata.offload.host_budget_bytes = t.pinned + fetch_slots + (params - fetch_slots) / 2;
  const RunPlan tight = make_run_plan(c, groups_, 1, 0);
  EXPECT_GT(tight.offload.spilled_param_chunks, 0u);
  EXPECT_LT(tight.offload.spilled_param_chunks, tight.offload.param_chunks);
  EXPECT_EQ(tight.offload.spilled_state_chunks, tight.offload.state_chunks);
  EXPECT_GT(tight.offload.param_slot_count, 0u);
  EXPECT_LE(plan_tiers(tight, 1, 0).host_total(), c.strata.offload.host_budget_bytes);

  // A budget that cannot pay the fetch slots spilling needs is refused, naming them.
  c.strata.offload.host_budget_bytes = t.pinned + fetch_slots / 2;
  try {
    make_run_plan(c, groups_, 1, 0);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("offload_param.buffer_count"), std::string::npos) << e.what();
  }
}

TEST_F(Spill, TheEngineHoldsWhatThePlanPlaces) {
  for (int stage : {2, 3}) {
    const TrainConfig c = spilled(offloaded(stage, 2, stage == 3, dir_.path()), groups_, 0.5);
    const RunPlan plan = make_run_plan(c, groups_, 1, 0);
    const TierPlan bytes = plan_tiers(plan, 1, 0);
    ASSERT_GT(plan.offload.spilled_state_chunks, 0u);
    SimDeviceOptions d;
    d.capacity_bytes = 64 << 20;
    auto device = make_sim_device(d);
    auto comm = make_local_communicator();
    ZeroEngine engine(c, *device, *comm, groups_, testing_toy::toy_init, plan);
    const TierIoStats tiers = engine.tier_stats();
    EXPECT_EQ(tiers.host_bytes, bytes.host_arrays - bytes.host_gradients) << "stage " << stage;
    EXPECT_EQ(tiers.nvme_bytes, bytes.nvme - bytes.nvme_gradients) << "stage " << stage;
    EXPECT_EQ(engine.pinned_pool_bytes(), bytes.pinned) << "stage " << stage;
  }
}

TEST_F(Spill, ACheckpointMovesBetweenSpilledAndUnspilledRuns) {
  using testing_checkpoint::ToyTrainer;
  const auto groups = testing_toy::toy_groups(testing_checkpoint::shape(), DType::F32);
  TrainConfig host = testing_checkpoint::config(3);
  testing_toy::toy_offload(host, OffloadDevice::Cpu, OffloadDevice::Cpu, dir_.sub("swap"));
  const TrainConfig split = spilled(host, groups, 0.4, /*auto_params=*/false);
  ASSERT_GT(make_run_plan(split, groups, 1, 0).offload.spilled_state_chunks, 0u);
  const ToyRun reference = testing_checkpoint::uninterrupted(testing_checkpoint::config(0));
  for (const auto& [from, into] : {std::pair{split, host}, std::pair{host, split}}) {
    const std::string parent = dir_.sub(fmt::format("ckpt{}", from.zero.offload_optimizer.device == OffloadDevice::Auto));
    {
      ToyTrainer first(from);
      first.train(0, testing_checkpoint::kSaveAt);
      first.save(parent, testing_checkpoint::kSaveAt);
    }
    ToyTrainer second(into);
    second.load(parent);
    second.train(testing_checkpoint::kSaveAt, testing_checkpoint::kSteps);
    EXPECT_EQ(testing_toy::count_weight_differences(second.weights(), reference), 0u)
        << (from.zero.offload_optimizer.device == OffloadDevice::Auto ? "spilled -> host" : "host -> spilled");
  }
}

TEST_F(Spill, SpillingWithoutAnNvmePathIsRefusedBeforeAnyWork) {
  TrainConfig c = spilled(offloaded(2, 1, false, dir_.path()), groups_, 0.5);
  c.zero.offload_optimizer.nvme_paths.clear();
  c.zero.offload_param.nvme_paths.clear();
  try {
    make_run_plan(c, groups_, 1, 0);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("strata.offload.host_budget"), std::string::npos) << m;
    EXPECT_NE(m.find("zero_optimization.offload_optimizer.nvme_path"), std::string::npos) << m;
  }
  // The same budget with room for everything needs no directory.
  c.strata.offload.host_budget_bytes = 1ull << 40;
  EXPECT_EQ(make_run_plan(c, groups_, 1, 0).offload.spilled_state_chunks, 0u);
}

TEST_F(Spill, AnExplicitBudgetBelowTheCpuArraysIsRefused) {
  TrainConfig c = offloaded(2, 1, false, dir_.path());
  c.strata.offload.host_budget_auto = false;
  c.strata.offload.host_budget_bytes = 1 << 20;
  try {
    make_run_plan(c, groups_, 1, 0);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("strata.offload.host_budget = 1.00 MiB but the pinned staging pools take"), std::string::npos) << e.what();
  }
}

TEST_F(Spill, AutoKeepsStateOnTheDeviceWhenTheDeviceHoldsIt) {
  TrainConfig c = offloaded(3, 1, true, dir_.path());
  c.zero.offload_optimizer.device = OffloadDevice::Auto;
  c.zero.offload_param.device = OffloadDevice::Auto;
  HostFacts host;
  host.mem_available = 8ull << 30;
  const Placement roomy = resolve_placement(c, groups_, 1, 0, 1ull << 30, host);
  EXPECT_EQ(roomy.config.zero.offload_param.device, OffloadDevice::None);
  EXPECT_EQ(roomy.config.zero.offload_optimizer.device, OffloadDevice::None);
  EXPECT_EQ(roomy.config.strata.offload.host_budget_bytes, 6ull << 30) << "3/4 of MemAvailable";
  ASSERT_EQ(roomy.why.size(), 3u);  // the budget, the weights, the optimizer state

  // A device that holds the working weights but not the fp32 state: the state goes to the host.
  TrainConfig weights_on_device = c;
  weights_on_device.zero.offload_param.device = OffloadDevice::None;
  const std::uint64_t need = plan_tiers(make_run_plan(weights_on_device, groups_, 1, 0), 1, 0).device_total();
  const std::uint64_t everything = plan_tiers(make_run_plan(roomy.config, groups_, 1, 0), 1, 0).device_total();
  const std::uint64_t between = need * 10 / 9 + 4096;
  ASSERT_LT(between * 9 / 10, everything);
  const Placement middle = resolve_placement(c, groups_, 1, 0, between, host);
  EXPECT_EQ(middle.config.zero.offload_param.device, OffloadDevice::None);
  EXPECT_EQ(middle.config.zero.offload_optimizer.device, OffloadDevice::Auto);

  // A tiny device: both stay offloaded.
  const Placement tight = resolve_placement(c, groups_, 1, 0, 64 << 10, host);
  EXPECT_EQ(tight.config.zero.offload_param.device, OffloadDevice::Auto);
  EXPECT_EQ(tight.config.zero.offload_optimizer.device, OffloadDevice::Auto);
  EXPECT_NE(tight.why.back().find("offloaded"), std::string::npos) << tight.why.back();
}

TEST_F(Spill, TheAutoBudgetSharesMemAvailableAndLeavesTheSimDevice) {
  HostFacts h;
  h.mem_available = 16ull << 30;
  h.ranks_on_node = 4;
  EXPECT_EQ(auto_host_budget(h), 3ull << 30);
  h.device_in_host = 1ull << 30;
  EXPECT_EQ(auto_host_budget(h), 2ull << 30);
  h.device_in_host = 100ull << 30;
  EXPECT_EQ(auto_host_budget(h), 64ull << 20) << "never below 64 MiB";
}

}  // namespace
}  // namespace strata
