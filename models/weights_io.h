// Loading and saving a decoder's weights as safetensors, through the ParamProvider (so it works for
// any provider, resident or ZeRO). Files may use Strata's tensor names or Hugging Face GPT-2/LLaMA
// names (detected from the file); a missing, extra or mis-shaped tensor is a FormatError naming it.
#pragma once

#include <string>

#include "core/device/device.h"
#include "engine/param_provider.h"
#include "models/model_config.h"

namespace strata::models {

enum class WeightNaming { Strata, HuggingFace };

// Reads `path` into the provider's weights (converting dtypes; transposing GPT-2 Conv1D weights).
// `stream` is null for host-resident providers. Returns the naming the file used.
WeightNaming load_weights(const std::string& path, const ModelConfig& config, ParamProvider& provider, Stream* stream);

// Writes the provider's weights to `path` with the given naming (metadata records model and arch).
void save_weights(const std::string& path, const ModelConfig& config, ParamProvider& provider, Stream* stream,
                  WeightNaming naming);

}  // namespace strata::models
