// Mapping between Strata's tensor names (models/decoder_params.h) and Hugging Face's GPT-2
// (GPT2Model / GPT2LMHeadModel, Conv1D weights stored [in, out], hence transposed) and LLaMA
// (LlamaForCausalLM, nn.Linear weights [out, in], rotate_half RoPE as Strata's) names, so weights
// travel both ways.
//
// Shared and missing tensors follow Hugging Face's files: GPT-2's LM head is tied to the token
// embedding, so Strata has no head tensor and a GPT-2 file carries "wte.weight" only (HF's
// GPT2LMHeadModel ties "lm_head.weight" to it on load and omits it on save); a LLaMA-family head
// is its own tensor "lm_head.weight" unless the config ties it (tie_word_embeddings: Llama 3.2 1B,
// Qwen2 0.5B), when a file's copy is skipped on load and none is written. The names are those of
// the bare model for GPT-2 ("wte.weight", as the hub's gpt2 files spell them; "transformer."-prefixed
// names are accepted on load) and of LlamaForCausalLM for LLaMA ("model.embed_tokens.weight").
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

// The Hugging Face model class that loads the tensors hf_tensor_names() names for `arch`
// ("GPT2LMHeadModel", "LlamaForCausalLM"); nullopt for an architecture without Hugging Face names.
std::optional<std::string_view> hf_model_class(Architecture arch);

// One entry per Strata tensor, in param-group order (the untiled model's).
std::vector<HfTensorName> hf_tensor_names(const ModelConfig& config);

// Normalizes a name found in a HF file: strips GPT2LMHeadModel's "transformer." prefix.
std::string normalize_hf_name(const ModelConfig& config, std::string_view name);

// Tensors that HF files may carry but that are not parameters (GPT-2's causal-mask buffers
// "h.N.attn.bias"/"h.N.attn.masked_bias", GPT-2's tied "lm_head.weight", old LLaMA files'
// "rotary_emb.inv_freq"): skipped on load.
bool is_ignorable_hf_tensor(const ModelConfig& config, std::string_view normalized_name);

}  // namespace strata::models
