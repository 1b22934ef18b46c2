// `strata estimate`: before renting a machine, whether a training config fits it, the bytes per
// tier and rank, the largest model of the config's shape that fits, and DeepSpeed's estimate beside
// it (sim/estimate_plan.h, Note [One plan for estimate and train] in sim/estimate_plan.h).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "plan/machine.h"
#include "cli/commands.h"
#include "sim/estimate_plan.h"
#include "train/trainer.h"

namespace strata::cli {
namespace {

struct EstimateOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string machine;
  int world = 0;
  bool json = false;
};

int run_estimate(const EstimateOptions& o) {
  sim::EstimateInputs in;
  in.config = train::load_train_config_or_demo(o.config, o.overrides);
  if (!o.machine.empty()) in.machine = load_machine(o.machine);
  in.world_size = o.world;
  sim::resolve_planned_batch_sizes(in);
  const sim::Estimate e = estimate_run(in);
  const sim::LargestFit largest = largest_fitting_depth(in);
  if (o.json) {
    std::printf("%s\n", sim::estimate_to_json(e, largest).dump(2).c_str());
  } else {
    if (in.machine) std::printf("machine: %s (%s)\n", in.machine->name.c_str(), in.machine->source.c_str());
    std::printf("%s", sim::describe_estimate(e, largest).c_str());
  }
  return e.fits ? 0 : 3;
}

}  // namespace

void register_estimate(CLI::App& app, bench::CommandTable& table) {
  auto opts = std::make_shared<EstimateOptions>();
  auto* cmd = app.add_subcommand(
      "estimate", "bytes per tier and rank of a config on this or a described machine, and whether it fits (exit 3 if not)");
  cmd->add_option("--config", opts->config, "training config (default: the built-in configs/demo.json)")->check(bench::non_empty_path());
  cmd->add_option("--set", opts->overrides, "override a config key: key.path=value (repeatable)");
  cmd->add_option("--machine", opts->machine, "machine file (configs/machines/*.json; strata doctor --measure writes one)")
      ->check(bench::non_empty_path());
  cmd->add_option("--world", opts->world, "ranks (GPUs) on the node (default: the machine's GPU count, or 1)")
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("--json", opts->json, "print one JSON object");
  table[cmd] = [opts]() { return run_estimate(*opts); };
}

}  // namespace strata::cli
