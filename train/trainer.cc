// The training session's entry points (see train/trainer.h): the config a run reads, the model it
// describes, and run_training, which calls the phases of a TrainingRun (train/training_run.h) in
// order. Checkpoints, resume and stopping on a signal are in train/trainer_checkpoints.cc; the step
// loop in train/step_loop.cc; what the user sees (progress, metrics, closing lines) in
// train/trainer_report.cc.
#include "train/trainer.h"

#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/file_io.h"
#include "config/config.h"
#include "config/json_input.h"
#include "models/hf_config.h"
#include "models/model_config.h"
#include "train/demo_config.h"  // generated from configs/demo.json (train/CMakeLists.txt)
#include "train/training_run.h"

namespace strata::train {

std::vector<std::string> config_fragment_overrides(const std::string& path) {
  const std::string text = read_text_file(path, "--config-fragment");
  JsonInputError error;
  const std::optional<nlohmann::json> doc = parse_json_input(text, JsonComments::Allow, &error);
  if (!doc) {
    throw ConfigError(fmt::format("--config-fragment {}: not JSON ({}{}); it holds an object of config sections, as "
                                  "`strata bench io --tune --out` writes",
                                  path, error.message, json_error_place(text, error).empty() ? "" : ", " + json_error_place(text, error)));
  }
  if (!doc->is_object()) throw ConfigError(fmt::format("--config-fragment {}: expected a JSON object of config sections", path));
  std::vector<std::string> out;
  const auto flatten = [&](const auto& self, const nlohmann::json& v, const std::string& key) -> void {
    if (v.is_object() && !v.empty()) {
      for (const auto& [k, child] : v.items()) self(self, child, key.empty() ? k : key + "." + k);
    } else {
      out.push_back(key + "=" + v.dump());
    }
  };
  flatten(flatten, *doc, "");
  return out;
}

TrainConfig load_train_config_or_demo(const std::string& path, const std::vector<std::string>& overrides) {
  if (!path.empty()) return load_train_config(path, overrides);
  return load_train_config_text(kDemoConfigJson, "configs/demo.json (built in)", overrides);
}

std::string initial_weights_path(const TrainConfig& cfg) {
  if (!cfg.strata.init_weights.empty()) return cfg.strata.init_weights;
  if (cfg.strata.model.is_string() && models::is_hf_model_folder(cfg.strata.model.get<std::string>())) {
    return cfg.strata.model.get<std::string>();
  }
  return {};
}

models::ModelConfig training_model_config(const TrainConfig& cfg, bool* checkpointing) {
  *checkpointing = false;
  models::ModelConfig m;
  if (cfg.strata.model.is_string() && models::is_hf_model_folder(cfg.strata.model.get<std::string>())) {
    const models::HfModelFolder folder = models::open_hf_model_folder(cfg.strata.model.get<std::string>());
    m = folder.config;
    static bool said = false;  // estimate and train may both read the model: say it once
    for (const std::string& note : folder.notes) {
      if (!said) spdlog::warn("{}", note);
    }
    said = true;
  } else if (cfg.strata.model.is_string()) {
    m = models::model_config_by_name(cfg.strata.model.get<std::string>());
  } else {
    nlohmann::json j = cfg.strata.model;
    if (j.contains("checkpoint_activations")) {
      if (!j["checkpoint_activations"].is_boolean()) {
        throw ConfigError(fmt::format("{}: strata.model.checkpoint_activations must be true or false", cfg.source));
      }
      *checkpointing = j["checkpoint_activations"].get<bool>();
      j.erase("checkpoint_activations");
    }
    m = models::model_config_from_json(j);
  }
  switch (cfg.precision) {
    case Precision::Fp32: m.dtype = DType::F32; break;
    case Precision::Bf16: m.dtype = DType::BF16; break;
    case Precision::Fp16: m.dtype = DType::F16; break;
  }
  m.validate();
  if (cfg.strata.data.seq_len > m.max_seq_len) {
    throw ConfigError(fmt::format("{}: strata.data.seq_len = {} exceeds the model's max_seq_len {}; lower seq_len",
                                  cfg.source, cfg.strata.data.seq_len, m.max_seq_len));
  }
  return m;
}

TrainSummary run_training(const TrainOptions& options) {
  TrainingRun run(options);
  run.open_world();
  run.lay_out_model();
  run.build_decoder();
  run.plan_placement();
  run.build_engine();
  run.resume_or_start();
  run.prepare_steps();
  run.train();
  return run.finish();
}

}  // namespace strata::train
