// `strata simulate`: one training step of a config predicted for a machine described by numbers
// (plan/machine.h) or measured here (`--machine measure`, the sim device): step time, tokens/s,
// each queue's busy time, the slowest queue and the lower bound it sets, NVMe bytes and what they
// mean for the drives' endurance; with pipeline stages each stage's busy time and bubble beside the
// ideal (P - 1) / (A + P - 1); with --trace the simulated timeline in `strata.trace`'s format (one
// process per stage). The model and its simplifications: Notes [Step simulator] (sim/step_sim.h)
// and [Pipelined step simulation] (sim/step_sim_stages.cc).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "plan/machine.h"
#include "plan/tier_plan.h"
#include "models/pipeline.h"
#include "cli/commands.h"
#include "sim/estimate_plan.h"
#include "train/output_file.h"
#include "sim/sim_machine_measure.h"
#include "sim/step_sim.h"
#include "train/trainer.h"

namespace strata::cli {

namespace {

struct SimulateOptions {
  std::string config;  // empty: the built-in configs/demo.json
  std::vector<std::string> overrides;
  std::string machine;  // a machine file, or "measure"
  int world = 0;        // 0: the machine's GPU count
  double efficiency = 0;  // > 0: both compute efficiencies (machine files)
  bool json = false;
  std::string trace;
};

// A machine file's capacities for the tier planner: one node holding every GPU; NVMe free space is
// not in machine files, so it is not checked.
void print_text(const sim::SimResult& r, const sim::StepWorkload& w, const sim::SimMachine& m, const SsdWear& wear) {
  const int gpus = w.plan.topo.world_size * w.tensor_ranks;
  const std::string tensor =
      w.tensor_ranks > 1 ? fmt::format(" = data {} x tensor {}", w.plan.topo.world_size, w.tensor_ranks) : std::string();
  std::printf("config %s on %s (%d GPU%s%s): %.2fM parameters, %lld tokens per step\n", w.source.c_str(),
              m.spec.name.c_str(), gpus, gpus == 1 ? "" : "s", tensor.c_str(), static_cast<double>(w.parameters) / 1e6,
              static_cast<long long>(w.tokens_per_step));
  std::printf("compute: peak %.4g TFLOP/s, efficiency %.3f (blocks) / %.3f (head, embedding); wake-up %.1f us\n",
              m.spec.gpus.bf16_tflops, m.block_efficiency, m.head_efficiency, m.wake_seconds * 1e6);
  std::printf("%-14s %12s %8s\n", "queue", "busy s", "of step");
  for (std::size_t q = 0; q < sim::kSimQueues; ++q) {
    std::printf("%-14s %12.6f %7.1f%%\n", sim::sim_queue_name(static_cast<sim::SimQueue>(q)), r.busy_seconds[q],
                r.step_seconds > 0 ? 100 * r.busy_seconds[q] / r.step_seconds : 0);
  }
  std::printf("predicted step %.6f s, %.1f tokens/s; slowest queue %s: lower bound %.6f s (step / bound = %.2f)\n",
              r.step_seconds, r.tokens_per_second, sim::sim_queue_name(r.slowest), r.lower_bound_seconds,
              r.lower_bound_seconds > 0 ? r.step_seconds / r.lower_bound_seconds : 0);
  if (r.nvme_read_bytes + r.nvme_written_bytes > 0) {
    const auto all = static_cast<std::uint64_t>(gpus);
    std::printf("nvme per step, all %d rank(s): read %s, written %s; %.3f TB written per day", gpus,
                format_bytes(r.nvme_read_bytes * all).c_str(), format_bytes(r.nvme_written_bytes * all).c_str(),
                wear.tb_per_day);
    if (wear.days_to_rated > 0) std::printf(", %.0f days to the drives' rated endurance", wear.days_to_rated);
    std::printf("\n");
  }
}

nlohmann::json to_json(const sim::SimResult& r, const sim::StepWorkload& w, const sim::SimMachine& m, const SsdWear& wear) {
  const auto ranks = static_cast<std::uint64_t>(w.plan.topo.world_size * w.tensor_ranks);
  nlohmann::json j = {{"config", w.source},
                      {"machine", machine_to_json(m.spec)},
                      {"block_efficiency", m.block_efficiency},
                      {"head_efficiency", m.head_efficiency},
                      {"wake_seconds", m.wake_seconds},
                      {"world_size", w.plan.topo.world_size * w.tensor_ranks},
                      {"tensor_ranks", w.tensor_ranks},
                      {"parameters", w.parameters},
                      {"tokens_per_step", w.tokens_per_step},
                      {"step_seconds", r.step_seconds},
                      {"tokens_per_second", r.tokens_per_second},
                      {"slowest_queue", sim::sim_queue_name(r.slowest)},
                      {"lower_bound_seconds", r.lower_bound_seconds},
                      // NVMe per step: all ranks (as `strata train`'s summary), and the simulated rank's
                      {"nvme_read_bytes_per_step", r.nvme_read_bytes * ranks},
                      {"nvme_written_bytes_per_step", r.nvme_written_bytes * ranks},
                      {"nvme_written_bytes_per_step_per_rank", r.nvme_written_bytes},
                      {"nvme_tb_written_per_day", wear.tb_per_day},
                      {"days_to_rated_endurance", wear.days_to_rated}};
  for (std::size_t q = 0; q < sim::kSimQueues; ++q) j["queue_seconds"][sim::sim_queue_name(static_cast<sim::SimQueue>(q))] = r.busy_seconds[q];
  return j;
}

// The node's NVMe wear: every rank of a stage writes alike, the drives take every stage's ranks.
SsdWear pipeline_wear(const sim::PipelineSimResult& r, const std::vector<sim::StepWorkload>& stages, const sim::SimMachine& m,
                      std::uint64_t* written_per_step, std::uint64_t* read_per_step) {
  const auto ranks = static_cast<std::uint64_t>(stages.front().plan.topo.world_size * stages.front().tensor_ranks);
  *written_per_step = *read_per_step = 0;
  for (const sim::StageSimResult& s : r.stages) {
    *written_per_step += s.sim.nvme_written_bytes * ranks;
    *read_per_step += s.sim.nvme_read_bytes * ranks;
  }
  return ssd_wear(static_cast<double>(*written_per_step), r.step_seconds, std::max(m.spec.drives.count, 1),
                  m.spec.drives.endurance_tbw);
}

void print_pipeline_text(const sim::PipelineSimResult& r, const std::vector<sim::StepWorkload>& stages, const sim::SimMachine& m) {
  const sim::StepWorkload& w = stages.front();
  const sim::StageWork& S = w.stage;
  const int gpus = w.plan.topo.world_size * w.tensor_ranks * S.stages;
  std::printf("config %s on %s (%d GPUs = data %d x tensor %d x pipeline %d): %.2fM parameters, %lld tokens per step\n",
              w.source.c_str(), m.spec.name.c_str(), gpus, w.plan.topo.world_size, w.tensor_ranks, S.stages,
              static_cast<double>(w.parameters) / 1e6, static_cast<long long>(w.tokens_per_step));
  std::printf(
      "compute: peak %.4g TFLOP/s, efficiency %.3f (blocks) / %.3f (head, embedding); GPU link %.4g GB/s; wake-up %.1f "
      "us\n",
      m.spec.gpus.bf16_tflops, m.block_efficiency, m.head_efficiency, m.spec.gpus.link_gbps, m.wake_seconds * 1e6);
  std::printf("pipeline: %d stages, %s, %d micro-batches; %s per boundary and micro-batch each way\n", S.stages,
              std::string(models::pipeline_schedule_name(S.schedule)).c_str(), w.micro_batches,
              format_bytes(static_cast<std::uint64_t>(S.boundary_bytes)).c_str());
  std::printf("%-6s %-8s %10s %12s %8s %9s %12s %-12s\n", "stage", "blocks", "params", "busy s", "bubble", "in flight",
              "sent/step", "slowest");
  for (std::size_t p = 0; p < r.stages.size(); ++p) {
    const sim::StageSimResult& s = r.stages[p];
    const sim::StageWork& sp = stages[p].stage;
    std::printf("%-6zu %-8s %9.2fM %12.6f %7.1f%% %9d %12s %-12s\n", p,
                fmt::format("{}-{}", sp.first_layer, sp.end_layer - 1).c_str(),
                static_cast<double>(sp.parameters) / 1e6, s.busy_seconds, 100 * s.bubble_fraction, s.peak_in_flight,
                format_bytes(s.sent_bytes).c_str(), sim::sim_queue_name(s.sim.slowest));
  }
  std::printf("predicted step %.6f s, %.1f tokens/s; pipeline span %.6f s; bubble per stage against the ideal "
              "(P - 1) / (A + P - 1) = %.1f%%; busiest stage %zu\n",
              r.step_seconds, r.tokens_per_second, r.span_seconds, 100 * r.ideal_bubble_fraction, r.busiest_stage);
  std::uint64_t written = 0, read = 0;
  const SsdWear wear = pipeline_wear(r, stages, m, &written, &read);
  if (written + read > 0) {
    std::printf("nvme per step, all %d rank(s): read %s, written %s; %.3f TB written per day", gpus,
                format_bytes(read).c_str(), format_bytes(written).c_str(), wear.tb_per_day);
    if (wear.days_to_rated > 0) std::printf(", %.0f days to the drives' rated endurance", wear.days_to_rated);
    std::printf("\n");
  }
}

nlohmann::json pipeline_to_json(const sim::PipelineSimResult& r, const std::vector<sim::StepWorkload>& stages,
                                const sim::SimMachine& m) {
  const sim::StepWorkload& w = stages.front();
  const sim::StageWork& S = w.stage;
  std::uint64_t written = 0, read = 0;
  const SsdWear wear = pipeline_wear(r, stages, m, &written, &read);
  const sim::StageSimResult& busiest = r.stages[r.busiest_stage];
  nlohmann::json j = {{"config", w.source},
                      {"machine", machine_to_json(m.spec)},
                      {"block_efficiency", m.block_efficiency},
                      {"head_efficiency", m.head_efficiency},
                      {"wake_seconds", m.wake_seconds},
                      {"world_size", w.plan.topo.world_size * w.tensor_ranks * S.stages},
                      {"tensor_ranks", w.tensor_ranks},
                      {"pipeline_stages", S.stages},
                      {"parameters", w.parameters},
                      {"tokens_per_step", w.tokens_per_step},
                      {"step_seconds", r.step_seconds},
                      {"tokens_per_second", r.tokens_per_second},
                      // the busiest stage's
                      {"slowest_queue", sim::sim_queue_name(busiest.sim.slowest)},
                      {"lower_bound_seconds", busiest.sim.lower_bound_seconds},
                      {"nvme_read_bytes_per_step", read},
                      {"nvme_written_bytes_per_step", written},
                      {"nvme_tb_written_per_day", wear.tb_per_day},
                      {"days_to_rated_endurance", wear.days_to_rated}};
  nlohmann::json per_stage = nlohmann::json::array();
  for (std::size_t p = 0; p < r.stages.size(); ++p) {
    const sim::StageSimResult& s = r.stages[p];
    const sim::StageWork& sp = stages[p].stage;
    nlohmann::json e = {{"first_layer", sp.first_layer},
                        {"end_layer", sp.end_layer},
                        {"parameters", sp.parameters},
                        {"activation_sets", sp.activation_sets},
                        {"busy_seconds", s.busy_seconds},
                        {"bubble_fraction", s.bubble_fraction},
                        {"peak_in_flight", s.peak_in_flight},
                        {"sent_bytes_per_step", s.sent_bytes},
                        {"received_bytes_per_step", s.received_bytes},
                        {"slowest_queue", sim::sim_queue_name(s.sim.slowest)},
                        {"nvme_written_bytes_per_step_per_rank", s.sim.nvme_written_bytes}};
    for (std::size_t q = 0; q < sim::kSimQueues; ++q) {
      e["queue_seconds"][sim::sim_queue_name(static_cast<sim::SimQueue>(q))] = s.sim.busy_seconds[q];
    }
    per_stage.push_back(std::move(e));
  }
  for (std::size_t q = 0; q < sim::kSimQueues; ++q) {
    j["queue_seconds"][sim::sim_queue_name(static_cast<sim::SimQueue>(q))] = busiest.sim.busy_seconds[q];
  }
  j["pipeline"] = {{"stages", S.stages},
                   {"schedule", models::pipeline_schedule_name(S.schedule)},
                   {"micro_batches", w.micro_batches},
                   {"boundary_bytes_per_micro_batch", S.boundary_bytes},
                   {"tied_embedding_bytes_per_step", S.tied_bytes},
                   {"span_seconds", r.span_seconds},
                   {"ideal_bubble_fraction", r.ideal_bubble_fraction},
                   {"busiest_stage", r.busiest_stage},
                   {"per_stage", per_stage}};
  return j;
}

int run_simulate(const SimulateOptions& o) {
  if (o.machine.empty()) throw ConfigError("strata simulate: --machine is needed: a machine file, or 'measure' for this host");
  if (o.efficiency < 0 || o.efficiency > 1) {
    throw ConfigError(fmt::format("strata simulate: --efficiency {} must be in (0, 1]", o.efficiency));
  }
  train::check_output_path(o.trace, "--trace", train::OutputWrite::InPlace);
  train::check_output_not_input(o.trace, "--trace", {o.config, o.machine == "measure" ? "" : o.machine}, {});
  const TrainConfig cfg = train::load_train_config_or_demo(o.config, o.overrides);
  const bool measure = o.machine == "measure";
  sim::SimMachine machine;
  if (!measure) {
    machine.spec = load_machine(o.machine);
    if (o.efficiency > 0) machine.block_efficiency = machine.head_efficiency = o.efficiency;
  }
  // The plan `strata train` would make there (Note [One plan for estimate and train] in sim/estimate_plan.h): "auto"
  // placement resolved, and a config that does not fit refused with the trainer's own message.
  sim::EstimateInputs in;
  in.config = cfg;
  if (!measure) in.machine = machine.spec;
  in.world_size = o.world;
  sim::resolve_planned_batch_sizes(in);
  const sim::Estimate planned = estimate_run(in);
  if (planned.pipeline_stages > 1 && measure) {
    throw ConfigError(fmt::format("{}: strata.parallel.pipeline = {} with --machine measure: the stages' ranks would "
                                  "share this host's cores, which the simulator does not model; describe the sim "
                                  "device in a machine file (docs/MEASUREMENTS.md, \"Step simulator against pipelined "
                                  "training\") or simulate with strata.parallel.pipeline = 1",
                                  cfg.source, planned.pipeline_stages));
  }
  if (!planned.fits) throw ConfigError(fmt::format("{} on {}: {}", cfg.source, measure ? "this host" : o.machine, planned.why_not));
  if (planned.pipeline_stages > 1) {
    // Every stage's plan (Note [Pipelined step simulation] in sim/step_sim_stages.cc); "auto" placement as resolved for
    // the first stage, the rank estimate plans first.
    const std::vector<sim::StepWorkload> stages =
        sim::make_stage_workloads(planned.resolved, planned.world_size, planned.device_bytes);
    const sim::PipelineSimResult r = simulate_pipelined_step(stages, machine);
    if (o.json) {
      std::printf("%s\n", pipeline_to_json(r, stages, machine).dump().c_str());
    } else {
      print_pipeline_text(r, stages, machine);
    }
    if (!o.trace.empty()) sim::write_stage_trace(r, o.trace);
    return 0;
  }
  const sim::StepWorkload workload = sim::make_step_workload(planned.resolved, planned.world_size, planned.device_bytes);
  if (measure) machine = sim::measure_sim_machine(cfg, workload);
  const sim::SimResult r = simulate_step(workload, machine);
  // The simulated rank is one of the node's; every rank writes alike, and the drives take them all.
  const double ranks = static_cast<double>(workload.plan.topo.world_size) * workload.tensor_ranks;
  const SsdWear wear = ssd_wear(static_cast<double>(r.nvme_written_bytes) * ranks, r.step_seconds,
                                std::max(machine.spec.drives.count, 1), machine.spec.drives.endurance_tbw);
  if (o.json) {
    std::printf("%s\n", to_json(r, workload, machine, wear).dump().c_str());
  } else {
    print_text(r, workload, machine, wear);
  }
  if (!o.trace.empty()) sim::write_sim_trace(r.ops, o.trace);
  return 0;
}

}  // namespace

void register_simulate(CLI::App& app, bench::CommandTable& table) {
  auto o = std::make_shared<SimulateOptions>();
  auto* cmd = app.add_subcommand("simulate", "predict one training step of a config on a machine (Note [Step simulator] in sim/step_sim.h)");
  cmd->add_option("--config", o->config, "training config (default: configs/demo.json, built into the command)")
      ->check(bench::non_empty_path());
  cmd->add_option("--set", o->overrides, "override a config key (repeatable)");
  cmd->add_option("--machine", o->machine, "machine file (plan/machine.h), or 'measure': this host as the sim device")
      ->check(bench::non_empty_path());
  cmd->add_option("--world", o->world, "ranks (GPUs) on the node (default: the machine's GPU count, or 1)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--efficiency", o->efficiency, "achieved fraction of the GPUs' peak on the model's ops (default 0.5)");
  cmd->add_flag("--json", o->json, "one JSON object");
  cmd->add_option("--trace", o->trace, "write the simulated timeline as Chrome trace JSON (as strata.trace)")
      ->check(bench::non_empty_path());
  table[cmd] = [o]() -> int { return run_simulate(*o); };
}

}  // namespace strata::cli
