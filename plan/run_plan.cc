// The run plan (see plan/run_plan.h, Note [Run plan] in plan/run_plan.h).
#include "plan/run_plan.h"

#include <algorithm>
#include <bit>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "offload/buffer_pool.h"
#include "offload/swap_store.h"
#include "optim/cpu_exec.h"

namespace strata {

namespace {

constexpr std::size_t kBlock = optim::kCpuBlockElems;

Home home_of(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::None: return Home::Device;
    case OffloadDevice::Cpu: return Home::Host;
    case OffloadDevice::Nvme: return Home::Nvme;
    case OffloadDevice::Auto: return Home::Host;  // preferred; chunks past the host budget spill to NVMe
  }
  return Home::Device;
}

std::uint64_t round4k(std::uint64_t b) { return (b + 4095) / 4096 * 4096; }

WeightsForm weights_form(const RunPlan& p, bool sharded) {
  const bool fp32_master_on_device = p.working == DType::F32 && !p.optimizer_offloaded();
  if (sharded) {
    if (p.params_offloaded()) return WeightsForm::ShardOnTier;
    return fp32_master_on_device ? WeightsForm::ShardIsMaster : WeightsForm::Shard;
  }
  return fp32_master_on_device && p.stage == 0 ? WeightsForm::FullIsMaster : WeightsForm::Full;
}

// Binary-counter levels a group may hold on a tier at once, with the one being formed.
int counter_levels(int accumulation) { return std::bit_width(static_cast<unsigned>(accumulation)) + 1; }

// Chunk size: the most any chunk job stages in one pinned slot per element (a combine's staging,
// partial sums, scratch, plus the state and new weights of an overlapped update), times the chunk,
// fits a slot (engine/state_home_tiered.cc builds those jobs).
void plan_chunks(const TrainConfig& c, RunPlan& p) {
  OffloadPlan& o = p.offload;
  const std::size_t wbytes = p.working_bytes();
  const auto levels = static_cast<std::size_t>(counter_levels(c.gradient_accumulation_steps));
  const std::size_t per_elem = 2 * wbytes + 4 * (static_cast<std::size_t>(p.state_arrays) + 2 + levels);
  o.slot_count = static_cast<std::size_t>(c.zero.offload_optimizer.buffer_count);
  const std::size_t slot_budget = c.strata.offload.pinned_buffer_bytes / o.slot_count;
  std::size_t chunk = slot_budget / per_elem / kBlock * kBlock;
  if (chunk == 0) {
    throw ConfigError(fmt::format(
        "{}: strata.offload.pinned_buffer = {} split into offload_optimizer.buffer_count = {} slots leaves {} per "
        "slot; a slot must hold at least {} (one optimizer block of {} elements at {} bytes each); raise "
        "strata.offload.pinned_buffer or lower buffer_count",
        c.source, format_bytes(c.strata.offload.pinned_buffer_bytes), o.slot_count, format_bytes(slot_budget),
        format_bytes(per_elem * kBlock), kBlock, per_elem));
  }
  const std::size_t sub_group = std::max(kBlock, c.zero.sub_group_size_elems / kBlock * kBlock);
  o.chunk_elems = std::min(chunk, sub_group);
  o.slot_bytes = per_elem * o.chunk_elems;
  o.pin_optimizer = c.zero.offload_optimizer.pin_memory;
  for (GroupPlan& G : p.groups) {
    for (std::size_t b = 0; b < G.state_elems; b += o.chunk_elems) {
      G.chunks.push_back(StateChunk{b, std::min(o.chunk_elems, G.state_elems - b)});
    }
  }
}

// Parameter shards on a tier: every shard must fit offload_param.buffer_size; NVMe fetches go
// through buffer_count pinned slots of the largest shard.
void plan_param_tier(const TrainConfig& c, RunPlan& p) {
  const OffloadConfig& op = c.zero.offload_param;
  std::size_t largest = 0;
  std::string largest_group;
  for (const GroupPlan& G : p.groups) {
    if (G.weights == WeightsForm::ShardOnTier && G.state_elems > largest) {
      largest = G.state_elems;
      largest_group = G.layout.name();
    }
  }
  if (largest > op.buffer_size_elems) {
    throw ConfigError(fmt::format("{}: zero_optimization.offload_param.buffer_size = {} elements is smaller than the "
                                  "largest parameter shard ({} elements, group {}); raise buffer_size or tile the "
                                  "layer (strata.tiling)",
                                  c.source, op.buffer_size_elems, largest, largest_group));
  }
  p.offload.pin_params = op.pin_memory;
  // With "auto" the slots are kept only if a shard spills (place_chunks).
  if ((op.device == OffloadDevice::Nvme || op.device == OffloadDevice::Auto) && largest > 0) {
    p.offload.param_slot_count = static_cast<std::size_t>(op.buffer_count);
    p.offload.param_slot_bytes = offload::SwapStore::padded(largest * p.working_bytes());
  }
}

// Note [Spill across tiers]: each chunk's arrays get a home. A section offloaded to "cpu" or "nvme"
// puts all its chunks there. A section with device "auto" puts its chunks in host memory while the
// host budget (strata.offload.host_budget) lasts and spills the rest to NVMe, chunk by chunk. The
// budget pays, in order: the pinned pools and the arrays of sections fixed on the host; then, for
// "auto", what moves most bytes per byte held, with A micro-batches per step: the parameter shards
// (read in forward, recompute and backward of every micro-batch, written once: 3A + 1 transfers per
// byte, on the critical path), the gradient partial sums (read and written by every micro-batch's
// combine: about 2A), then the master weights and moments (read and written once: 2), each in group
// and chunk order. Which
// tier a chunk lives on never changes the bits: every tier runs the same chunk jobs on the same
// numbers (tests/engine/spill_test.cc). Whether the device itself holds the state is decided
// before this, by resolve_placement (plan/tier_plan.h).
class HostBudget {
 public:
  HostBudget(std::uint64_t budget, std::uint64_t used) : budget_(budget), used_(used) {}
  bool limited() const { return budget_ > 0; }
  std::uint64_t used() const { return used_; }
  // Takes `bytes` when they fit (always, without a limit).
  bool take(std::uint64_t bytes) {
    if (limited() && used_ + bytes > budget_) return false;
    used_ += bytes;
    return true;
  }

