// The bytes each part of the ZeRO engine allocates (see plan/part_bytes.h, Note [Part bytes] in plan/part_bytes.h).
#include "plan/part_bytes.h"

#include <algorithm>

#include "offload/swap_store.h"
#include "optim/exact_squares.h"
#include "optim/grad_stats.h"

namespace strata {

namespace {

std::uint64_t working_elems_bytes(const RunPlan& plan, std::size_t elems) {
  return static_cast<std::uint64_t>(elems) * plan.working_bytes();
}

}  // namespace

std::uint64_t resident_weight_bytes(const RunPlan& plan, std::size_t g) {
  return working_elems_bytes(plan, plan.groups[g].device_weight_elems());
}

std::uint64_t gathered_bytes(const RunPlan& plan, std::size_t g) {
  const GroupPlan& G = plan.groups[g];
  return G.sharded_params ? working_elems_bytes(plan, G.layout.total_elems()) : 0;
}

std::uint64_t fetched_shard_bytes(const RunPlan& plan, std::size_t g) {
  const GroupPlan& G = plan.groups[g];
  const bool through_device_shard = G.weights == WeightsForm::ShardOnTier && G.layout.shard_count() > 1;
  return through_device_shard ? tier_shard_bytes(plan, g) : 0;
}

std::uint64_t tier_shard_bytes(const RunPlan& plan, std::size_t g) {
  const GroupPlan& G = plan.groups[g];
  return G.weights == WeightsForm::ShardOnTier ? working_elems_bytes(plan, G.layout.shard_elems()) : 0;
}

std::uint64_t unit_grad_bytes(const RunPlan& plan, std::size_t g) {
  return working_elems_bytes(plan, plan.groups[g].layout.total_elems());
}

std::uint64_t reduced_unit_bytes(const RunPlan& plan, std::size_t g) {
  return working_elems_bytes(plan, plan.groups[g].grad_elems);
}

bool grads_in_place(const RunPlan& plan, std::size_t g) {
  const GroupPlan& G = plan.groups[g];
  return plan.gradients_in_place() && G.grad_elems == G.layout.total_elems();
}

bool reduction_in_home(const RunPlan& plan) { return !plan.optimizer_offloaded() && plan.accumulation == 1; }

std::uint64_t micro_grad_bytes(const RunPlan& plan, std::size_t g) {
  return grads_in_place(plan, g) ? 0 : unit_grad_bytes(plan, g);
}

std::uint64_t reduced_grad_bytes(const RunPlan& plan, std::size_t g) {
  return reduction_in_home(plan) ? 0 : reduced_unit_bytes(plan, g);
}

std::uint64_t device_state_array_bytes(const RunPlan& plan, std::size_t g) {
  return plan.optimizer_offloaded() ? 0 : 4 * static_cast<std::uint64_t>(plan.groups[g].state_elems);
}

std::uint64_t device_optimizer_bytes(const RunPlan& plan, std::size_t g) {
  return static_cast<std::uint64_t>(plan.state_arrays) * device_state_array_bytes(plan, g);
}

DeviceGradBuffers device_grad_buffers(const RunPlan& plan, std::size_t g) {
  if (plan.optimizer_offloaded()) return {};
  const std::uint64_t elems = plan.groups[g].grad_elems;
  if (plan.accumulation == 1) return {"grad.step", 1, elems * plan.working_bytes()};
  if (plan.grad_partials == 1) return {"grad.accum", 1, 4 * elems};
  return {"grad.levels", plan.grad_partials, 4 * elems};
}

std::uint64_t final_grad_bytes(const RunPlan& plan, std::size_t g) {
  return static_cast<std::uint64_t>(plan.groups[g].grad_elems) * dtype_bytes(plan.final_grad_dtype());
}

std::uint64_t norm_partials_bytes(const RunPlan& plan, std::size_t g) {
  if (plan.optimizer_offloaded()) return 0;
  const std::size_t n = plan.groups[g].grad_elems;
  if (plan.exact) return optim::exact_sum_squares_parts(n) * sizeof(optim::ExactSquares);
  return optim::sum_squares_blocks(n) * sizeof(double);
}

std::uint64_t norm_partials_offset(const RunPlan& plan, std::size_t g) {
  std::uint64_t offset = 0;
  for (std::size_t h = 0; h < g; ++h) offset += norm_partials_bytes(plan, h);
  return offset;
}

std::uint64_t norm_partials_total(const RunPlan& plan) { return norm_partials_offset(plan, plan.groups.size()); }

std::uint64_t device_norm_bytes(const RunPlan& plan) {
  const std::uint64_t total = norm_partials_total(plan);
  return (total + kDeviceGranuleBytes - 1) / kDeviceGranuleBytes * kDeviceGranuleBytes;
}

std::uint64_t export_shard_bytes(const RunPlan& plan, std::size_t g) {
  const GroupPlan& G = plan.groups[g];
  return G.layout.shard_count() > 1 ? 4 * static_cast<std::uint64_t>(G.state_elems) : 0;
}

std::uint64_t export_gather_bytes(const RunPlan& plan, std::size_t g) {
  const GroupPlan& G = plan.groups[g];
  return G.layout.shard_count() > 1 ? 4 * static_cast<std::uint64_t>(G.layout.total_elems()) : 0;
}

std::uint64_t init_chunk_staging_bytes(const RunPlan& plan) {
  if (plan.offload.swap_bytes == 0) return 0;
  const std::uint64_t per_elem =
      std::max<std::uint64_t>(4u * static_cast<std::uint64_t>(plan.state_arrays), plan.working_bytes());
  return offload::SwapStore::padded(per_elem * plan.offload.chunk_elems);
}

std::uint64_t init_staging_bytes(const RunPlan& plan) {
  const std::uint64_t narrow = plan.working != DType::F32 ? plan.working_bytes() : 0;
  std::uint64_t most = 0;
  for (const GroupPlan& G : plan.groups) most = std::max<std::uint64_t>(most, G.layout.total_elems() * (4 + narrow));
  return most + init_chunk_staging_bytes(plan);
}

}  // namespace strata
