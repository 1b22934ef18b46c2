// What the parts of the ZeRO engine share (engine/zero_engine.h): the config, the run plan, the
// device, the communicators and the engine's communication stream, the optimizer. Not part of the
// engine's interface.
//
// The parts, each in its own file:
//   WorkingWeights  (engine/working_weights.h)  the resident working weights W and their publishing;
//   ParamFetcher    (engine/param_fetcher.h)    trace, prefetch, gather and release of sharded W,
//                                               and the device allocations that may evict gathers;
//   GradReducer     (engine/grad_reducer.h)     micro-batch gradients reduced across ranks, one
//                                               unit at a time, handed to the state home;
//   StateHome       (engine/state_home.h)       master weights, moments and the step's fp32
//                                               gradient sum: on the device, or on host/NVMe tiers.
#pragma once

#include <bit>
#include <cstddef>
#include <vector>

#include "core/device/device.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "plan/param_provider.h"
#include "plan/run_plan.h"
#include "optim/cpu_exec.h"
#include "optim/optimizer.h"

namespace strata {

struct EngineContext {
  const TrainConfig& config;
  const RunPlan& plan;
  Device& device;
  Communicator& world;
  Communicator& shard_comm;    // the ranks that share one copy of the state (plan/partition.h)
  Communicator& replica_comm;  // the ranks that hold the same shard
  Stream& comm;                // the engine's communication stream
  optim::ParamGroup& optimizer;
  optim::CpuExec exec;

  DType working() const { return plan.working; }
  std::size_t wbytes() const { return plan.working_bytes(); }
  int accumulation() const { return config.gradient_accumulation_steps; }
  bool exact() const { return config.strata.exact; }
  const GroupPlan& group(std::size_t g) const { return plan.groups[g]; }
  std::size_t group_count() const { return plan.groups.size(); }
};

// Pointers to group g's tensors inside a flat buffer of `dtype` at `base`.
inline GroupViews views_of(const GroupLayout& layout, void* base, DType dtype) {
  GroupViews v;
  for (const TensorSlot& s : layout.slots()) v.tensors.push_back(static_cast<char*>(base) + s.offset_elems * dtype_bytes(dtype));
  return v;
}

// The binary counter of Note [Exact gradient sums] (engine/zero_engine.h), the same on the device
// and on the tiers. Unit a first merges with the partial sums at the levels of a's trailing one
// bits, older sums on the left, and lands one level above the last of them.
inline int counter_merges(int unit) { return std::countr_one(static_cast<unsigned>(unit)); }
// After the last unit (which merged `merges` levels) the levels still holding partial sums: the one
// bits of the unit count above `merges`, lowest first; folded in that order, each on the left.
inline std::vector<int> counter_levels_left(int units, int merges) {
  std::vector<int> levels;
  for (int level = merges + 1; level < 32; ++level) {
    if (((static_cast<unsigned>(units) >> level) & 1u) != 0) levels.push_back(level);
  }
  return levels;
}

}  // namespace strata