 private:
  std::uint64_t budget_;
  std::uint64_t used_;
};

[[noreturn]] void fail_no_spill_dir(const TrainConfig& c, const char* section, std::uint64_t budget,
                                    std::uint64_t used, std::size_t spilled, std::size_t chunks) {
  throw ConfigError(fmt::format(
      "{}: zero_optimization.{}.device = \"auto\": strata.offload.host_budget = {} is used up after {} of host "
      "memory, so {} of {} chunks must spill to NVMe, but no nvme_path is set; set zero_optimization.{}.nvme_path "
      "to a directory on a local NVMe drive, or raise strata.offload.host_budget",
      c.source, section, format_bytes(budget), format_bytes(used), spilled, chunks, section));
}

// Every chunk at its section's fixed tier ("auto" starts on the host); returns the bytes of the
// host arrays of the sections offloaded to "cpu".
std::uint64_t place_fixed(const TrainConfig& c, RunPlan& p) {
  OffloadPlan& o = p.offload;
  const OffloadDevice opt = c.zero.offload_optimizer.device;
  const OffloadDevice par = c.zero.offload_param.device;
  const Home fixed_state = opt == OffloadDevice::Nvme ? Home::Nvme : Home::Host;  // and its gradient sums
  const Home fixed_params = par == OffloadDevice::Nvme ? Home::Nvme : Home::Host;
  std::uint64_t cpu_arrays = 0;
  for (GroupPlan& G : p.groups) {
    const bool tier_params = G.weights == WeightsForm::ShardOnTier;
    for (StateChunk& ch : G.chunks) {
      ch.state = fixed_state;
      ch.grads = fixed_state;
      ch.params = fixed_params;
      if (opt == OffloadDevice::Cpu) cpu_arrays += p.host_state_bytes(ch) + p.host_gradient_bytes(ch);
      if (tier_params && par == OffloadDevice::Cpu) cpu_arrays += p.host_param_bytes(ch);
      ++o.state_chunks;
      if (tier_params) ++o.param_chunks;
    }
  }
  return cpu_arrays;
}

// The pinned pools alone never spill: past the budget they are refused before anything is pinned,
// "auto" budget or not (pinning more than the host can spare stalls the machine for minutes).
void check_fixed_host_bytes(const TrainConfig& c, const OffloadPlan& o, std::uint64_t pinned,
                            std::uint64_t cpu_arrays) {
  const std::uint64_t fixed = pinned + cpu_arrays;
  if (o.host_budget > 0 && (pinned > o.host_budget || (fixed > o.host_budget && !c.strata.offload.host_budget_auto))) {
    const std::string arrays =
        cpu_arrays == 0 ? "" : fmt::format(" and the arrays offloaded to \"cpu\" {}", format_bytes(cpu_arrays));
    const std::string devices =
        cpu_arrays == 0 ? "" : ", or set the offload device to \"auto\" (spills to nvme_path) or \"nvme\"";
    const std::string budget = c.strata.offload.host_budget_auto ? fmt::format("\"auto\" ({})", format_bytes(o.host_budget))
                                                                 : format_bytes(o.host_budget);
    throw ConfigError(fmt::format("{}: strata.offload.host_budget = {} but the pinned staging pools take {}{}; raise the "
                                  "budget, lower strata.offload.pinned_buffer or the offload buffer_count{}",
                                  c.source, budget, format_bytes(pinned), arrays, devices));
  }
}

// offload_param "auto": the parameter shards stay on the host while the budget pays them, else the
// rest spill to NVMe, their fetch slots paid first.
void spill_params(const TrainConfig& c, RunPlan& p, HostBudget& budget) {
  OffloadPlan& o = p.offload;
  std::uint64_t all = 0;
  for (GroupPlan& G : p.groups) {
    for (StateChunk& ch : G.chunks) all += G.weights == WeightsForm::ShardOnTier ? p.host_param_bytes(ch) : 0;
  }
  // Spilling any shard needs the NVMe fetch slots: the budget pays them first.
  const std::uint64_t slots = o.param_slot_count * offload::BufferPool::rounded_slot_bytes(o.param_slot_bytes);
  if (budget.take(all) || o.param_slot_count == 0) return;
  if (!budget.take(slots) && !c.strata.offload.host_budget_auto) {
    throw ConfigError(fmt::format(
        "{}: strata.offload.host_budget = {} cannot hold the parameter shards ({}), so they spill to NVMe, but "
        "then it cannot pay their {} pinned fetch slots either ({} in use before them); raise the budget, or "
        "lower zero_optimization.offload_param.buffer_count",
        c.source, format_bytes(o.host_budget), format_bytes(all), format_bytes(slots), format_bytes(budget.used())));
  }
  for (GroupPlan& G : p.groups) {
    if (G.weights != WeightsForm::ShardOnTier) continue;
    for (StateChunk& ch : G.chunks) {
      if (budget.take(p.host_param_bytes(ch))) continue;
      ch.params = Home::Nvme;
      ++o.spilled_param_chunks;
    }
  }
}

// offload_optimizer "auto": gradient sums first, then state, each chunk on the host while the
// budget pays it, else on NVMe.
void spill_state(RunPlan& p, HostBudget& budget) {
  OffloadPlan& o = p.offload;
  for (GroupPlan& G : p.groups) {
    for (StateChunk& ch : G.chunks) {
      if (budget.take(p.host_gradient_bytes(ch))) continue;
      ch.grads = Home::Nvme;
      ++o.spilled_grad_chunks;
    }
  }
  for (GroupPlan& G : p.groups) {
    for (StateChunk& ch : G.chunks) {
      if (budget.take(p.host_state_bytes(ch))) continue;
      ch.state = Home::Nvme;
      ++o.spilled_state_chunks;
    }
  }
}

void place_chunks(const TrainConfig& c, RunPlan& p) {
  OffloadPlan& o = p.offload;
  const OffloadDevice opt = c.zero.offload_optimizer.device;
  const OffloadDevice par = c.zero.offload_param.device;
  o.host_budget = c.strata.offload.host_budget_bytes;
  // What the budget pays before any "auto" chunk: the pinned pools and the fixed host arrays.
  std::uint64_t pinned = o.slot_count > 0 ? o.slot_count * offload::BufferPool::rounded_slot_bytes(o.slot_bytes) : 0;
  if (par == OffloadDevice::Nvme) pinned += o.param_slot_count * offload::BufferPool::rounded_slot_bytes(o.param_slot_bytes);
  const std::uint64_t cpu_arrays = place_fixed(c, p);
  check_fixed_host_bytes(c, o, pinned, cpu_arrays);
  HostBudget budget(o.host_budget, pinned + cpu_arrays);
  if (par == OffloadDevice::Auto) spill_params(c, p, budget);
  if (opt == OffloadDevice::Auto) spill_state(p, budget);
  if (par != OffloadDevice::Nvme && o.spilled_param_chunks == 0) {
    o.param_slot_count = 0;
    o.param_slot_bytes = 0;
  }
  if ((o.spilled_param_chunks > 0 || o.spilled_grad_chunks > 0 || o.spilled_state_chunks > 0) && nvme_dirs_of(c).empty()) {
    const bool params = o.spilled_param_chunks > 0;
    fail_no_spill_dir(c, params ? "offload_param" : "offload_optimizer", o.host_budget, budget.used(),
                      params ? o.spilled_param_chunks : std::max(o.spilled_grad_chunks, o.spilled_state_chunks),
                      params ? o.param_chunks : o.state_chunks);
  }
}

// What the swap store holds at most: the state and gradient partial sums of every chunk whose
// state is on NVMe, the shard of every chunk whose weights are; with room for the extent
// allocator's fragmentation and the per-file rounding of striping.
void plan_swap(const TrainConfig& c, int rank, RunPlan& p) {
  OffloadPlan& o = p.offload;
  const std::uint64_t wbytes = p.working_bytes();
  const auto partials = static_cast<std::uint64_t>(p.grad_partials);
  std::uint64_t bytes = 0;
  std::uint64_t gradient_bytes = 0;
  for (const GroupPlan& G : p.groups) {
    for (const StateChunk& ch : G.chunks) {
      if (ch.state == Home::Nvme) {
        bytes += offload::SwapStore::padded(static_cast<std::uint64_t>(p.state_arrays) * 4 * ch.elems);
      }
      if (ch.grads == Home::Nvme) gradient_bytes += partials * offload::SwapStore::padded(4 * ch.elems);
      if (G.weights == WeightsForm::ShardOnTier && ch.params == Home::Nvme) {
        bytes += offload::SwapStore::padded(wbytes * ch.elems);
      }
    }
  }
  bytes += gradient_bytes;
  if (bytes == 0) return;
  o.swap_gradient_bytes = gradient_bytes;
  o.nvme_dirs = nvme_dirs_of(c);
  o.swap_file_name = swap_file_name(rank);
  o.swap_bytes = bytes;
  o.swap_capacity_bytes = bytes + bytes / 8 + (std::uint64_t{16} << 20) * o.nvme_dirs.size();
  o.io = io_engine_options(c.aio);
}

}  // namespace

