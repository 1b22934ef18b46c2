// Where the optimizer state lives: this rank's fp32 master weights and moments of every param
// group, and the step's fp32 gradient sum they consume. Two homes behind the interfaces below:
//   - on the device (engine/state_home_device.cc): the sums and the update are device ops
//     (engine/device_ops.h) on the engine's communication stream;
//   - on host memory or NVMe (engine/state_home_tiered.h, Note [Offload] in engine/zero_engine.h):
//     chunks streamed through the pinned pool, the sums formed on a host worker stream while
//     backward goes on, the update by the CPU optimizer, overlapped with backward where it can be.
// The run plan (plan/run_plan.h) says which; make_state_home builds it. Not part of the engine's
// interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/dtype_bulk.h"
#include "core/host_buffer.h"
#include "engine/engine_context.h"
#include "engine/engine_state.h"
#include "engine/offload_tier.h"
#include "optim/exact_squares.h"
#include "offload/buffer_pool.h"

namespace strata {

class WorkingWeights;

// What the homes count (zero where the state lives on the device).
struct StateHomeStats {
  TierIoStats tiers;
  std::uint64_t chunk_updates = 0;       // state chunks the optimizer updated
  std::uint64_t overlapped_updates = 0;  // of which during backward
  std::uint64_t copy_bytes = 0;          // host<->device bytes moved for offloaded state
  std::size_t pinned_pool_bytes = 0;     // host bytes of the fixed pinned staging pools
};

// A piece of state on its way to a checkpoint (engine/zero_engine_state.cc): `bytes` (padded) are
// valid once `read` completed (no read: at once); the rest keeps them alive.
struct StatePiece {
  std::span<std::byte> bytes;
  std::size_t meaningful = 0;  // bytes before the padding
  offload::BufferLease lease;  // NVMe: the pinned slot the read lands in
  HostBuffer staging;          // device state: the host copy
  offload::IoHandle read;
};

// Note [State home interfaces]: a home does four jobs (the step, checkpoint pieces, the parameter
// tier, stats), each behind an interface of its own, and each part of the engine holds only the one
// it uses (the step's is two: the gradients coming in, and the step's decisions over them):
//   GradientSink     the reduced gradients of each unit (engine/grad_reducer.h);
//   StateStepper     the step: the final gradients, their norm's parts, the update (ZeroEngine::step);
//   StateCheckpoint  the state piece by piece, out and in (engine/zero_engine_state.cc);
//   ParamTier        the working weights on the parameter tier (engine/param_fetcher.h), only
//                    where the plan puts them there (StateHome::param_tier);
//   StateStats       what the homes count (ZeroEngine::offload_stats).
// StateHome is the owner's view (ZeroEngine): the set-up and all of the above.

// Where the gradient reducer hands each unit's gradient, reduced across ranks.
class GradientSink {
 public:
  // Where the reduction of group g's unit should land (grad_elems elements in the working dtype,
  // device memory the home keeps across steps), or null: the reducer allocates it and hands it over.
  virtual void* reduction_target(std::size_t /*g*/) { return nullptr; }
  // Unit `unit` (0-based micro-batch of the step) of group g's gradient, reduced across ranks:
  // grad_elems elements in the working dtype on the device, ready on the communication stream
  // (empty when it landed in reduction_target(g)).
  virtual void add_unit(std::size_t g, DeviceMemory reduced, int unit) = 0;

