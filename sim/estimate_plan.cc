// `strata estimate`'s numbers (sim/estimate_plan.h, Note [One plan for estimate and train] in sim/estimate_plan.h).
#include "sim/estimate_plan.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "core/device/device.h"
#include "core/error.h"
#include "core/units.h"
#include "plan/deepspeed_estimate.h"
#include "plan/run_plan.h"
#include "models/decoder.h"
#include "models/decoder_params.h"
#include "models/model_config.h"
#include "models/pipeline.h"
#include "models/pipeline_runner.h"
#include "models/tiling_plan.h"
#include "train/trainer.h"

namespace strata::sim {

namespace {

// The machine the plan is checked against: GPU memory, host memory, world size.
struct Target {
  int world = 1;
  std::uint64_t device_bytes = 0;
  HostFacts host;
  bool machine = false;
  std::uint64_t drive_space = 0;  // all the machine's drives together; 0: not known
  int drives = -1;                // the machine file's drives.count; -1: no machine file
  std::string machine_name;
  int tensor = 1;                 // strata.parallel.tensor: the engine shards over world / tensor ranks
  int slices = 1;                 // strata.parallel.tensor_slices
  int pipeline = 1;               // strata.parallel.pipeline: every stage is planned
};

Target target_of(const EstimateInputs& in);

// target_of and the layout check of strata.parallel, as train does it.
Target checked_target(const EstimateInputs& in, const models::ModelConfig& model) {
  Target t = target_of(in);
  const ParallelLayout layout = train::check_parallel_layout(in.config, model, t.world);
  t.tensor = layout.tensor();
  t.pipeline = layout.pipeline();
  t.slices = in.config.strata.parallel.slices();
  return t;
}

Target target_of(const EstimateInputs& in) {
  Target t;
  const TrainConfig& cfg = in.config;
  if (in.machine) {
    const MachineSpec& m = *in.machine;
    t.machine = true;
    t.world = in.world_size > 0 ? in.world_size : m.gpus.count;
    if (t.world > m.gpus.count) {
      throw ConfigError(fmt::format("--world {} is more than the {} GPU(s) of machine '{}' ({}); estimate covers one "
                                    "node: lower --world or describe more GPUs in gpus.count",
                                    t.world, m.gpus.count, m.name, m.source));
    }
    t.device_bytes = m.gpus.memory_bytes;
    t.host = HostFacts{m.host.memory_bytes, t.world, 0};
    t.drive_space = m.drives.capacity_bytes * static_cast<std::uint64_t>(m.drives.count);
    t.drives = m.drives.count;
    t.machine_name = fmt::format("'{}' ({})", m.name, m.source);
    return t;
  }
  t.world = in.world_size > 0 ? in.world_size : 1;
  t.device_bytes = cfg.strata.device.memory_bytes;
  bool sim = cfg.strata.device.kind == DeviceChoice::Sim;
  if (t.device_bytes == 0) {
    std::string why;
    const auto gpus = list_cuda_devices(&why);
    if (gpus.empty() || cfg.strata.device.kind == DeviceChoice::Sim) {
      throw ConfigError(fmt::format("{}: no device memory to plan against: strata.device.memory is not set and no "
                                    "GPU is usable ({}); set strata.device.memory or give --machine FILE",
                                    cfg.source, why.empty() ? "the config asks for the sim device" : why));
    }
    t.device_bytes = gpus.front().total_memory_bytes;
  } else if (cfg.strata.device.kind == DeviceChoice::Auto) {
    sim = list_cuda_devices().empty();
  }
  t.host = measure_host(t.world, sim ? t.device_bytes : 0);
  return t;
}

std::uint64_t largest_tensor_elems(const std::vector<ParamGroupSpec>& groups) {
  std::uint64_t largest = 0;
  for (const ParamGroupSpec& g : groups) {
    for (const ParamTensorSpec& t : g.tensors) largest = std::max<std::uint64_t>(largest, t.elems());
  }
  return largest;
}

// DeepSpeed's estimator for the same model and offload choices. Its largest_layer_params is the
// largest module's own parameters; the largest tensor is that module's weight (its bias is noise).
DeepSpeedBeside deepspeed_beside(const TrainConfig& resolved, std::uint64_t params, std::uint64_t largest, int world) {
  DeepSpeedBeside d;
  d.stage = resolved.zero.stage;
  d.largest_layer_params = largest;
  const bool opt_off = resolved.zero.offload_optimizer.device != OffloadDevice::None;
  const bool par_off = resolved.zero.offload_param.device != OffloadDevice::None;
  if (d.stage == 3) {
    deepspeed::Zero3Args a;
    a.total_params = params;
    a.largest_layer_params = largest;
    a.num_gpus_per_node = world;
    a.cpu_offload = opt_off;
    a.cpu_offload_params = par_off;
    const deepspeed::ModelStatesMem m = deepspeed::estimate_zero3_model_states_mem_needs(a);
    d.options = fmt::format("estimate_zero3_model_states_mem_needs: offload_param={}, offload_optimizer={}, zero_init=1",
                            par_off ? "cpu" : "none", opt_off ? "cpu" : "none");
    d.cpu_bytes_per_node = m.cpu_bytes;
    d.gpu_bytes_per_gpu = m.gpu_bytes;
  } else if (d.stage >= 1) {
    deepspeed::Zero2Args a;
    a.total_params = params;
    a.num_gpus_per_node = world;
    a.cpu_offload = opt_off;
    const deepspeed::ModelStatesMem m = deepspeed::estimate_zero2_model_states_mem_needs(a);
    d.options = fmt::format("estimate_zero2_model_states_mem_needs: offload_optimizer={}", opt_off ? "cpu" : "none");
    d.cpu_bytes_per_node = m.cpu_bytes;
    d.gpu_bytes_per_gpu = m.gpu_bytes;
  }
  return d;
}

Estimate estimate_stage(const EstimateInputs& in, const Target& t, const models::ModelConfig& model, bool checkpointing,
                        const models::TilingDecision& tiling, const models::TensorParallel& tp, int data_world,
                        const models::PipelineStage& stage);

// The figures of the model and the machine, before any plan.
Estimate estimate_of(const Target& t, const models::ModelConfig& model) {
  Estimate e;
  e.model = model.name;
  e.n_layers = model.n_layers;
  e.parameters = static_cast<std::uint64_t>(models::param_count(model));
  e.world_size = t.world;
  e.tensor_ranks = t.tensor;
  e.pipeline_stages = t.pipeline;
  e.device_bytes = t.device_bytes;
  return e;
}

Estimate estimate_model(const EstimateInputs& in, const Target& t, const models::ModelConfig& model, bool checkpointing) {
  const TrainConfig& cfg = in.config;
  Estimate e = estimate_of(t, model);
  // With tensor parallelism the engine shards each slice over the data ranks, and the rank planned
  // is the last tensor rank (the most vocabulary rows); tiling is not built beside it. With
  // pipeline stages each stage is planned (its groups, activations and pipeline buffers), and the
  // estimate is the first stage's (the rank train logs) unless another does not fit.
  const int data_world = t.world / (t.tensor * t.pipeline);
  const models::TensorParallel tp{t.tensor, t.tensor - 1, t.slices, nullptr, in.config.strata.parallel.sequence,
                                  in.config.strata.exact};
  std::vector<std::int64_t> bounds;
  try {
    bounds = models::pipeline_boundaries(model, t.pipeline, cfg.strata.parallel.pipeline_layers, cfg.source);
  } catch (const ConfigError& refusal) {  // a depth below the stages (largest_fitting_depth)
    e.why_not = refusal.what();
    return e;
  }
  models::TilingDecision tiling;
  if (!tp.sliced()) {
    try {
      tiling = models::plan_tiling(cfg, model, checkpointing, t.world, t.device_bytes);
    } catch (const ConfigError& refusal) {  // no tiling makes the largest layer fit: it cannot run
      e.why_not = refusal.what();
      return e;
    }
  }
  e.tiling = tiling.describe();
  if (t.pipeline > 1) {
    Estimate first;
    std::vector<std::string> lines;
    for (int p = 0; p < t.pipeline; ++p) {
      const Estimate stage = estimate_stage(in, t, model, checkpointing, tiling, tp, data_world,
                                            models::training_pipeline_stage(bounds, p, nullptr, cfg.strata.parallel,
                                                                            cfg.gradient_accumulation_steps));
      if (p == 0) first = stage;
      lines.push_back(stage.fits || !stage.plan_line.empty() ? stage.plan_line : stage.why_not);
      if (!stage.fits && first.fits) {
        first.fits = false;
        first.why_not = fmt::format("pipeline stage {}: {}", p, stage.why_not);
      }
    }
    first.stage_plan_lines = std::move(lines);
    return first;
  }
  return estimate_stage(in, t, model, checkpointing, tiling, tp, data_world, models::PipelineStage{});
}

// One rank's plan: the tensor rank `tp` of pipeline stage `stage` (the whole model when unsplit).
Estimate estimate_stage(const EstimateInputs& in, const Target& t, const models::ModelConfig& model, bool checkpointing,
                        const models::TilingDecision& tiling, const models::TensorParallel& tp, int data_world,
                        const models::PipelineStage& stage) {
  const TrainConfig& cfg = in.config;
  Estimate e = estimate_of(t, model);
  e.tiling = tiling.describe();
  const auto decoder_with = [&](models::Checkpointing mode) {
    models::DecoderOptions o(mode, tiling.spec);
    o.tensor = tp;
    o.pipeline = stage;
    return models::Decoder(model, o);
  };
  const models::Decoder decoder =
      decoder_with(checkpointing ? models::Checkpointing::Blocks : models::Checkpointing::Off);
  const std::vector<ParamGroupSpec> groups = decoder.param_groups();
  const std::int64_t micro = cfg.micro_batch_size, seq = cfg.strata.data.seq_len;
  // A stage's stash and boundary buffers count as activations, as in the trainer's plan.
  const std::uint64_t buffers = models::PipelineRunner::buffer_bytes(
      decoder, stage, cfg.strata.parallel.schedule, cfg.gradient_accumulation_steps, micro, seq);
  e.activations_checkpointed = decoder_with(models::Checkpointing::Blocks).activation_bytes(micro, seq, true) + buffers;
  e.activations_full = decoder_with(models::Checkpointing::Off).activation_bytes(micro, seq, true) + buffers;
  const std::uint64_t activations = checkpointing ? e.activations_checkpointed : e.activations_full;

  // DeepSpeed's estimators know no tensor parallelism: they see the whole model on every GPU.
  const std::uint64_t largest =
      largest_tensor_elems(tp.size > 1 || stage.split() ? models::decoder_param_groups(model) : groups);
  e.deepspeed = deepspeed_beside(cfg, e.parameters, largest, t.world);
  e.resolved = cfg;
  try {
    PlacedRun placed = place_run(cfg, groups, data_world, 0, t.world, activations, t.device_bytes, t.host);
    e.resolved = placed.config;
    e.deepspeed = deepspeed_beside(placed.config, e.parameters, largest, t.world);
    e.tiers = std::move(placed.tiers);
    e.capacity = measure_capacities(e.tiers, t.device_bytes, t.world);
    e.capacity.host_available = t.host.mem_available;
    if (t.drives == 0 && e.tiers.nvme_files > 0) {  // simulate refuses it too (sim/step_sim.cc)
      throw ConfigError(fmt::format("{}: the config puts state on NVMe ({} of swap files), but machine {} has no "
                                    "drives (drives.count 0): describe its drives, or offload to \"cpu\"",
                                    cfg.source, format_bytes(e.tiers.nvme_files), t.machine_name));
    }
    e.nvme_checked = !t.machine || t.drive_space > 0;
    if (t.machine && !e.capacity.nvme_free.empty()) {
      // The config's directories share the machine's drives: each gets an equal part of their space.
      const std::uint64_t each = t.drive_space == 0 ? std::numeric_limits<std::uint64_t>::max()
                                                    : t.drive_space / e.capacity.nvme_free.size();
      std::fill(e.capacity.nvme_free.begin(), e.capacity.nvme_free.end(), each);
    }
    const bool pinned_arrays = placed.config.zero.offload_optimizer.pin_memory;
    e.host_pinned = e.tiers.pinned + (pinned_arrays ? e.tiers.host_arrays : 0);
    e.host_pageable = pinned_arrays ? 0 : e.tiers.host_arrays;
    const std::string described = describe_plan(e.tiers, e.capacity);
    std::istringstream lines(described);
    std::getline(lines, e.plan_line);
    for (std::string line; std::getline(lines, line);) e.placement.push_back(line.substr(line.find_first_not_of(' ')));
    check_plan_fits(e.tiers, e.capacity, cfg.source);
    e.fits = true;
  } catch (const ConfigError& refusal) {
    e.why_not = refusal.what();
  }
  return e;
}

}  // namespace

void resolve_planned_batch_sizes(EstimateInputs& in) {
  const int world = target_of(in).world;
  const int split = in.config.strata.parallel.tensor * in.config.strata.parallel.pipeline;
  resolve_batch_sizes(in.config, world % split == 0 ? world / split : world);
}

Estimate estimate_run(const EstimateInputs& in) {
  bool checkpointing = false;
  const models::ModelConfig model = train::training_model_config(in.config, &checkpointing);
  const Target t = checked_target(in, model);
  return estimate_model(in, t, model, checkpointing);
}

LargestFit largest_fitting_depth(const EstimateInputs& in, std::int64_t max_layers) {
  bool checkpointing = false;
  models::ModelConfig model = train::training_model_config(in.config, &checkpointing);
  const Target t = checked_target(in, model);
  const auto fits = [&](std::int64_t layers) {
    model.n_layers = layers;
    return estimate_model(in, t, model, checkpointing).fits;
  };
  LargestFit out;
  // Pipeline stages need a block each.
  const std::int64_t least = std::max<std::int64_t>(1, t.pipeline);
  if (!fits(least)) return out;
  // Double until a depth does not fit, then bisect: the bytes of every tier grow with the depth.
  std::int64_t lo = least, hi = 2 * least;
  while (hi <= max_layers && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, max_layers + 1);
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  model.n_layers = lo;
  out.n_layers = lo;
  out.parameters = static_cast<std::uint64_t>(models::param_count(model));
  return out;
}

std::string describe_estimate(const Estimate& e, const LargestFit& largest) {
  const TierPlan& p = e.tiers;
  std::ostringstream o;
  const int split = e.tensor_ranks * e.pipeline_stages;
  o << fmt::format("model {}: {:.3g} parameters ({} layers), world {}{}, {} per GPU\n", e.model,
                   static_cast<double>(e.parameters), e.n_layers, e.world_size,
                   split > 1 ? fmt::format(" = data {} x tensor {} x pipeline {}", e.world_size / split, e.tensor_ranks,
                                           e.pipeline_stages)
                             : std::string(),
                   format_bytes(e.device_bytes));
  if (!e.tiling.empty()) o << "  " << e.tiling << "\n";
  o << fmt::format("per rank{}:\n  HBM    {} of {}: optimizer state and gradient sums {}, resident weights {}, largest "
                   "group in use {} ('{}'){}, activations {} ({} with block checkpointing, {} without)\n",
                   e.pipeline_stages > 1 ? " (pipeline stage 0; every stage's plan below)" : "",
                   format_bytes(p.device_total()), format_bytes(e.device_bytes), format_bytes(p.device_state),
                   format_bytes(p.device_weights), format_bytes(p.device_window), p.largest_group,
                   p.device_export > p.device_window
                       ? fmt::format(" below its export between steps {}", format_bytes(p.device_export))
                       : std::string(),
                   format_bytes(p.activations), format_bytes(e.activations_checkpointed),
                   format_bytes(e.activations_full));
  o << fmt::format("  host   {}: pinned {} (staging pools {}), pageable {}; {} available to {} rank(s)\n",
                   format_bytes(p.host_total()), format_bytes(e.host_pinned), format_bytes(p.pinned),
                   format_bytes(e.host_pageable), format_bytes(e.capacity.host_available), e.capacity.ranks_on_node);
  if (!p.nvme_dirs.empty()) {
    o << fmt::format("  NVMe   {} per rank; swap files {} for all ranks over {} director{} ({} each){}\n",
                     format_bytes(p.nvme / static_cast<std::uint64_t>(e.world_size)), format_bytes(p.nvme_files),
                     p.nvme_dirs.size(), p.nvme_dirs.size() == 1 ? "y" : "ies",
                     format_bytes(p.nvme_files / p.nvme_dirs.size()),
                     e.nvme_checked ? "" : "; free space not checked (the machine file gives no drive capacity)");
  }
  for (const std::string& line : e.placement) o << "  " << line << "\n";
  for (std::size_t q = 0; q < e.stage_plan_lines.size(); ++q) {
    o << fmt::format("  pipeline stage {}: {}\n", q, e.stage_plan_lines[q]);
  }
  o << (e.fits ? std::string("fits: yes\n") : "fits: no: " + e.why_not + "\n");
  o << fmt::format("largest model of this shape that fits: {} layers, {:.3g} parameters\n", largest.n_layers,
                   static_cast<double>(largest.parameters));
  if (e.deepspeed.stage >= 1) {
    o << fmt::format("DeepSpeed's estimate ({}; largest layer {:.3g} params): {} per GPU, {} of CPU memory per node\n",
                     e.deepspeed.options, static_cast<double>(e.deepspeed.largest_layer_params),
                     format_bytes(e.deepspeed.gpu_bytes_per_gpu), format_bytes(e.deepspeed.cpu_bytes_per_node));
  } else {
    o << "DeepSpeed's estimators cover ZeRO stages 1-3 only\n";
  }
  return o.str();
}

nlohmann::json estimate_to_json(const Estimate& e, const LargestFit& largest) {
  const TierPlan& p = e.tiers;
  return nlohmann::json{
      {"model", e.model},
      {"n_layers", e.n_layers},
      {"parameters", e.parameters},
      {"world_size", e.world_size},
      {"tensor_ranks", e.tensor_ranks},
      {"pipeline_stages", e.pipeline_stages},
      {"stage_plan_lines", e.stage_plan_lines},
      {"device_bytes", e.device_bytes},
      {"tiling", e.tiling},
      {"hbm", {{"total", p.device_total()}, {"optimizer_state", p.device_state}, {"resident_weights", p.device_weights},
               {"group_window", p.device_window}, {"largest_group", p.largest_group},
               {"export_between_steps", p.device_export}, {"norm_partials", p.device_norm},
               {"reduction_in_flight", p.device_in_flight}, {"activations", p.activations},
               {"activations_checkpointed", e.activations_checkpointed}, {"activations_full", e.activations_full}}},
      {"host", {{"total", p.host_total()}, {"pinned", e.host_pinned}, {"staging_pools", p.pinned},
                {"pageable", e.host_pageable}, {"available", e.capacity.host_available}}},
      {"nvme", {{"per_rank", p.nvme / static_cast<std::uint64_t>(e.world_size)}, {"swap_files", p.nvme_files},
                {"dirs", p.nvme_dirs}, {"free_space_checked", e.nvme_checked}}},
      {"spill", {{"host_budget", p.host_budget}, {"state_chunks", p.state_chunks},
                 {"spilled_state_chunks", p.spilled_state_chunks}, {"spilled_grad_chunks", p.spilled_grad_chunks},
                 {"param_chunks", p.param_chunks},
                 {"spilled_param_chunks", p.spilled_param_chunks}}},
      {"placement", e.placement},
      {"plan_line", e.plan_line},
      {"fits", e.fits},
      {"why_not", e.why_not},
      {"largest_fit", {{"n_layers", largest.n_layers}, {"parameters", largest.parameters}}},
      {"deepspeed", {{"stage", e.deepspeed.stage}, {"options", e.deepspeed.options},
                     {"gpu_bytes_per_gpu", e.deepspeed.gpu_bytes_per_gpu},
                     {"cpu_bytes_per_node", e.deepspeed.cpu_bytes_per_node},
                     {"largest_layer_params", e.deepspeed.largest_layer_params}}},
  };
}

}  // namespace strata::sim