std::size_t GroupPlan::device_weight_elems() const {
  switch (weights) {
    case WeightsForm::Full: return layout.total_elems();
    case WeightsForm::Shard: return layout.shard_elems();
    case WeightsForm::FullIsMaster:
    case WeightsForm::ShardIsMaster:
    case WeightsForm::ShardOnTier: return 0;
  }
  return 0;
}

std::uint64_t RunPlan::host_state_bytes(const StateChunk& c) const {
  return round4k(4 * static_cast<std::uint64_t>(state_arrays) * c.elems);
}

std::uint64_t RunPlan::host_gradient_bytes(const StateChunk& c) const {
  return static_cast<std::uint64_t>(grad_partials) * round4k(4 * c.elems);
}

std::uint64_t RunPlan::host_param_bytes(const StateChunk& c) const { return round4k(working_bytes() * c.elems); }

bool RunPlan::params_on_nvme(std::size_t g) const {
  const GroupPlan& G = groups[g];
  if (G.weights != WeightsForm::ShardOnTier) return false;
  return std::any_of(G.chunks.begin(), G.chunks.end(), [](const StateChunk& c) { return c.params == Home::Nvme; });
}

bool RunPlan::state_on_nvme() const {
  return std::any_of(groups.begin(), groups.end(), [](const GroupPlan& G) {
    return std::any_of(G.chunks.begin(), G.chunks.end(), [](const StateChunk& c) { return c.state == Home::Nvme; });
  });
}

