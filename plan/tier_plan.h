// The tier planner: before the first step, the bytes each tier needs for a model and a config, and
// a refusal with the numbers and the knob to change when they cannot fit. The bytes are a sum over
// the run plan (plan/run_plan.h, Note [Run plan] in plan/run_plan.h): where each array lives is decided there only,
// and what each part of the engine allocates is a function of it (see Note [Part bytes] in
// plan/part_bytes.h), the one the part itself calls.
//
// Per rank: the device must hold, at the same time, whatever model state the config keeps resident
// (master and moments unless the optimizer is offloaded, working weights unless they are sharded
// and offloaded, fp32 gradient sums unless offloaded), the largest param group while it is
// gathered, one micro-batch's gradient of that group and its reduction, and the activations. That
// is a lower bound (prefetching gathers more when there is room); a config above it cannot run. The
// host needs the offloaded arrays of optimizer state, gradients and parameters (offload to "cpu")
// plus the fixed pinned staging pools; NVMe needs the swap store of every rank, split over the
// nvme_path directories. Capacities come from the device, /proc/meminfo (MemAvailable, shared by the
// ranks of the node) and statvfs of each directory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "config/config.h"
#include "plan/param_provider.h"
#include "plan/run_plan.h"

namespace strata {

struct TierPlan {
  // Device, per rank.
  std::uint64_t device_state = 0;    // master, moments and the step's gradient buffers on the device
  std::uint64_t device_norm = 0;     // the norm's partials beside them (device_norm_bytes, plan/part_bytes.h)
  std::uint64_t device_optimizer = 0;  // of which master and moments (resident between steps)
  std::uint64_t device_weights = 0;  // resident working weights (full or sharded)
  std::uint64_t device_window = 0;   // the largest group gathered, its gradient and reduction, and
                                     // the groups gathered with it (Note [Groups gathered together] in
                                     // plan/tier_plan.cc)
  // Between steps, ZeroEngine::gather_master's buffers for the largest group split over ranks
  // (export_shard_bytes + export_gather_bytes, plan/part_bytes.h). It allocates where the window's
  // buffers were (the step's gradients and reductions are freed by then, gathered copies given back
  // when the device is full), so device_total() counts the larger of the two.
  std::uint64_t device_export = 0;
  // Not in device_total(): with room for it, another group's micro-batch gradient and reduction
  // still queued beside the window (Note [Reductions in flight] in engine/grad_reducer.cc); 0 with gradients in place.
  std::uint64_t device_in_flight = 0;
  std::uint64_t activations = 0;
  std::string largest_group;
  std::uint64_t largest_group_bytes = 0;  // working dtype, gathered
  // Host, per rank.
  std::uint64_t host_arrays = 0;  // offloaded to "cpu": state, gradient partial sums, parameters (padded)
  std::uint64_t host_gradients = 0;  // of which the gradient partial sums (held during a step only)
  std::uint64_t pinned = 0;       // staging pools (fixed)
  // NVMe, all ranks together, and the directories it is striped over.
  std::uint64_t nvme = 0;
  std::uint64_t nvme_gradients = 0;  // of which the gradient partial sums (held during a step only)
  // What the swap files take on disk, preallocated at start: `nvme` plus the store's room for
  // fragmentation (RunPlan's swap_capacity_bytes). The free-space check and the printed plan use it.
  std::uint64_t nvme_files = 0;
  std::vector<std::string> nvme_dirs;
  // How the swap store reaches the drives (aio.queue_depth, aio.request_size, aio.write_request_size
  // as the I/O engine takes them), for the plan line.
  unsigned nvme_queue_depth = 0;
  std::uint64_t nvme_read_request_bytes = 0, nvme_write_request_bytes = 0;
  // The model state in all (weights, fp32 master, moments, gradients), every rank together.
  std::uint64_t model_state = 0;
  // Spilling (Note [Spill across tiers], plan/run_plan.cc): the host budget (0: none) and the
  // chunks of this rank's state and tier-held weights, in all and on NVMe.
  std::uint64_t host_budget = 0;
  std::size_t state_chunks = 0, spilled_state_chunks = 0, spilled_grad_chunks = 0;
  std::size_t param_chunks = 0, spilled_param_chunks = 0;
  // Why the state is where it is: one line per decision resolve_placement made (empty otherwise).
  std::vector<std::string> placement;

