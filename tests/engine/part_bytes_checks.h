// The engine's parts against the plan's byte functions (see Note [Part bytes] in
// plan/part_bytes.h), allocation by allocation, for one rank of any world: the engine is built on a
// device that logs every allocation's tag and size, trains the toy model for two steps, and each
// part's allocations must be exactly what the plan's functions say (the resident weights, the
// device state and its gradient buffers once, at construction; every micro-batch's gradient and
// reduction, every gathered copy and fetched shard at their sizes), the tier planner's sums must be
// the sums of those allocations, and the tiered home's host arrays, swap store and pinned pools
// the plan's. Used by tests/engine/part_bytes_test.cc (world 1) and
// tests/engine/part_bytes_mpi_main.cc (worlds 2 and 4, under mpirun). check_at_plan trains and
// exports on a device capped at the plan's figure.
#pragma once

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/device/device.h"
#include "core/error.h"
#include "engine/zero_engine.h"
#include "plan/part_bytes.h"
#include "plan/tier_plan.h"
#include "tests/engine/toy_model.h"

namespace strata::testing_parts {

// A Device that hands every call to another and logs each allocation's tag and size. With a cap,
// an allocation that would take the inner device's live bytes past it fails as the device itself
// would (OutOfMemoryError), so a run can be held to a figure from some point on.
class AllocationLog final : public Device {
 public:
  explicit AllocationLog(Device& inner) : inner_(inner) {}
  DeviceKind kind() const override { return inner_.kind(); }
  std::string name() const override { return inner_.name(); }
  std::size_t capacity_bytes() const override { return inner_.capacity_bytes(); }
  DeviceMemory allocate(std::size_t bytes, std::string_view tag) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    const std::uint64_t live = inner_.memory_stats().allocated_bytes;
    const std::uint64_t rounded = (bytes + kDeviceGranuleBytes - 1) / kDeviceGranuleBytes * kDeviceGranuleBytes;
    if (cap_ > 0 && live + rounded > cap_) {
      throw OutOfMemoryError(fmt::format("{} bytes for '{}' on top of {} live: over the cap of {}", bytes, tag, live, cap_));
    }
    DeviceMemory m = inner_.allocate(bytes, tag);
    log_.emplace_back(std::string(tag), bytes);
    return m;
  }
  void cap(std::uint64_t bytes) {
    const std::lock_guard<std::mutex> lock(mutex_);
    cap_ = bytes;
  }
  MemoryStats memory_stats() const override { return inner_.memory_stats(); }
  void reset_peak_stats() override { inner_.reset_peak_stats(); }
  std::unique_ptr<Stream> create_stream(std::string_view name) override { return inner_.create_stream(name); }
  std::unique_ptr<Event> create_event() override { return inner_.create_event(); }
  void pin_host(void* ptr, std::size_t bytes) override { inner_.pin_host(ptr, bytes); }
  void unpin_host(void* ptr) noexcept override { inner_.unpin_host(ptr); }

  // Every allocation so far, in order: (tag, bytes).
  std::vector<std::pair<std::string, std::uint64_t>> log() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return log_;
  }

 private:
  Device& inner_;
  mutable std::mutex mutex_;
  std::vector<std::pair<std::string, std::uint64_t>> log_;
  std::uint64_t cap_ = 0;  // 0: none
};

struct PartCase {
  int stage = 0;
  OffloadDevice optimizer = OffloadDevice::None;
  OffloadDevice params = OffloadDevice::None;
  int accumulation = 1;
  bool exact = true;
  Precision precision = Precision::Fp32;  // bf16 cases are checked at construction only
};

inline std::string case_name(const PartCase& k) {
  return fmt::format("stage {} optimizer {} params {}, {} micro-batches, {} {}", k.stage,
                     offload_device_name(k.optimizer), offload_device_name(k.params), k.accumulation,
                     k.exact ? "exact" : "fast", precision_name(k.precision));
}

