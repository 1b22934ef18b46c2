// The tier planner (see plan/tier_plan.h).
#include "plan/tier_plan.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "plan/part_bytes.h"
#include "plan/partition.h"
#include "offload/file.h"
#include "offload/swap_store.h"

namespace strata {

namespace {

std::uint64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t value = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

// The device bytes of group g while it is in use, each part's (see Note [Part bytes] in
// plan/part_bytes.h): gathered (stage 3), the shard fetched from the parameter tier before the
// all-gather, its micro-batch gradient and its reduction.
// Note [Groups gathered together]: a group's window also holds the gathered copies of the groups
// the model keeps acquired beside it (ParamGroupSpec::gathered_with: GPT-2's tied head holds the
// embedding, a tile its block's base). Without them a device capped at the tiny config's plan ran
// out at stage 3 by 64 KiB while the head's gradient was reduced.
std::uint64_t window_bytes(const RunPlan& rp, std::size_t g) {
  std::uint64_t window = gathered_bytes(rp, g) + fetched_shard_bytes(rp, g) + micro_grad_bytes(rp, g) +
                         reduced_grad_bytes(rp, g);
  for (const std::string& other : rp.groups[g].gathered_with) {
    for (std::size_t h = 0; h < rp.groups.size(); ++h) {
      // Not found: another pipeline stage's group, not this rank's.
      if (rp.groups[h].layout.name() == other) window += gathered_bytes(rp, h);
    }
  }
  return window;
}

}  // namespace

TierPlan plan_tiers(const RunPlan& rp, int world_size, std::uint64_t activation_bytes) {
  TierPlan p;
  const std::uint64_t wbytes = rp.working_bytes();
  const auto nstate = static_cast<std::uint64_t>(rp.state_arrays);
  const OffloadPlan& o = rp.offload;
  for (std::size_t g = 0; g < rp.groups.size(); ++g) {
    const GroupPlan& G = rp.groups[g];
    const GroupLayout& L = G.layout;
    p.model_state += static_cast<std::uint64_t>(L.payload_elems()) * (wbytes + 4 * nstate + 4);
    // The device home's master and moments, and the step's gradient buffers it keeps.
    p.device_optimizer += device_optimizer_bytes(rp, g);
    p.device_state += device_optimizer_bytes(rp, g) + device_grad_buffers(rp, g).total();
    // Host arrays are kept per chunk, each padded to 4 KiB (engine/offload_tier.h).
    for (const StateChunk& ch : G.chunks) {
      if (ch.state == Home::Host) p.host_arrays += rp.host_state_bytes(ch);
      if (ch.grads == Home::Host) {
        p.host_gradients += rp.host_gradient_bytes(ch);
        p.host_arrays += rp.host_gradient_bytes(ch);
      }
      if (G.weights == WeightsForm::ShardOnTier && ch.params == Home::Host) p.host_arrays += rp.host_param_bytes(ch);
    }
    p.device_weights += resident_weight_bytes(rp, g);
    const std::uint64_t window = window_bytes(rp, g);
    if (window > p.device_window || p.largest_group.empty()) {  // the first group where every window is 0
      p.device_window = window;
      p.largest_group = L.name();
      p.largest_group_bytes = unit_grad_bytes(rp, g);
    }
    p.device_export = std::max(p.device_export, export_shard_bytes(rp, g) + export_gather_bytes(rp, g));
    // Note [Reductions in flight] (engine/grad_reducer.cc): another group's micro-batch gradient
    // and its reduction may still be queued beside the group in use when the device has room for
    // them (on a device sized to the plan the allocation waits for them instead): at most the
    // largest such pair, nothing where the gradients are written in place.
    p.device_in_flight = std::max(p.device_in_flight, micro_grad_bytes(rp, g) + reduced_grad_bytes(rp, g));
  }
  // The norm's partials, one buffer kept with the state (Note [One wait for the norm] in
  // engine/state_home_device.cc).
  p.device_norm = device_norm_bytes(rp);
  p.activations = activation_bytes;
  p.pinned = o.pinned_bytes();
  p.nvme = o.swap_bytes * static_cast<std::uint64_t>(world_size);
  p.nvme_gradients = o.swap_gradient_bytes * static_cast<std::uint64_t>(world_size);
  p.nvme_files = offload::SwapStore::file_bytes(o.swap_capacity_bytes, o.nvme_dirs.size()) * o.nvme_dirs.size() *
                 static_cast<std::uint64_t>(world_size);
  p.nvme_dirs = o.nvme_dirs;
  p.nvme_queue_depth = o.io.queue_depth;
  p.nvme_read_request_bytes = offload::request_limits(o.io).read_bytes;
  p.nvme_write_request_bytes = offload::request_limits(o.io).write_bytes;
  p.host_budget = o.host_budget;
  p.state_chunks = o.state_chunks;
  p.spilled_state_chunks = o.spilled_state_chunks;
  p.spilled_grad_chunks = o.spilled_grad_chunks;
  p.param_chunks = o.param_chunks;
  p.spilled_param_chunks = o.spilled_param_chunks;
  return p;
}

TierPlan plan_tiers(const TrainConfig& c, std::span<const ParamGroupSpec> groups, int world_size,
                    std::uint64_t activation_bytes) {
  return plan_tiers(make_run_plan(c, groups, world_size, 0), world_size, activation_bytes);
}

HostFacts measure_host(int ranks_on_node, std::uint64_t device_in_host) {
  return HostFacts{mem_available_bytes(), std::max(1, ranks_on_node), device_in_host};
}

std::uint64_t auto_host_budget(const HostFacts& host) {
  const std::uint64_t share = host.mem_available / 4 * 3 / static_cast<std::uint64_t>(std::max(1, host.ranks_on_node));
  const std::uint64_t left = share > host.device_in_host ? share - host.device_in_host : 0;
  return std::max<std::uint64_t>(left, std::uint64_t{64} << 20);
}

Placement resolve_placement(const TrainConfig& config, std::span<const ParamGroupSpec> groups, int world_size,
                            std::uint64_t activation_bytes, std::uint64_t device_bytes, const HostFacts& host) {
  Placement out{config, {}};
  TrainConfig& c = out.config;
  OffloadTuning& tuning = c.strata.offload;
  if (tuning.host_budget_auto) {
    tuning.host_budget_bytes = auto_host_budget(host);
    out.why.push_back(fmt::format(
        "host budget {} per rank (strata.offload.host_budget \"auto\": 3/4 of MemAvailable {} over {} rank(s){})",
        format_bytes(tuning.host_budget_bytes), format_bytes(host.mem_available), host.ranks_on_node,
        host.device_in_host > 0 ? fmt::format(", less the sim device's {}", format_bytes(host.device_in_host)) : ""));
  }
  OffloadDevice& opt = c.zero.offload_optimizer.device;
  OffloadDevice& par = c.zero.offload_param.device;
  if (opt != OffloadDevice::Auto && par != OffloadDevice::Auto) return out;
  const std::uint64_t usable = device_bytes - device_bytes / 10;
  // The device bytes of a candidate; the host budget plays no part in them.
  const auto device_need = [&](TrainConfig k) {
    k.strata.offload.host_budget_bytes = 0;
    return plan_tiers(make_run_plan(k, groups, world_size, 0), world_size, activation_bytes).device_total();
  };
  const auto decide = [&](const char* what, TrainConfig k) {
    const std::uint64_t need = device_need(k);
    const bool fits = need <= usable;
    out.why.push_back(fmt::format("{} (device \"auto\"): {}; with it on the device each rank needs {} of the "
                                  "device's {} (a tenth kept spare)",
                                  what, fits ? "on the device" : "offloaded: host memory up to the budget, then NVMe",
                                  format_bytes(need), format_bytes(device_bytes)));
    if (fits) c = std::move(k);
    return fits;
  };
  // The parameters first: they are fetched on the critical path. The optimizer state can stay on
  // the device only with them (offloaded weights are written by the offloaded update).
  if (par == OffloadDevice::Auto) {
    TrainConfig k = c;
    k.zero.offload_param.device = OffloadDevice::None;
    if (!decide("sharded working weights", k)) return out;
  }
  if (opt == OffloadDevice::Auto && par == OffloadDevice::None) {
    TrainConfig k = c;
    k.zero.offload_optimizer.device = OffloadDevice::None;
    decide("optimizer state and gradient sums", k);
  }
  return out;
}

PlacedRun place_run(const TrainConfig& config, std::span<const ParamGroupSpec> groups, int data_world, int rank,
                    int ranks_on_node, std::uint64_t activation_bytes, std::uint64_t device_bytes,
                    const HostFacts& host) {
  Placement placed = resolve_placement(config, groups, data_world, activation_bytes, device_bytes, host);
  PlacedRun out{std::move(placed.config), {}, {}};
  out.run = make_run_plan(out.config, groups, data_world, rank);
  out.tiers = plan_tiers(out.run, ranks_on_node, activation_bytes);
  out.tiers.placement = std::move(placed.why);
  return out;
}

TierCapacities measure_capacities(const TierPlan& plan, std::uint64_t device_bytes, int ranks_on_node) {
  TierCapacities cap;
  cap.device = device_bytes;
  cap.host_available = mem_available_bytes();
  cap.ranks_on_node = std::max(1, ranks_on_node);
  for (const auto& d : plan.nvme_dirs) {
    std::filesystem::path p = std::filesystem::absolute(d);
    std::error_code ec;
    while (!p.empty() && !std::filesystem::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) {
      p = p.parent_path();
    }
    cap.nvme_free.push_back(offload::free_bytes(p.string()));
  }
  return cap;
}

void check_plan_fits(const TierPlan& p, const TierCapacities& cap, const std::string& source) {
  if (p.device_total() > cap.device) {
    // Name the largest contributor and its knob.
    struct Part {
      std::uint64_t bytes;
      std::string what;
      std::string fix;
    };
    std::vector<Part> parts = {
        {p.device_state + p.device_norm, "optimizer state and gradient sums",
         "offload them: zero_optimization.offload_optimizer.device = \"cpu\" or \"nvme\" (stage 1-3)"},
        {p.device_weights, "resident working weights",
         "shard them with zero_optimization.stage = 3 and offload_param.device = \"cpu\" or \"nvme\", or lower "
         "stage3_param_persistence_threshold"},
        {std::max(p.device_window, p.device_export),
         p.device_export > p.device_window
             ? std::string("the largest param group's fp32 master gathered between steps (its export)")
             : fmt::format("the largest param group '{}' in use ({} gathered, plus its gradient)", p.largest_group,
                           format_bytes(p.largest_group_bytes)),
         "tile it (strata.tiling) so it is fetched in pieces"},
        {p.activations, "activations of one micro-batch",
         "lower train_micro_batch_size_per_gpu or strata.data.seq_len, or set strata.model.checkpoint_activations"},
    };
    const Part& top = *std::max_element(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.bytes < b.bytes; });
    throw ConfigError(fmt::format(
        "{}: this config cannot fit the device: each rank needs at least {} at once but the device holds {} "
        "(optimizer state {}, working weights {}, largest group in use {}, activations {}). The largest part is {}: "
        "{}; or raise strata.device.memory",
        source, format_bytes(p.device_total()), format_bytes(cap.device), format_bytes(p.device_state + p.device_norm),
        format_bytes(p.device_weights), format_bytes(std::max(p.device_window, p.device_export)),
        format_bytes(p.activations), top.what, top.fix));
  }
  const std::uint64_t host_need = p.host_total() * static_cast<std::uint64_t>(cap.ranks_on_node);
  if (cap.host_available > 0 && host_need > cap.host_available) {
    throw ConfigError(fmt::format(
        "{}: this config cannot fit host memory: {} rank(s) need {} of host memory ({} offloaded arrays and {} pinned "
        "staging each) but {} is available; offload to \"nvme\" instead of \"cpu\" (or \"auto\", which spills past strata.offload.host_budget), or lower strata.offload.pinned_buffer",
        source, cap.ranks_on_node, format_bytes(host_need), format_bytes(p.host_arrays), format_bytes(p.pinned),
        format_bytes(cap.host_available)));
  }
  if (!p.nvme_dirs.empty()) {
    const std::uint64_t per_dir = p.nvme_files / p.nvme_dirs.size();
    for (std::size_t i = 0; i < p.nvme_dirs.size(); ++i) {
      const std::uint64_t free = i < cap.nvme_free.size() ? cap.nvme_free[i] : 0;
      if (per_dir > free) {
        throw ConfigError(fmt::format(
            "{}: NVMe directory '{}' has {} free but this config's swap files take {} there ({} in all over {} "
            "director{}: {} of state and gradients plus the store's room); free space, add directories to "
            "nvme_path, or offload less to NVMe",
            source, p.nvme_dirs[i], format_bytes(free), format_bytes(per_dir), format_bytes(p.nvme_files),
            p.nvme_dirs.size(), p.nvme_dirs.size() == 1 ? "y" : "ies", format_bytes(p.nvme)));
      }
    }
  }
}