  std::uint64_t device_total() const {
    return device_state + device_norm + device_weights + std::max(device_window, device_export) + activations;
  }
  std::uint64_t host_total() const { return host_arrays + pinned; }
};

struct TierCapacities {
  std::uint64_t device = 0;          // per rank
  std::uint64_t host_available = 0;  // for all ranks of the node together
  int ranks_on_node = 1;
  std::vector<std::uint64_t> nvme_free;  // per TierPlan::nvme_dirs entry (0 when missing)
};

// The bytes of `plan` (one rank's; every rank's state has the same size) for `world_size` ranks.
// `activation_bytes`: what the model allocates for one micro-batch (models::Decoder::activation_bytes).
TierPlan plan_tiers(const RunPlan& plan, int world_size, std::uint64_t activation_bytes);
// The same for rank 0's plan of a config and its groups.
TierPlan plan_tiers(const TrainConfig& config, std::span<const ParamGroupSpec> groups, int world_size,
                    std::uint64_t activation_bytes);

// What the host offers a run, for the host budget: MemAvailable, the ranks sharing it, and the
// device memory each rank's sim device takes out of it (0 for a real GPU).
struct HostFacts {
  std::uint64_t mem_available = 0;
  int ranks_on_node = 1;
  std::uint64_t device_in_host = 0;
};
HostFacts measure_host(int ranks_on_node, std::uint64_t device_in_host);

// The default host budget per rank ("auto"): 3/4 of MemAvailable shared by the node's ranks, less
// what a sim device takes from host memory; at least 64 MiB.
std::uint64_t auto_host_budget(const HostFacts& host);

// A config with its "auto" placement decided (Note [Spill across tiers], plan/run_plan.cc): the
// host budget in bytes, and each section with device "auto" on the device when the run then fits
// it with a tenth to spare (the parameters first, then the optimizer state), else kept "auto":
// host memory up to the budget, then NVMe. `why` gets one line per decision.
struct Placement {
  TrainConfig config;
  std::vector<std::string> why;
};
Placement resolve_placement(const TrainConfig& config, std::span<const ParamGroupSpec> groups, int world_size,
                            std::uint64_t activation_bytes, std::uint64_t device_bytes, const HostFacts& host);

// The planning sequence, the one every planner runs (the trainer before it builds its engine,
// `estimate` and `simulate` against a machine file): "auto" placement resolved, the run plan made
// for `rank` of `data_world`, its bytes per tier summed for `ranks_on_node` ranks (tiers.placement:
// why each "auto" went where). Only the capacities it is checked against differ between them.
struct PlacedRun {
  TrainConfig config;  // the config with "auto" resolved: the engine is built with it
  RunPlan run;
  TierPlan tiers;
};
PlacedRun place_run(const TrainConfig& config, std::span<const ParamGroupSpec> groups, int data_world, int rank,
                    int ranks_on_node, std::uint64_t activation_bytes, std::uint64_t device_bytes,
                    const HostFacts& host);

// MemAvailable and free space of the plan's directories (a missing directory counts its parent's).
TierCapacities measure_capacities(const TierPlan& plan, std::uint64_t device_bytes, int ranks_on_node);

// Throws ConfigError naming the tier, the numbers and the knob when the plan does not fit.
void check_plan_fits(const TierPlan& plan, const TierCapacities& capacity, const std::string& source);

// A few lines for the log: need and capacity per tier.
std::string describe_plan(const TierPlan& plan, const TierCapacities& capacity);

}  // namespace strata
