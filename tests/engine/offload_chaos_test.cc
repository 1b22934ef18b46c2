// The host-driven offload pipeline (Note [Host-driven offload] in docs/DESIGN.md) under schedule
// chaos (Note [Schedule chaos] in core/device/schedule_chaos.h): every stream task and every offload
// host task starts after a seeded random pause, so orders that two idle cores rarely produce
// (a reduction finishing late, a copy up overtaken by the next gather, a slot's event completing
// after the next reservation) are tried. Over the offload configurations (optimizer on host or
// NVMe, parameters on the device, host or NVMe, the optimizer spilled across host and NVMe, 1 and
// 4 micro-batches, the update overlapped with backward or not), each seed must give the bits of
// the plain in-memory run, with a watchdog that names the configuration and seed of a hang.
// STRATA_CHAOS_SEEDS sets the seeds per configuration (default 8 here; the longer run is in
// docs/MEASUREMENTS.md, "Offload under schedule chaos"). The world-2 runs are engine_mpi's chaos
// variant. And the harness can fail: the same pipeline with the host's event wait left out reads
// stale gradients within a few seeds.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/device/device.h"
#include "core/device/sim_kernel.h"
#include "engine/host_executor.h"
#include "plan/run_plan.h"
#include "plan/tier_plan.h"
#include "engine/zero_engine.h"
#include "tests/core/sim_device_test_util.h"
#include "tests/engine/toy_model.h"
#include "tests/offload/offload_test_util.h"

namespace strata {
namespace {

using testing_sim::HangWatchdog;
using testing_toy::ToyRun;

constexpr std::size_t kElems = 1 << 14;  // AMissingEventWaitIsCaught's gradient

int seeds_per_config() {
  const char* v = std::getenv("STRATA_CHAOS_SEEDS");
  if (v == nullptr) return 8;
  const int n = std::atoi(v);
  return n > 0 ? n : 8;
}

struct ChaosCase {
  OffloadDevice optimizer;
  OffloadDevice params;  // None: the parameters stay on the device
  bool spill;            // the optimizer's arrays split between host and NVMe
  int accumulation;
  bool overlap;  // no clipping: the update runs during backward

