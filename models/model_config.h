// Decoder model configurations: GPT-2 style (learned positions, layer norm, GELU, tied embeddings)
// and LLaMA style (RoPE, RMS norm, SwiGLU, untied head, grouped-query attention), by name
// (`tiny`, `tiny-llama`, `gpt2-124m`, `gpt2-1.5b`, `llama-1b`, `llama-7b`, `llama-13b`, `llama-70b`)
// or by fields, with parameter counts and FLOPs per token.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"

namespace strata::models {

enum class Architecture { Gpt2, Llama };
std::string_view architecture_name(Architecture arch);

struct ModelConfig {
  std::string name;
  Architecture arch = Architecture::Gpt2;
  std::int64_t vocab_size = 0;
  std::int64_t max_seq_len = 0;
  std::int64_t n_layers = 0;
  std::int64_t d_model = 0;
  std::int64_t n_heads = 0;
  std::int64_t n_kv_heads = 0;   // == n_heads for GPT-2
  std::int64_t ffn_hidden = 0;   // 4 d_model for GPT-2; SwiGLU width for LLaMA
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;   // LLaMA only
  DType dtype = DType::F32;      // weights, gradients and activations (fp32 accumulation always)

  std::int64_t head_dim() const { return d_model / n_heads; }
  // Throws ConfigError naming the field and the rule it breaks.
  void validate() const;
};

std::vector<std::string> known_model_names();
// ConfigError listing the known names when `name` is not one of them.
ModelConfig model_config_by_name(std::string_view name);
// Whether the model's shape allows `tensor`-way tensor parallelism (heads, KV heads and the MLP
// width split evenly; KV heads fewer than the ranks are replicated, which needs T a multiple of
// them) and `pipeline` stages (at least one layer each). Throws ConfigError naming `source`, the key
// (strata.parallel.tensor / .pipeline), the model's numbers and the valid choices.
void check_parallel_shape(const ModelConfig& config, int tensor, int pipeline, const std::string& source);
// {"name": "gpt2-124m", "n_layers": 4, ...}: a named base (optional) with fields overridden, or
// every field given ("arch": "gpt2"|"llama"). Unknown keys are a ConfigError naming the key.
ModelConfig model_config_from_json(const nlohmann::json& j);

// Parameters of the model (tied embeddings counted once).
std::int64_t param_count(const ModelConfig& config);
// Training FLOPs per token (forward + backward) at sequence length seq_len, with the PaLM appendix
// convention: 6 x (parameters in matmuls, LM head included) + 12 x layers x d_attn x seq_len for the
// attention score and value products (not halved for the causal mask).
double train_flops_per_token(const ModelConfig& config, std::int64_t seq_len);

}  // namespace strata::models
