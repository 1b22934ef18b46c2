// The run plan: where every array of a training run lives, decided once from the config and the
// model's param groups, before any memory is allocated or any file is made.
//
// Note [Run plan]: placement rules exist in this file only. For each param group the plan says how
// it is sharded (plan/partition.h), which range of the flat buffer this rank's optimizer state
// and gradient cover, how the working weights W are held (a full device copy, this rank's shard on
// the device, the fp32 master itself, or a shard on the parameter tier), and, where the optimizer
// is offloaded, the chunks the state range is streamed in. For the run it says where the optimizer
// state and the sharded working weights live (device, host or NVMe), the pinned staging pools, the
// NVMe directories and the swap file's name, and the I/O engine's options. The engine's parts
// allocate what the plan says, each buffer's bytes a function of the plan (see Note [Part bytes] in plan/part_bytes.h
// in plan/part_bytes.h), the tier planner (plan/tier_plan.h) sums the same functions per tier, the
// trainer prints and checks that sum, and checkpoints and tools that need a path or an engine
// option take it from here; none of them re-derives a rule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "config/config.h"
#include "plan/home.h"
#include "plan/param_provider.h"
#include "plan/partition.h"
#include "offload/io_engine.h"
#include "optim/optimizer.h"

namespace strata {

// How this rank holds a group's working weights W.
enum class WeightsForm : std::uint8_t {
  Full,            // a resident full copy on the device
  FullIsMaster,    // the full copy is the device-resident fp32 master (fp32, stage 0, optimizer on the device)
  Shard,           // stage 3: this rank's shard on the device, gathered for use
  ShardIsMaster,   // stage 3: the shard is the device-resident fp32 master
  ShardOnTier,     // stage 3: the shard lives on the parameter tier (host or NVMe), fetched through it
};

// A piece of a group's state range (Note [Chunk pipeline], engine/offload_tier.h), and where its
// arrays live: each chunk has its own tier, so state that does not fit the host budget spills to
// NVMe chunk by chunk (Note [Spill across tiers] in plan/run_plan.cc).
struct StateChunk {
  std::size_t begin = 0;  // elements from the start of this rank's state range
  std::size_t elems = 0;
  Home state = Home::Host;   // master and moments of the chunk
  Home grads = Home::Host;   // its fp32 gradient partial sums (the accumulator, the counter's levels)
  Home params = Home::Host;  // the chunk's working weights, when they live on the parameter tier
};

struct GroupPlan {
  explicit GroupPlan(const ParamGroupSpec& spec, int shard_count)
      : layout(spec, shard_count), gathered_with(spec.gathered_with) {}

  GroupLayout layout;
  std::vector<std::string> gathered_with;  // ParamGroupSpec::gathered_with
  bool sharded_params = false;   // stage 3, above the persistence threshold: W is gathered for use
  std::size_t state_offset = 0;  // this rank's master/moments start here in the flat buffer
  std::size_t state_elems = 0;
  std::size_t grad_elems = 0;    // elements of the reduced gradient this rank accumulates
  std::size_t grad_offset = 0;   // where the optimizer's gradient starts inside that gradient
  WeightsForm weights = WeightsForm::Full;
  std::vector<StateChunk> chunks;  // the state range in chunks (optimizer offloaded), else empty

  // Elements of W this rank keeps resident on the device (0 when W is the master or on a tier).
  std::size_t device_weight_elems() const;
};

struct OffloadPlan {
  // Device, or the tier the section prefers (offloaded sections: each chunk's own home says where
  // its arrays are; "auto" prefers the host and spills to NVMe).
  Home optimizer = Home::Device;  // fp32 master, moments and the fp32 gradient sums
  Home params = Home::Device;     // sharded working weights (stage 3)
  // The host bytes offloaded arrays and pinned pools may take (strata.offload.host_budget once
  // resolved; 0: no limit) and what "auto" sections placed: chunks in all and chunks on NVMe.
  std::uint64_t host_budget = 0;
  std::size_t state_chunks = 0, spilled_state_chunks = 0, spilled_grad_chunks = 0;
  std::size_t param_chunks = 0, spilled_param_chunks = 0;
  std::size_t chunk_elems = 0;    // a multiple of the optimizer block, <= sub_group_size
  // The optimizer's chunk pipeline: a fixed pool of pinned slots (Note [Chunk pipeline] in engine/offload_tier.h).
  std::size_t slot_count = 0;
  std::size_t slot_bytes = 0;
  bool pin_optimizer = true;
  // NVMe -> device parameter fetches: slots of the largest padded shard (0 slots when unused).
  std::size_t param_slot_count = 0;
  std::size_t param_slot_bytes = 0;
  bool pin_params = true;
  // The swap store of this rank (empty dirs: nothing on NVMe).
  std::vector<std::string> nvme_dirs;
  std::string swap_file_name;
  std::uint64_t swap_bytes = 0;           // the most this rank stores at once (padded)
  std::uint64_t swap_gradient_bytes = 0;  // of which gradient partial sums (during a step only)
  std::uint64_t swap_capacity_bytes = 0;  // what the store preallocates: swap_bytes plus room
  offload::IoEngineOptions io;

