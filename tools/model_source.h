// The model a command runs from its --model and --weights flags (strata eval, strata generate):
// --model is a built-in name (tiny, gpt2-124m, llama-7b, ...; then --weights is required) or a
// Hugging Face model folder (models/hf_config.h; its config.json gives the model and, unless
// --weights says otherwise, its safetensors give the weights).
#pragma once

#include <string>
#include <vector>

#include "models/model_config.h"

namespace strata::tools {

struct ModelSource {
  models::ModelConfig config;
  std::string weights;             // a safetensors file or a model folder (models/weight_source.h)
  std::string folder;              // the Hugging Face model folder, empty for a built-in name
  std::vector<std::string> notes;  // lines worth printing once (models/hf_config.h)
};

// ConfigError naming `command`'s flags when a name comes without --weights, or the name is unknown.
ModelSource resolve_model_source(const std::string& model, const std::string& weights, const std::string& command);

}  // namespace strata::tools