bool RunPlan::grads_on_nvme() const {
  return std::any_of(groups.begin(), groups.end(), [](const GroupPlan& G) {
    return std::any_of(G.chunks.begin(), G.chunks.end(), [](const StateChunk& c) { return c.grads == Home::Nvme; });
  });
}

std::uint64_t OffloadPlan::pinned_bytes() const {
  std::uint64_t bytes = 0;
  if (slot_count > 0) bytes += slot_count * offload::BufferPool::rounded_slot_bytes(slot_bytes);
  if (param_slot_count > 0) bytes += param_slot_count * offload::BufferPool::rounded_slot_bytes(param_slot_bytes);
  return bytes;
}

DType working_dtype_of(Precision precision) {
  switch (precision) {
    case Precision::Bf16: return DType::BF16;
    case Precision::Fp16: return DType::F16;
    case Precision::Fp32: return DType::F32;
  }
  return DType::F32;
}

std::vector<std::string> nvme_dirs_of(const TrainConfig& c) {
  std::vector<std::string> dirs;
  std::set<std::string> seen;
  for (const OffloadConfig* o : {&c.zero.offload_optimizer, &c.zero.offload_param}) {
    if (o->device != OffloadDevice::Nvme && o->device != OffloadDevice::Auto) continue;
    for (const auto& d : o->nvme_paths) {
      if (seen.insert(d).second) dirs.push_back(d);
    }
  }
  return dirs;
}