std::string describe_plan(const TierPlan& p, const TierCapacities& cap) {
  std::ostringstream o;
  o << fmt::format("tier plan per rank: device {} of {} (state {}, weights {}, group window {}{}, activations {})",
                   format_bytes(p.device_total()), format_bytes(cap.device), format_bytes(p.device_state),
                   format_bytes(p.device_weights), format_bytes(p.device_window),
                   p.device_export > p.device_window
                       ? fmt::format(", below the export between steps {}", format_bytes(p.device_export))
                       : std::string(),
                   format_bytes(p.activations));
  o << fmt::format("; host {} ({} arrays + {} pinned)", format_bytes(p.host_total()), format_bytes(p.host_arrays),
                   format_bytes(p.pinned));
  if (!p.nvme_dirs.empty()) {
    o << fmt::format("; nvme {} in swap files of {} over {} dir(s), queue depth {}, requests up to {} read / {} write",
                     format_bytes(p.nvme), format_bytes(p.nvme_files), p.nvme_dirs.size(), p.nvme_queue_depth,
                     format_bytes(p.nvme_read_request_bytes), format_bytes(p.nvme_write_request_bytes));
  }
  o << fmt::format("; model state {} = {:.1f}x the device", format_bytes(p.model_state),
                   cap.device > 0 ? static_cast<double>(p.model_state) / static_cast<double>(cap.device) : 0.0);
  for (const std::string& line : p.placement) o << "\n  placement: " << line;
  const auto spill = [&](const char* what, std::size_t spilled, std::size_t chunks) {
    if (spilled == 0) return;
    o << fmt::format("\n  placement: past the host budget {}, {} of {} chunks of {} are on NVMe",
                     format_bytes(p.host_budget), spilled, chunks, what);
  };
  spill("sharded working weights", p.spilled_param_chunks, p.param_chunks);
  spill("gradient sums", p.spilled_grad_chunks, p.state_chunks);
  spill("optimizer state", p.spilled_state_chunks, p.state_chunks);
  return o.str();
}

}  // namespace strata
