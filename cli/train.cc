// `strata train [--config FILE] [--set k.path=v ...] [--steps N] [--resume DIR] [--save-weights OUT]
// [--summary-json OUT]`: the main job (train/trainer.h). Runs under `mpirun -np N` as well.
#include "cli/commands.h"
#include "train/trainer.h"

namespace strata::cli {

void register_train(CLI::App& app, bench::CommandTable& table) {
  auto* cmd = app.add_subcommand("train", "train a model (default config: configs/demo.json, built into the command)");
  auto options = std::make_shared<train::TrainOptions>();
  auto steps = std::make_shared<std::int64_t>(0);
  auto fragments = std::make_shared<std::vector<std::string>>();
  cmd->add_option("--config", options->config_path, "DeepSpeed-style JSON config (default: configs/demo.json as built into the command)")
      ->check(bench::non_empty_path());
  cmd->add_option("--set", options->overrides, "override a config key: --set zero_optimization.stage=3 (repeatable)");
  cmd->add_option("--config-fragment", *fragments,
                  "merge a JSON fragment over the config (e.g. the aio settings `strata bench io --tune --out` writes); "
                  "--set applies after it (repeatable)")
      ->check(bench::non_empty_path());
  CLI::Option* steps_flag = cmd->add_option("--steps", *steps, "number of optimizer steps (overrides strata.steps)");
  cmd->add_option("--save-weights", options->save_weights, "write the final weights (fp32 safetensors) from rank 0")
      ->check(bench::non_empty_path());
  cmd->add_option("--resume", options->resume,
                  "continue from a checkpoint (a step-* directory, or strata.checkpoint.dir holding `latest`); "
                  "--steps stays the total step count")
      ->check(bench::non_empty_path());
  cmd->add_flag("--allow-new-data", options->allow_new_data,
               "resume on data other than the checkpoint was trained on (refused without it)");
  cmd->add_option("--summary-json", options->summary_json,
                  "write the run's summary (losses, tokens/s, peak bytes per tier, NVMe bytes, overlap) as JSON")
      ->check(bench::non_empty_path());
  cmd->add_option("--drive-tbw", options->drive_tbw,
                  "rated endurance of one NVMe drive in TB written: the summary then gives the days of this "
                  "training the drives last (one drive per nvme_path directory)")
      ->check(CLI::Range(0.0, 1e6));
  table[cmd] = [options, steps, steps_flag, fragments] {
    std::vector<std::string> merged;
    for (const std::string& f : *fragments) {
      const std::vector<std::string> keys = train::config_fragment_overrides(f);
      merged.insert(merged.end(), keys.begin(), keys.end());
    }
    options->overrides.insert(options->overrides.begin(), merged.begin(), merged.end());
    // Given at all, it is the step count: a negative one is refused (load_run_config), never replaced.
    if (steps_flag->count() > 0) options->steps = *steps;
    const train::TrainSummary summary = run_training(*options);
    // Stopped by a signal after writing a checkpoint: the shell's convention, 128 + the signal.
    return summary.stopped_by_signal != 0 ? 128 + summary.stopped_by_signal : 0;
  };
}

}  // namespace strata::cli
