// Mapping between Strata's tensor names (models/decoder_params.h) and Hugging Face's GPT-2
// (GPT2Model / GPT2LMHeadModel, Conv1D weights stored [in, out], hence transposed) and LLaMA
// (LlamaForCausalLM, nn.Linear weights [out, in], rotate_half RoPE as Strata's) names, so weights
// travel both ways.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "models/model_config.h"

namespace strata::models {

struct HfTensorName {
  std::string strata_name;
  std::string hf_name;
  bool transposed = false;  // the HF tensor is the transpose of Strata's (GPT-2 Conv1D)
};

// One entry per Strata tensor, in param-group order.
std::vector<HfTensorName> hf_tensor_names(const ModelConfig& config);

// Normalizes a name found in a HF file: strips GPT2LMHeadModel's "transformer." prefix.
std::string normalize_hf_name(const ModelConfig& config, std::string_view name);

// Tensors that HF files may carry but that are not parameters (GPT-2's causal-mask buffers
// "h.N.attn.bias"/"h.N.attn.masked_bias", GPT-2's tied "lm_head.weight", old LLaMA files'
// "rotary_emb.inv_freq"): skipped on load.
bool is_ignorable_hf_tensor(const ModelConfig& config, std::string_view normalized_name);

}  // namespace strata::models
