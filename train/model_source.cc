// --model and --weights of eval and generate (train/model_source.h).
#include "train/model_source.h"
#include "models/tokenizer.h"
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "models/hf_config.h"

namespace strata::train {

ModelSource resolve_model_source(const std::string& model, const std::string& weights, const std::string& command) {
  ModelSource out;
  if (models::is_hf_model_folder(model)) {
    models::HfModelFolder folder = models::open_hf_model_folder(model);
    out.config = folder.config;
    out.notes = folder.notes;
    out.folder = model;
  } else {
    out.config = models::model_config_by_name(model);
  }
  out.weights = weights;
  if (out.weights.empty()) {
    if (out.folder.empty()) {
      throw ConfigError(
          fmt::format("{}: --weights is required with --model '{}' (a name, not a model folder)", command, model));
    }
    out.weights = out.folder;
  }
  return out;
}

void add_model_flags(CLI::App& cmd, std::string& model, std::string& weights) {
  cmd.add_option("--model", model, "model name (tiny, gpt2-124m, llama-7b, ...) or Hugging Face model folder")
      ->required();
  cmd.add_option("--weights", weights,
                 "safetensors file or model folder (Strata or Hugging Face names; default: the --model folder's)");
}

void check_data_tokenizer(const models::TokenFile& data, const std::string& data_path, const std::string& folder) {
  if (data.tokenizer_hash() == 0 || folder.empty()) return;
  std::error_code ec;
  const bool has_tokenizer = std::filesystem::exists(std::filesystem::path(folder) / "tokenizer.json", ec) ||
                             std::filesystem::exists(std::filesystem::path(folder) / "tokenizer.model", ec);
  if (!has_tokenizer) return;
  const models::TokenizerIdentity id = models::load_tokenizer(folder)->identity();
  if (id.file_hash != data.tokenizer_hash()) {
    throw FormatError(fmt::format("token file '{}' was tokenized by a tokenizer of hash {:016x}, and the model "
                                  "folder's '{}' has hash {:016x}: the ids mean other tokens for this model; prepare "
                                  "the data with `strata data prepare --tokenizer {} ...`",
                                  data_path, data.tokenizer_hash(), id.path, id.file_hash, folder));
  }
}

}  // namespace strata::train
