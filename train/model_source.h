// The model a command runs from its --model and --weights flags (strata eval, strata generate):
// --model is a built-in name (tiny, gpt2-124m, llama-7b, ...; then --weights is required) or a
// Hugging Face model folder (models/hf_config.h; its config.json gives the model and, unless
// --weights says otherwise, its safetensors give the weights).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "models/model_config.h"
#include "models/token_data.h"

namespace strata::train {

struct ModelSource {
  models::ModelConfig config;
  std::string weights;             // a safetensors file or a model folder (models/weight_source.h)
  std::string folder;              // the Hugging Face model folder, empty for a built-in name
  std::vector<std::string> notes;  // lines worth printing once (models/hf_config.h)
};

// --model (required) and --weights on `cmd`, as eval and generate take them.
void add_model_flags(CLI::App& cmd, std::string& model, std::string& weights);

// ConfigError naming `command`'s flags when a name comes without --weights, or the name is unknown.
ModelSource resolve_model_source(const std::string& model, const std::string& weights, const std::string& command);

// A token file that names its tokenizer (strata data prepare) was made with the tokenizer of the
// model folder `folder` (when the folder has one): FormatError naming both hashes and the command
// that prepares the data otherwise. Nothing to check for files without a tokenizer hash or
// without a folder.
void check_data_tokenizer(const models::TokenFile& data, const std::string& data_path, const std::string& folder);

}  // namespace strata::train