// Stages 0-3; the optimizer on the device, host memory or NVMe (stage 3: the parameters too); one
// and two micro-batches per step, exact and fast sums; bf16's working-dtype buffers.
inline std::vector<PartCase> part_cases() {
  std::vector<std::pair<OffloadDevice, OffloadDevice>> tiers = {{OffloadDevice::None, OffloadDevice::None},
                                                                {OffloadDevice::Cpu, OffloadDevice::None},
                                                                {OffloadDevice::Nvme, OffloadDevice::None}};
  std::vector<PartCase> out;
  for (int stage = 0; stage <= 3; ++stage) {
    auto homes = tiers;
    if (stage == 0) homes.resize(1);
    if (stage == 3) {
      homes.emplace_back(OffloadDevice::Cpu, OffloadDevice::Cpu);
      homes.emplace_back(OffloadDevice::Nvme, OffloadDevice::Nvme);
    }
    for (const auto& [optimizer, params] : homes) {
      out.push_back({stage, optimizer, params, 1, true, Precision::Fp32});
      out.push_back({stage, optimizer, params, 2, true, Precision::Fp32});
      out.push_back({stage, optimizer, params, 2, false, Precision::Fp32});
      out.push_back({stage, optimizer, params, 1, false, Precision::Bf16});
    }
  }
  return out;
}

inline TrainConfig part_config(const PartCase& k, const std::string& swap_dir) {
  TrainConfig c = testing_toy::toy_train_config(k.stage, k.accumulation);
  c.strata.exact = k.exact;
  c.precision = k.precision;
  c.zero.param_persistence_threshold_elems = 100;  // the blocks are gathered, the small tail stays
  if (k.optimizer != OffloadDevice::None) testing_toy::toy_offload(c, k.optimizer, k.params, swap_dir);
  return c;
}

using Allocations = std::vector<std::pair<std::string, std::uint64_t>>;

// What the parts allocate once, at construction, per the plan's functions.
inline Allocations planned_construction(const RunPlan& plan) {
  Allocations out;
  for (std::size_t g = 0; g < plan.groups.size(); ++g) {
    if (const std::uint64_t w = resident_weight_bytes(plan, g); w > 0) out.emplace_back("param.w", w);
    if (const std::uint64_t a = device_state_array_bytes(plan, g); a > 0) {
      out.emplace_back("optim.master", a);
      for (int m = 1; m < plan.state_arrays; ++m) out.emplace_back("optim.moments", a);
    }
    const DeviceGradBuffers grads = device_grad_buffers(plan, g);
    for (int i = 0; i < grads.count; ++i) out.emplace_back(grads.tag, grads.bytes);
  }
  if (const std::uint64_t b = device_norm_bytes(plan); b > 0) out.emplace_back("norm.partials", b);
  std::sort(out.begin(), out.end());
  return out;
}

