// The bytes each part of the ZeRO engine allocates, as functions of the run plan.
//
// Note [Part bytes]: placement is decided once (Note [Run plan] in plan/run_plan.h), and what each
// part of the engine then allocates for a param group is a function of that plan, written here
// once. The part calls it to size the allocation (engine/working_weights.cc,
// engine/param_fetcher.cc, engine/grad_reducer.cc, engine/state_home_device.cc with the norm's
// partials, the tiered home's staging in engine/state_home_tiered.cc, the export's gathers in
// engine/zero_engine.cc); no device op allocates on its own, on any backend, so what the sim device
// allocates is what cuda does. The tier planner sums it per tier (plan/tier_plan.cc,
// which `strata estimate`, `strata simulate` and the trainer print and check), and the step
// simulator moves it (sim/step_sim.cc); none of them writes the formula again. The host arrays of
// the tiered home are RunPlan's host_state_bytes, host_gradient_bytes and host_param_bytes, its
// pinned pools OffloadPlan::pinned_bytes (plan/run_plan.h). tests/engine/part_bytes_checks.h holds
// a built engine, at worlds 1, 2 and 4, to every one of them, allocation by allocation, and trains
// and exports on a device capped at the planner's figure.
#pragma once

#include <cstddef>
#include <cstdint>

#include "plan/run_plan.h"

namespace strata {

// WorkingWeights: group g's resident W on the device ("param.w"), allocated once: the full copy, or
// this rank's shard at stage 3; 0 where W is the device-resident master or lives on the parameter
// tier.
std::uint64_t resident_weight_bytes(const RunPlan& plan, std::size_t g);

// ParamFetcher, for a group gathered for use (stage 3 above the persistence threshold; 0 for
// others): the full W gathered ("param.gathered"), and, where the shard comes from the parameter
// tier and the group is split over several ranks, the shard brought up before the all-gather
// ("param.shard"; with one shard it lands in the gathered copy).
std::uint64_t gathered_bytes(const RunPlan& plan, std::size_t g);
std::uint64_t fetched_shard_bytes(const RunPlan& plan, std::size_t g);
// The shard of W the parameter tier holds and copies up per gather (whatever it lands in).
std::uint64_t tier_shard_bytes(const RunPlan& plan, std::size_t g);

// One micro-batch's gradient of group g in the working dtype, whole (what the backward writes and
// the reduction reads), and reduced to this rank's gradient range (what the state home adds).
std::uint64_t unit_grad_bytes(const RunPlan& plan, std::size_t g);
std::uint64_t reduced_unit_bytes(const RunPlan& plan, std::size_t g);
// GradReducer: whether the backward writes g's gradient straight into the state home's buffer
// (Note [Gradients in place] in engine/grad_reducer.cc), and whether the reduction lands in the
// state home's buffer for the step's gradient (GradientSink::reduction_target: the device home
// with one micro-batch per step).
bool grads_in_place(const RunPlan& plan, std::size_t g);
bool reduction_in_home(const RunPlan& plan);
// GradReducer's allocations per micro-batch: the micro-batch buffer ("grad.micro"; 0 in place)
// and the reduction's result ("grad.reduced"; 0 where it lands in the home).
std::uint64_t micro_grad_bytes(const RunPlan& plan, std::size_t g);
std::uint64_t reduced_grad_bytes(const RunPlan& plan, std::size_t g);

// DeviceStateHome (all 0 where the optimizer state is offloaded): one fp32 array over g's state
// range ("optim.master", and each moment "optim.moments"), state_arrays of them in all.
std::uint64_t device_state_array_bytes(const RunPlan& plan, std::size_t g);
std::uint64_t device_optimizer_bytes(const RunPlan& plan, std::size_t g);
// The step's gradient buffers the device home keeps across steps (Note [Gradient buffers kept
// across steps] in engine/state_home_device.cc): with one micro-batch per step the reduced unit
// itself in the working dtype ("grad.step"), else fp32 sums: one accumulator in fast mode
// ("grad.accum"), the binary counter's grad_partials levels in exact mode ("grad.levels").
struct DeviceGradBuffers {
  const char* tag = "";
  int count = 0;
  std::uint64_t bytes = 0;  // each
  std::uint64_t total() const { return static_cast<std::uint64_t>(count) * bytes; }
};
DeviceGradBuffers device_grad_buffers(const RunPlan& plan, std::size_t g);

// The step's final gradient of g, as the norm and the update read it (RunPlan::final_grad_dtype).
std::uint64_t final_grad_bytes(const RunPlan& plan, std::size_t g);

// DeviceStateHome's norm partials (Note [One wait for the norm] in engine/state_home_device.cc): the
// device ops write group g's part of the gradient norm into device memory, one double per block of
// the final gradient (optim::sum_squares_blocks), or in exact mode one optim::ExactSquares per run
// of optim::kExactMaxAdds elements (optim::exact_sum_squares_parts), and one copy per step brings
// every group's part to the host. The groups' slices lie one after another in one buffer
// ("norm.partials"), allocated once with the state and reused every step, so the norm allocates
// nothing per step on any device. 0 where the optimizer state is offloaded (the tiered home sums
// the norm on the host).
std::uint64_t norm_partials_bytes(const RunPlan& plan, std::size_t g);   // group g's slice
std::uint64_t norm_partials_offset(const RunPlan& plan, std::size_t g);  // where it begins in the buffer
std::uint64_t norm_partials_total(const RunPlan& plan);                  // every slice: what the copy brings
// The buffer: norm_partials_total rounded up to kDeviceGranuleBytes (0 when that is 0).
std::uint64_t device_norm_bytes(const RunPlan& plan);

// Every device allocation is a multiple of this (core/device/device.h: "aligned to at least 256
// bytes"; both backends round up to it), so a buffer the plan counts smaller than a block is
// counted as the block it takes.
inline constexpr std::uint64_t kDeviceGranuleBytes = 256;

// ZeroEngine::gather_master, between steps (weights export, tests): for a group split over several
// ranks, this rank's fp32 state range brought up ("io.gather", export_shard_bytes) and the whole
// group's fp32 master all-gathered into ("io.gather", export_gather_bytes); 0 for a group on one
// rank, which is read from its home directly. It allocates through the parameter fetcher, which
// gives back gathered copies nobody holds when the device is full, so between steps the bytes of
// the step's window are its to use: the tier planner counts the larger of the window and this
// (TierPlan::device_export, plan/tier_plan.h).
std::uint64_t export_shard_bytes(const RunPlan& plan, std::size_t g);
std::uint64_t export_gather_bytes(const RunPlan& plan, std::size_t g);

// TieredStateHome::init_group: the host buffer a chunk's state or W goes through on its way to
// NVMe (0 where nothing of the plan is on NVMe).
std::uint64_t init_chunk_staging_bytes(const RunPlan& plan);
// Host bytes ZeroEngine's construction holds at once to initialize a group: its fp32 values, their
// working-dtype copy when that is narrower (the largest group's), and the chunk staging above.
// Initial weights stream through it group by group into their homes, so this, not the model,
// bounds the import's memory.
std::uint64_t init_staging_bytes(const RunPlan& plan);

}  // namespace strata
