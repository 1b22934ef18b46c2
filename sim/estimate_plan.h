// What `strata estimate` computes: the bytes per tier and rank of a training config on a machine
// (this one, or one described by a machine file), whether it fits, the largest model of the config's
// shape that does, and DeepSpeed's estimate for the same model beside it.
//
// Note [One plan for estimate and train]: nothing here re-derives a placement rule. The numbers are
// those of the path `strata train` takes before step 1 (train/training_run.cc): the tiling decision
// (models/tiling_plan.h), then place_run (plan/tier_plan.h: "auto" sections and the host budget
// resolved, the run plan, its bytes per tier), checked by check_plan_fits. Only the capacities differ: a
// machine file gives the GPU's memory, the host's memory (all of it counts as available) and the
// world size (its GPU count); without one, the config's device and this host are measured as the
// trainer measures them. tests/tools/estimate_test.sh holds the two paths to the same bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "plan/machine.h"
#include "plan/tier_plan.h"

namespace strata::sim {

struct EstimateInputs {
  TrainConfig config;
  std::optional<MachineSpec> machine;
  int world_size = 0;  // 0: the machine's GPU count, or 1
};

struct DeepSpeedBeside {
  int stage = 0;
  std::string options;  // e.g. "offload_param=cpu, offload_optimizer=cpu, zero_init=1"
  std::uint64_t cpu_bytes_per_node = 0;
  std::uint64_t gpu_bytes_per_gpu = 0;
  std::uint64_t largest_layer_params = 0;
};

struct Estimate {
  std::string model;
  std::int64_t n_layers = 0;
  std::uint64_t parameters = 0;
  int world_size = 1;
  int tensor_ranks = 1;            // strata.parallel.tensor: per-rank figures are one tensor rank's slices
  int pipeline_stages = 1;         // strata.parallel.pipeline: per-rank figures are the first stage's
  std::vector<std::string> stage_plan_lines;  // with stages: each stage's plan line (or its refusal)
  std::uint64_t device_bytes = 0;  // per GPU
  TierPlan tiers;                  // rank 0's (every rank's state has the same size)
  TierCapacities capacity;
  std::uint64_t activations_checkpointed = 0;  // one micro-batch, with and without block checkpointing
  std::uint64_t activations_full = 0;
  std::uint64_t host_pinned = 0;    // pinned pools, and the host arrays when pinned (pin_memory)
  std::uint64_t host_pageable = 0;  // host arrays that are not pinned
  std::string tiling;               // the tiling decision, empty when nothing is tiled
  bool fits = false;
  std::string why_not;              // the refusal `strata train` would print, when it does not fit
  bool nvme_checked = false;        // free space known (this machine's directories)
  DeepSpeedBeside deepspeed;
  std::string plan_line;  // describe_plan's first line, as `strata train` logs it before step 1
  std::vector<std::string> placement;  // describe_plan's other lines: where each part is and why
  TrainConfig resolved;   // the config with its "auto" placement decided (as the trainer builds the engine)
};

// The estimate for `in` (never allocates the model). Throws ConfigError for a config or machine
// that cannot be planned at all (a bad model name, no device memory known).
Estimate estimate_run(const EstimateInputs& in);
// The batch sizes of `in.config` for the world it plans (resolve_batch_sizes, config/config.h), as
// train resolves them; "auto" ones recorded. Call once, before estimate_run.
void resolve_planned_batch_sizes(EstimateInputs& in);

// The largest n_layers of the config's model (width, heads, vocabulary unchanged) whose plan fits,
// with its parameter count; 0 layers when not even one does.
struct LargestFit {
  std::int64_t n_layers = 0;
  std::uint64_t parameters = 0;
};
LargestFit largest_fitting_depth(const EstimateInputs& in, std::int64_t max_layers = 1 << 16);

std::string describe_estimate(const Estimate& e, const LargestFit& largest);
nlohmann::json estimate_to_json(const Estimate& e, const LargestFit& largest);

}  // namespace strata::sim
