// Loading and saving a decoder's weights as safetensors, through the ParamProvider (so it works for
// any provider, resident or ZeRO). Files may use Strata's tensor names or Hugging Face GPT-2/LLaMA
// names (detected from the file); a missing, extra or mis-shaped tensor is a FormatError naming it.
// Tiled models (models/tiling.h) read and write the same files as untiled ones: a tiled weight is
// split into its tiles on load and reassembled on save.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "plan/param_provider.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "models/weight_source.h"

namespace strata::models {

// Reads `path` (a safetensors file or a Hugging Face model folder, models/weight_source.h) into the
// provider's weights (converting dtypes; transposing GPT-2 Conv1D weights). `stream` is null for
// host-resident providers. Returns the naming the file used.
WeightNaming load_weights(const std::string& path, const ModelConfig& config, ParamProvider& provider, Stream* stream);

// Writes the provider's weights to `path` with the given naming (metadata records model and arch).
void save_weights(const std::string& path, const ModelConfig& config, ParamProvider& provider, Stream* stream,
                  WeightNaming naming);

// The values of one of the provider's tensors (whole, or a tile "W[r0:r1]") as fp32, from a weight
// source (a file `strata train --save-weights` writes, a Hugging Face file or folder): the engine's
// init callback for strata.init_weights and a model folder. FormatError naming the tensor when
// `config` has no such tensor, and naming the element when a value is NaN or infinite (the source
// checked the rest when it opened).
void read_init_tensor(const WeightSource& source, const ModelConfig& config, const ParamTensorSpec& tensor,
                      std::span<float> out);

// fp32 values of every tensor of `groups` in group order (values[i] for the i-th tensor, counting
// group by group, as ZeroEngine::gather_master gives them) reassembled into the whole tensors of
// `config`, in the untiled declaration order: what `strata train --save-weights` writes, the same
// file for a tiled and an untiled model.
struct WholeTensorValues {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};
std::vector<WholeTensorValues> assemble_whole_tensors(const ModelConfig& config, std::span<const ParamGroupSpec> groups,
                                                      std::span<const std::vector<float>> values);

}  // namespace strata::models