// What gather_master allocates for every tensor of every group (the toy run gathers them all).
inline Allocations planned_export(const RunPlan& plan, std::span<const ParamGroupSpec> groups) {
  Allocations out;
  for (std::size_t g = 0; g < plan.groups.size(); ++g) {
    for (std::size_t t = 0; t < groups[g].tensors.size(); ++t) {
      if (const std::uint64_t b = export_shard_bytes(plan, g); b > 0) out.emplace_back("io.gather", b);
      if (const std::uint64_t b = export_gather_bytes(plan, g); b > 0) out.emplace_back("io.gather", b);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Each step's allocations per micro-batch: every group's gradient buffer and reduction.
inline Allocations planned_micro_batch(const RunPlan& plan) {
  Allocations out;
  for (std::size_t g = 0; g < plan.groups.size(); ++g) {
    if (const std::uint64_t b = micro_grad_bytes(plan, g); b > 0) out.emplace_back("grad.micro", b);
    if (const std::uint64_t b = reduced_grad_bytes(plan, g); b > 0) out.emplace_back("grad.reduced", b);
  }
  return out;
}

inline std::uint64_t sum_of(const Allocations& a, const std::vector<std::string>& tags) {
  std::uint64_t bytes = 0;
  for (const auto& [tag, b] : a) bytes += std::find(tags.begin(), tags.end(), tag) != tags.end() ? b : 0;
  return bytes;
}

inline std::string describe(const Allocations& a) {
  std::map<std::pair<std::string, std::uint64_t>, int> counts;
  for (const auto& x : a) ++counts[x];
  std::string s;
  for (const auto& [x, n] : counts) s += fmt::format(" {}x {} {}", n, x.first, x.second);
  return s.empty() ? " none" : s;
}

// The step's allocations (`during`, over `units` micro-batches): each group's gradient buffer and
// its reduction once per micro-batch, at the plan's sizes; the gathers at the plan's sizes (how
// many depends on prefetch and eviction).
template <typename Expect>
void check_steps(const RunPlan& plan, const Allocations& during, int units, Expect&& expect) {
  // Every micro-batch of every step: each group's gradient buffer and its reduction, once each.
  Allocations grads;
  for (const auto& x : during) {
    if (x.first.rfind("grad.", 0) == 0) grads.push_back(x);
  }
  Allocations planned_grads;
  for (int u = 0; u < units; ++u) {
    for (const auto& x : planned_micro_batch(plan)) planned_grads.push_back(x);
  }
  std::sort(grads.begin(), grads.end());
  std::sort(planned_grads.begin(), planned_grads.end());
  expect(grads == planned_grads, "gradient buffers:" + describe(grads) + "; the plan:" + describe(planned_grads));
  // Gathers: how many depends on prefetch and eviction, their sizes on the plan only.
  std::set<std::pair<std::string, std::uint64_t>> gathers, planned_gathers;
  for (const auto& x : during) {
    if (x.first.rfind("param.", 0) == 0) gathers.insert(x);
  }
  for (std::size_t g = 0; g < plan.groups.size(); ++g) {
    if (const std::uint64_t b = gathered_bytes(plan, g); b > 0) planned_gathers.emplace("param.gathered", b);
    if (const std::uint64_t b = fetched_shard_bytes(plan, g); b > 0) planned_gathers.emplace("param.shard", b);
  }
  expect(gathers == planned_gathers, "gather sizes:" + describe({gathers.begin(), gathers.end()}) +
                                         "; the plan:" + describe({planned_gathers.begin(), planned_gathers.end()}));
}

// Builds rank comm.rank()'s engine for case k, trains it for `steps` steps (fp32 cases; bf16 is
// built only) and returns one line per difference from the plan (empty: none).
inline std::vector<std::string> check_part_bytes(const PartCase& k, Communicator& comm, const std::string& swap_dir) {
  std::vector<std::string> bad;
  const auto expect = [&](bool ok, const std::string& what) {
    if (!ok) bad.push_back(case_name(k) + ": " + what);
  };
  const int steps = 2;
  const TrainConfig c = part_config(k, swap_dir);
  const testing_toy::ToyShape shape{64, 96, 3, 6};
  const bool trains = k.precision == Precision::Fp32;
  const auto groups = testing_toy::toy_groups(shape, trains ? DType::F32 : working_dtype_of(k.precision));
  const RunPlan plan = make_run_plan(c, groups, comm.world_size(), comm.rank());
  const TierPlan tiers = plan_tiers(plan, 1, 0);  // this rank's tiers
  SimDeviceOptions d;
  d.capacity_bytes = 64 << 20;
  auto sim = make_sim_device(d);
  AllocationLog device(*sim);
  Allocations built;  // the construction tags, over the whole run: each allocated once
  Allocations during;  // the step tags
  Allocations exported;  // gather_master's
  TierIoStats io;
  std::size_t pinned = 0;
  if (trains) {
    testing_toy::ToyRunOptions o;
    o.shape = shape;
    o.steps = steps;
    const testing_toy::ToyRun r = testing_toy::run_toy_engine(c, device, comm, o);
    io = r.tiers;
    pinned = r.pinned_pool_bytes;
  } else {
    ZeroEngine engine(c, device, comm, groups, testing_toy::toy_init, plan);
    io = engine.tier_stats();
    pinned = engine.pinned_pool_bytes();
  }
  const std::vector<std::string> construction_tags = {"param.w",    "optim.master", "optim.moments", "grad.step",
                                                      "grad.accum", "grad.levels",  "norm.partials"};
  const std::vector<std::string> step_tags = {"grad.micro", "grad.reduced", "param.gathered", "param.shard"};
  for (const auto& [tag, bytes] : device.log()) {
    const auto is = [&](const std::vector<std::string>& tags) {
      return std::find(tags.begin(), tags.end(), tag) != tags.end();
    };
    if (is(construction_tags)) {
      built.emplace_back(tag, bytes);
    } else if (is(step_tags)) {
      during.emplace_back(tag, bytes);
    } else if (tag == "io.gather") {
      exported.emplace_back(tag, bytes);
    } else {
      expect(false, fmt::format("an allocation no part of the plan names: {} {}", tag, bytes));
    }
  }
  std::sort(built.begin(), built.end());
  const Allocations planned = planned_construction(plan);
  expect(built == planned, "allocated once:" + describe(built) + "; the plan:" + describe(planned));
  // The tier planner's device sums are the sums of those allocations.
  expect(tiers.device_weights == sum_of(built, {"param.w"}), "the plan's resident weights");
  expect(tiers.device_optimizer == sum_of(built, {"optim.master", "optim.moments"}), "the plan's device optimizer");
  expect(tiers.device_state == sum_of(built, construction_tags) - tiers.device_weights - tiers.device_norm,
         "the plan's device state");
  expect(tiers.device_norm == sum_of(built, {"norm.partials"}), "the plan's norm partials");
  // Host arrays, swap store and pinned pools of the tiered home (gradient sums dropped after the step).
  expect(io.host_bytes == tiers.host_arrays - tiers.host_gradients,
         fmt::format("host arrays {} vs the plan's {}", io.host_bytes, tiers.host_arrays - tiers.host_gradients));
  expect(io.nvme_bytes == tiers.nvme - tiers.nvme_gradients,
         fmt::format("swap store {} vs the plan's {}", io.nvme_bytes, tiers.nvme - tiers.nvme_gradients));
  expect(pinned == tiers.pinned, fmt::format("pinned pools {} vs the plan's {}", pinned, tiers.pinned));
  if (trains) {
    check_steps(plan, during, steps * k.accumulation, expect);
    std::sort(exported.begin(), exported.end());
    const Allocations planned_io = planned_export(plan, groups);
    expect(exported == planned_io, "gather_master:" + describe(exported) + "; the plan:" + describe(planned_io));
    std::uint64_t largest = 0;
    for (std::size_t g = 0; g < plan.groups.size(); ++g) {
      largest = std::max(largest, export_shard_bytes(plan, g) + export_gather_bytes(plan, g));
    }
    expect(tiers.device_export == largest, "the plan's export between steps");
  }
  return bad;
}

// The plan's device figure suffices for the export between steps, and for the step where the toy
// model allows: rank comm.rank()'s engine trains two steps, then gathers every tensor's master
// (gather_master's "io.gather" buffers, where the step's window was) with the device's live bytes
// capped at plan_tiers' device_total (the toy model allocates no activations). The step runs under
// the cap too where gradients are written in place; elsewhere the toy holds its tied embedding's
// micro-batch gradient through the whole backward beside each block's, one more gradient buffer
// than the plan counts (its groups declare no such thing), so there the cap starts after the steps.
// Every rank plans the same bytes, so a shortfall throws on each. Returns the failure, or "".
inline std::string check_at_plan(const PartCase& k, Communicator& comm, const std::string& swap_dir) {
  const TrainConfig c = part_config(k, swap_dir);
  testing_toy::ToyRunOptions o;
  o.shape = testing_toy::ToyShape{64, 96, 3, 6};
  o.steps = 2;
  const RunPlan plan = make_run_plan(c, testing_toy::toy_groups(o.shape, DType::F32), comm.world_size(), comm.rank());
  const std::uint64_t total = plan_tiers(plan, 1, 0).device_total();
  SimDeviceOptions d;
  d.capacity_bytes = 64 << 20;
  auto sim = make_sim_device(d);
  AllocationLog device(*sim);
  if (plan.gradients_in_place()) device.cap(total);
  o.before_gather = [&] { device.cap(total); };
  try {
    testing_toy::run_toy_engine(c, device, comm, o);
  } catch (const std::exception& e) {
    return fmt::format("{}: the device capped at the plan's {} bytes: {}", case_name(k), total, e.what());
  }
  return "";
}

}  // namespace strata::testing_parts