 protected:
  ~GradientSink() = default;
};

// One step of the optimizer over the state, wherever it lives.
class StateStepper {
 public:
  // The learning rate of the step about to start; true when the update will run during backward
  // (Note [Overlapped update], engine/state_home_tiered.cc).
  virtual bool prepare_step(double lr) = 0;
  // At step(lr): whether prepare_step promised an overlapped update for this step (which then
  // already ran); clears the promise. InternalError when `lr` is not the announced one.
  virtual bool take_overlap(double lr) = 0;
  // After the last unit: forms the final gradients and waits until their block partials are ready.
  virtual void finish_grads() = 0;
  // Sums of squares of this rank's final gradient of g, one per optimizer block, in order.
  virtual std::vector<double> block_partials(std::size_t g) = 0;
  // Whether block_partials covers this rank's shard only (the shard group's ranks exchange them).
  virtual bool partials_are_shards() const = 0;
  // Exact mode: the exact sum of squares of this rank's final gradient of g (Note [Exact sum of
  // squares]), covering what block_partials covers.
  virtual optim::ExactSquares exact_squares(std::size_t g) = 0;
  // Applies the optimizer at `lr` with the gradients scaled by `grad_scale`, as optimizer step
  // `step`, writing the new working weights where they live; then the gradients are dropped.
  virtual void update(double lr, float grad_scale, std::int64_t step) = 0;
  // A skipped step: the gradients are dropped.
  virtual void drop_grads() = 0;
  // Ready for the next step's sums.
  virtual void end_step() = 0;

 protected:
  ~StateStepper() = default;
};

// The state piece by piece, for checkpoints (between steps).
class StateCheckpoint {
 public:
  virtual std::vector<StateChunkInfo> pieces() const = 0;
  // How many pieces may be in flight at once, and one of them fetched (its read started).
  virtual std::size_t export_depth() const = 0;
  virtual StatePiece fetch_piece(std::size_t index, const StateChunkInfo& c, std::vector<HostBuffer>& spare) = 0;
  // Fills the state from `source` and rewrites this rank's W from the new master wherever it lives.
  virtual void import_state(const StateSource& source) = 0;
  // This rank's fp32 master of g's state range, on the host.
  virtual std::vector<float> master_range(std::size_t g) = 0;
  // Note [Checkpoint capture] (engine/state_home_tiered_state.cc): only where state lives on a tier.
  virtual bool arm_capture(StateCaptureSink sink) = 0;
  virtual void disarm_capture() = 0;
  virtual std::size_t captured_pieces() const = 0;

 protected:
  ~StateCheckpoint() = default;
};

// The working weights on the parameter tier (stage 3, offload_param).
class ParamTier {
 public:
  // For a fetch of group g's shard from the parameter tier: a pinned slot where the shard lives on
  // NVMe (waited for, Note [Deterministic prefetch] in engine/param_fetcher.cc), else null. Taken before the device
  // memory.
  virtual std::shared_ptr<offload::BufferLease> reserve_param_slot(std::size_t g) = 0;
  // Enqueues on the communication stream the copy of g's shard from the tier to `dst` (device).
  virtual void upload_params(std::size_t g, void* dst, std::shared_ptr<offload::BufferLease> slot) = 0;

 protected:
  ~ParamTier() = default;
};

class StateStats {
 public:
  virtual StateHomeStats stats() const = 0;

 protected:
  ~StateStats() = default;
};

class StateHome : public GradientSink, public StateStepper, public StateCheckpoint, public StateStats {
 public:
  virtual ~StateHome() = default;

  // Group g's initial values: the fp32 master of the whole group and W in the working dtype (host).
  virtual void init_group(std::size_t g, const float* master_full, const void* working_full) = 0;
  // The device-resident fp32 master of g's state range (W may alias it), or null.
  virtual float* device_master(std::size_t g) const = 0;
  // Waits for the home's own queued host work (which frees device memory as it goes: the device
  // allocator drains it before it gives up).
  virtual void synchronize() {}
  // The parameter tier where the plan puts the sharded working weights there, else null.
  virtual ParamTier* param_tier() { return nullptr; }
};

// W of a run of new master values, for an import: the values themselves in fp32, else their
// conversion (round to nearest even, the optimizer's rounding) in a reused buffer.
struct WorkingCopy {
  std::vector<std::byte> narrow;
  const void* convert(const float* master, DType dtype, std::size_t n) {
    if (dtype == DType::F32) return master;
    narrow.resize(n * dtype_bytes(dtype));
    convert_parallel(master, DType::F32, narrow.data(), dtype, n);
    return narrow.data();
  }
};

// The home the plan asks for (RunPlan::optimizer_offloaded).
std::unique_ptr<StateHome> make_state_home(EngineContext& ctx, WorkingWeights& weights);

}  // namespace strata