std::string swap_file_name(int rank) { return fmt::format("strata-swap-rank{}.bin", rank); }

offload::IoEngineOptions io_engine_options(const AioConfig& aio) {
  offload::IoEngineOptions io;
  io.kind = offload::parse_engine_kind(aio.engine, "aio.engine");
  io.queue_depth = static_cast<unsigned>(aio.queue_depth);
  io.max_request_bytes = static_cast<std::size_t>(aio.request_bytes);
  io.max_write_request_bytes = static_cast<std::size_t>(aio.write_request_bytes);
  return io;
}

optim::OptimizerKind optimizer_kind_of(const OptimizerConfig& o) {
  if (o.type == "SGD") return optim::OptimizerKind::Sgd;
  if (o.type == "Lion") return optim::OptimizerKind::Lion;
  if (o.type == "Adam") return optim::OptimizerKind::Adam;
  STRATA_CHECK(o.type == "AdamW", "optimizer type '{}' passed the config parser", o.type);
  return optim::OptimizerKind::AdamW;
}

optim::ParamGroup make_optimizer(const OptimizerConfig& o) {
  const std::string where = "optimizer.params";
  switch (optimizer_kind_of(o)) {
    case optim::OptimizerKind::Sgd: {
      optim::SgdParams p;
      p.lr = o.lr;
      p.momentum = o.momentum;
      p.weight_decay = o.weight_decay;
      return optim::ParamGroup::sgd(where, p);
    }
    case optim::OptimizerKind::Lion: {
      optim::LionParams p;
      p.lr = o.lr;
      p.beta1 = o.beta1;
      p.beta2 = o.beta2;
      p.weight_decay = o.weight_decay;
      return optim::ParamGroup::lion(where, p);
    }
    case optim::OptimizerKind::Adam:
    case optim::OptimizerKind::AdamW: break;
  }
  optim::AdamParams p;
  p.lr = o.lr;
  p.beta1 = o.beta1;
  p.beta2 = o.beta2;
  p.eps = o.eps;
  p.weight_decay = o.weight_decay;
  p.bias_correction = o.bias_correction ? optim::BiasCorrection::On : optim::BiasCorrection::Off;
  return optim::ParamGroup::adam(where, optimizer_kind_of(o), p);
}

RunPlan make_run_plan(const TrainConfig& c, std::span<const ParamGroupSpec> groups, int world_size, int rank) {
  RunPlan p;
  p.stage = c.zero.stage;
  p.topo = make_shard_topology(world_size, rank, p.stage, c.zero.sharding_factor);
  p.shard_count = p.stage == 0 ? 1 : p.topo.sharding_factor;
  p.shard_index = p.stage == 0 ? 0 : p.topo.shard_index();
  p.working = working_dtype_of(c.precision);
  p.state_arrays = optim::state_arrays(optimizer_kind_of(c.optimizer));
  p.exact = c.strata.exact;
  p.grad_partials = c.strata.exact ? counter_levels(c.gradient_accumulation_steps) : 1;
  p.accumulation = c.gradient_accumulation_steps;
  p.offload.optimizer = home_of(c.zero.offload_optimizer.device);
  p.offload.params = home_of(c.zero.offload_param.device);

  for (const ParamGroupSpec& spec : groups) {
    GroupPlan G(spec, p.shard_count);
    const GroupLayout& L = G.layout;
    G.sharded_params = p.stage == 3 && L.payload_elems() > c.zero.param_persistence_threshold_elems;
    G.state_offset = p.stage == 0 ? 0 : L.shard_begin(p.shard_index);
    G.state_elems = p.stage == 0 ? L.total_elems() : L.shard_elems();
    G.grad_elems = p.stage >= 2 ? L.shard_elems() : L.total_elems();
    G.grad_offset = p.stage == 1 ? G.state_offset : 0;
    G.weights = weights_form(p, G.sharded_params);
    p.groups.push_back(std::move(G));
  }
  if (p.optimizer_offloaded()) {
    plan_chunks(c, p);
    plan_param_tier(c, p);
    place_chunks(c, p);
    plan_swap(c, rank, p);
  }
  return p;
}

}  // namespace strata