  std::string name() const {
    const auto dev = [](OffloadDevice d) {
      return d == OffloadDevice::None ? "device" : d == OffloadDevice::Cpu ? "cpu" : "nvme";
    };
    return fmt::format("optimizer {}{}, params {}, {} micro-batch(es), overlap {}", dev(optimizer),
                       spill ? " spilled" : "", dev(params), accumulation, overlap ? "on" : "off");
  }
};

TrainConfig chaos_config(const ChaosCase& k, const std::string& dir, const std::vector<ParamGroupSpec>& groups) {
  TrainConfig c = testing_toy::toy_train_config(3, k.accumulation);
  c.zero.param_persistence_threshold_elems = 0;
  c.optimizer.lr = 2e-3;
  if (k.overlap) c.gradient_clipping = 0;
  testing_toy::toy_offload(c, k.optimizer, k.params, dir);
  c.zero.offload_param.buffer_count = 1;
  if (k.spill) {  // half of the optimizer's host arrays fit the budget; the rest go to NVMe
    c.zero.offload_optimizer.device = OffloadDevice::Auto;
    c.strata.offload.host_budget_auto = false;
    c.strata.offload.host_budget_bytes = 0;
    const TierPlan all_host = plan_tiers(make_run_plan(c, groups, 1, 0), 1, 0);
    c.strata.offload.host_budget_bytes = all_host.pinned + all_host.host_arrays / 2;
  }
  return c;
}

ToyRun run_with_chaos(TrainConfig c, std::uint64_t seed, const testing_toy::ToyRunOptions& o) {
  c.strata.device.chaos_seed = seed;  // the offload host thread
  SimDeviceOptions d;
  d.capacity_bytes = 64 << 20;
  d.chaos_seed = seed;  // every stream task
  d.chaos_max_us = 150;
  auto device = make_sim_device(d);
  auto comm = make_local_communicator();
  return testing_toy::run_toy_engine(c, *device, *comm, o);
}

class OffloadChaos : public ::testing::Test {
 protected:
  void SetUp() override { STRATA_SKIP_WITHOUT_DIRECT_IO(dir_.path()); }
  offload::testing::TempDir dir_;
};

TEST_F(OffloadChaos, EverySeedGivesTheInMemoryBits) {
  testing_toy::ToyRunOptions o;
  o.steps = 3;
  o.shape.dim = 160;  // several chunks per group, so the pipeline has chunks in flight
  o.shape.layers = 3;
  const std::vector<ParamGroupSpec> groups = testing_toy::toy_groups(o.shape, DType::F32);
  std::vector<ChaosCase> cases;
  for (const int accumulation : {1, 4}) {
    for (const bool overlap : {true, false}) {
      for (const OffloadDevice optimizer : {OffloadDevice::Cpu, OffloadDevice::Nvme}) {
        for (const OffloadDevice params : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}) {
          cases.push_back(ChaosCase{optimizer, params, false, accumulation, overlap});
        }
      }
      cases.push_back(ChaosCase{OffloadDevice::Cpu, OffloadDevice::Nvme, true, accumulation, overlap});
    }
  }
  const int seeds = seeds_per_config();
  int runs = 0;
  for (const ChaosCase& k : cases) {
    TrainConfig plain = testing_toy::toy_train_config(0, k.accumulation);
    plain.optimizer.lr = 2e-3;
    if (k.overlap) plain.gradient_clipping = 0;
    o.prepare_step = k.overlap;
    const ToyRun reference = testing_toy::run_toy_local(plain, o);
    const TrainConfig c = chaos_config(k, dir_.path(), groups);
    if (k.spill) {
      const OffloadPlan& op = make_run_plan(c, groups, 1, 0).offload;
      ASSERT_GT(op.spilled_state_chunks, 0u) << k.name();  // state on NVMe, and state or sums on the host
      ASSERT_LT(std::min(op.spilled_state_chunks, op.spilled_grad_chunks), op.state_chunks) << k.name();
    }
    for (int s = 1; s <= seeds; ++s) {
      const std::uint64_t seed = 1000u * static_cast<std::uint64_t>(runs + 1) + static_cast<std::uint64_t>(s);
      const std::string what = fmt::format("{}, chaos seed {}", k.name(), seed);
      HangWatchdog watchdog("OffloadChaos: " + what, std::chrono::seconds(120));
      const ToyRun r = run_with_chaos(c, seed, o);
      ASSERT_EQ(testing_toy::count_weight_differences(r, reference), 0u) << what;
      ASSERT_EQ(r.losses, reference.losses) << what;
      if (k.overlap) {
        EXPECT_EQ(r.overlapped_updates, r.chunk_updates) << what;
      }
    }
    ++runs;
  }
  RecordProperty("schedules", static_cast<int>(cases.size()) * seeds);
}

// The harness can fail: the offload pipeline's first hop (a reduction on the comm stream, then the
// host thread copies it down on the transfer stream and sums it) with the host's wait on the
// reduction's event left out reads stale or half-written gradients under chaos within a few seeds,
// and with the wait never does.
TEST(OffloadChaosHarness, AMissingEventWaitIsCaught) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the pipeline without its event wait races on purpose, which ThreadSanitizer reports";
#endif
  const auto stale_units = [&](bool wait, std::uint64_t seed) {
    SimDeviceOptions d;
    d.capacity_bytes = 64 << 20;
    d.chaos_seed = seed;
    d.chaos_max_us = 150;
    auto device = make_sim_device(d);
    auto comm = device->create_stream("comm");
    auto transfer = device->create_stream("transfer");
    HostBufferOptions po;
    po.pinner = device.get();
    HostBuffer staging = HostBuffer::allocate(kElems * sizeof(float), po);
    HostExecutor executor("chaos.check", seed);
    std::atomic<int> stale{0};
    for (int unit = 1; unit <= 8; ++unit) {
      auto reduced = std::make_shared<DeviceMemory>(device->allocate(kElems * sizeof(float), "reduced"));
      float* p = reduced->as<float>();
      launch_sim_kernel(*comm, [p, unit] {
        for (std::size_t i = 0; i < kElems; ++i) p[i] = static_cast<float>(unit);
      });
      std::shared_ptr<Event> done = device->create_event();
      comm->record(*done);
      executor.submit([&, reduced, done, unit, wait] {
        if (wait) done->synchronize();
        transfer->copy_d2h(staging.data(), reduced->data(), kElems * sizeof(float));
        transfer->synchronize();
        const float* h = staging.as<float>().data();
        if (h[0] != static_cast<float>(unit) || h[kElems - 1] != static_cast<float>(unit)) stale.fetch_add(1);
        done->synchronize();  // the buffer is freed only once the kernel writing it has run
        reduced->reset();
      });
    }
    executor.drain();
    comm->synchronize();
    return stale.load();
  };
  int caught = 0;
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    EXPECT_EQ(stale_units(true, seed), 0) << "seed " << seed;
    caught += stale_units(false, seed) > 0;
  }
  EXPECT_GT(caught, 0) << "chaos never exposed the missing wait in 10 seeds";
}

}  // namespace
}  // namespace strata
