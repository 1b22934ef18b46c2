// The arrays each chunk job of the tiered state home reads, writes and needs as scratch, and the
// tier keys they live under: one description of the offloaded step's I/O, read by the engine
// (engine/state_home_tiered.cc builds its jobs on it) and by `strata bench io --replay`
// (bench/bench_io_replay.cc), which runs the same jobs with no work through the same swap store
// and chunk pipeline, so the replayed I/O is the engine's and not a second description of it.
//
// A chunk's fields follow from the run plan alone (its tiers, the working dtype, whether the
// working weights live on the parameter tier), the unit's place in the step and two step-wide
// choices: exact mode's binary counter (Note [Exact gradient sums] in engine/zero_engine.h) and Note
// [Overlapped update] in engine/state_home_tiered.cc.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/offload_tier.h"
#include "plan/run_plan.h"

namespace strata {

// Tier keys of chunk k of group g: optimizer state, final gradient, working weights, and the binary
// counter's partial sum at `level`.
std::string state_key(std::size_t g, std::size_t k);
std::string grad_key(std::size_t g, std::size_t k);
std::string param_key(std::size_t g, std::size_t k);
std::string level_key(std::size_t g, int level, std::size_t k);

inline constexpr std::size_t kNoField = static_cast<std::size_t>(-1);

// The fields of one job, with the index of each role (kNoField where the job has none).
struct CombineFields {
  std::vector<ChunkField> fields;
  std::vector<std::string> remove_after;
  std::size_t stage = kNoField;  // the unit's gradient as it comes down (working dtype)
  std::vector<std::size_t> adds;  // exact mode: the counter's levels merged in
  std::size_t out = kNoField;    // the fp32 sum formed
  std::size_t tmp = kNoField;    // fast mode after unit 0: the unit widened
  std::size_t state = kNoField;  // overlapped update: the state updated
  std::size_t weights = kNoField;  // overlapped update: the new working weights
};

// TieredStateHome::combine_job's fields for chunk k of group g at micro-batch `unit`;
// `overlap_step`: the step's update overlaps backward (it does at the last unit).
CombineFields combine_fields(const RunPlan& plan, std::size_t g, std::size_t k, int unit, bool exact,
                             bool overlap_step);

// TieredStateHome::update's fields for chunk k of group g: state (Update), final gradient (Read,
// removed after), new working weights (Write to the parameter tier, or Scratch to go up).
struct UpdateFields {
  std::vector<ChunkField> fields;
  std::vector<std::string> remove_after;
};
UpdateFields update_fields(const RunPlan& plan, std::size_t g, std::size_t k);

// Whether group g's working weights live on the parameter tier (stage 3, sharded, params offloaded).
bool weights_on_tier(const RunPlan& plan, std::size_t g);

}  // namespace strata
