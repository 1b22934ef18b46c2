// The param groups of a decoder (engine/param_provider.h): group 0 is the embedding, groups
// 1..n_layers the transformer blocks, the last group the final norm (and the untied LM head for
// LLaMA). Tensor names are Strata's own ("blocks.3.attn.qkv.weight"); models/hf_names.h maps them
// to Hugging Face names. Linear weights are stored [out, in].
#pragma once

#include <cstddef>
#include <vector>

#include "engine/param_provider.h"
#include "models/model_config.h"

namespace strata::models {

// Tensor indices inside each group, in declaration order.
namespace gpt2_block {
enum : std::size_t { kLn1W, kLn1B, kQkvW, kQkvB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kMlpProjW, kMlpProjB };
}
namespace llama_block {
enum : std::size_t { kAttnNorm, kQ, kK, kV, kO, kMlpNorm, kGate, kUp, kDown };
}
namespace embedding_group {
enum : std::size_t { kWte, kWpe };  // kWpe: GPT-2 only
}
namespace head_group {
enum : std::size_t { kNormW, kNormB, kLmHead = 1 };  // GPT-2: norm weight+bias (head tied to wte); LLaMA: norm, lm_head
}

inline std::size_t embedding_group_index() { return 0; }
inline std::size_t block_group_index(std::int64_t layer) { return static_cast<std::size_t>(1 + layer); }
inline std::size_t head_group_index(const ModelConfig& c) { return static_cast<std::size_t>(1 + c.n_layers); }

std::vector<ParamGroupSpec> decoder_param_groups(const ModelConfig& config);

}  // namespace strata::models