  // Host bytes of both pinned pools as allocated (slots are rounded to whole huge pages).
  std::uint64_t pinned_bytes() const;
};

// Note [Reductions in flight] (engine/grad_reducer.cc): the most gradient reductions the engine
// keeps queued before the host waits; the plan and the step simulator read it here.
inline constexpr std::size_t kReductionsInFlight = 2;

struct RunPlan {
  ShardTopology topo;
  int stage = 0;
  int shard_count = 1;  // shards per group (1 at stage 0)
  int shard_index = 0;  // the shard this rank owns
  DType working = DType::F32;
  int state_arrays = 3;   // fp32 arrays per state element: master, moment1[, moment2]
  // The most fp32 gradient partial sums a group keeps at once on a tier: the binary counter's
  // levels plus the one being formed (Note [Exact gradient sums] in engine/zero_engine.h); 1 accumulator in fast mode.
  int grad_partials = 1;
  int accumulation = 1;  // micro-batches per step (gradient_accumulation_steps)
  bool exact = false;    // strata.exact: exact gradient sums and the exact norm (its partials' size)
  std::vector<GroupPlan> groups;
  OffloadPlan offload;

  bool optimizer_offloaded() const { return offload.optimizer != Home::Device; }
  bool params_offloaded() const { return offload.params != Home::Device; }
  // Note [Gradients in place] (engine/grad_reducer.cc): one micro-batch per step on one rank, with
  // the step's gradient on the device, so the backward writes it where the optimizer reads it (no
  // micro-batch buffer, no reduction).
  bool gradients_in_place() const { return accumulation == 1 && topo.world_size == 1 && !optimizer_offloaded(); }
  // The dtype of the step's final gradient on the device (what the norm and the update read): with
  // one micro-batch per step the reduced unit as it is, in the working dtype (Note [One unit's
  // gradient as it is], engine/state_home_device.cc), else the fp32 sum of the units.
  DType final_grad_dtype() const { return accumulation == 1 ? working : DType::F32; }
  std::size_t working_bytes() const { return dtype_bytes(working); }
  // Host bytes of a chunk's arrays when they live in host memory (each padded to 4 KiB,
  // engine/offload_tier.h): its state, its gradient partial sums, its working weights.
  std::uint64_t host_state_bytes(const StateChunk& c) const;
  std::uint64_t host_gradient_bytes(const StateChunk& c) const;
  std::uint64_t host_param_bytes(const StateChunk& c) const;
  // Whether any chunk of group g keeps its working weights on NVMe.
  bool params_on_nvme(std::size_t g) const;
  // Whether any chunk keeps its state (or its gradient sums) on NVMe.
  bool state_on_nvme() const;
  bool grads_on_nvme() const;
};

// The plan of rank `rank` of `world_size`. Throws ConfigError (naming config.source, the numbers
// and the knob) when the pinned staging cannot hold one optimizer block per slot,
// offload_param.buffer_size is smaller than the largest parameter shard, or state that must spill
// past strata.offload.host_budget has no nvme_path to go to. Sections with device "auto" are
// placed on the host up to the budget, then on NVMe; resolve_placement (plan/tier_plan.h) first
// decides whether the device holds them.
RunPlan make_run_plan(const TrainConfig& config, std::span<const ParamGroupSpec> groups, int world_size, int rank);

// The working dtype of a precision.
DType working_dtype_of(Precision precision);
// The distinct NVMe directories of a config's offload sections, in order of first mention.
std::vector<std::string> nvme_dirs_of(const TrainConfig& config);
// The name of rank `rank`'s swap file inside each NVMe directory.
std::string swap_file_name(int rank);
// The I/O engine a config asks for (aio.engine, aio.queue_depth).
offload::IoEngineOptions io_engine_options(const AioConfig& aio);
// The optimizer a config asks for, and its hyper-parameters.
optim::OptimizerKind optimizer_kind_of(const OptimizerConfig& optimizer);
optim::ParamGroup make_optimizer(const OptimizerConfig& optimizer);

}  // namespace strata
