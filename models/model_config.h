// Decoder model configurations: GPT-2 style (learned positions, layer norm, GELU, tied embeddings)
// and LLaMA style (RoPE, RMS norm, SwiGLU, grouped-query attention; Mistral and Qwen2 are LLaMA with
// its options: tied or untied head, biases on q/k/v, a head_dim of its own, rope_scaling), by name
// (`tiny`, `tiny-llama`, `gpt2-124m`, `gpt2-1.5b`, `llama-1b`, `llama-7b`, `llama-13b`, `llama-70b`),
// by fields, or from a Hugging Face config.json (models/hf_config.h), with parameter counts and
// FLOPs per token.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"
#include "models/kernels/rope_spec.h"

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
  RopeSpec rope;                 // LLaMA only: theta and rope_scaling
  std::int64_t attn_head_dim = 0;  // LLaMA only; 0: d_model / n_heads
  bool tied_embeddings = true;   // the LM head is the token embedding (always for GPT-2)
  bool qkv_bias = false;         // LLaMA only: q, k and v projections carry biases (Qwen2)
  DType dtype = DType::F32;      // weights, gradients and activations (fp32 accumulation always)

  std::int64_t head_dim() const { return attn_head_dim > 0 ? attn_head_dim : d_model / n_heads; }
  // The width of the attention's output (heads x head_dim), d_model unless head_dim is its own.
  std::int64_t attn_width() const { return n_heads * head_dim(); }
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
// every field given ("arch": "gpt2"|"llama"; LLaMA's options "head_dim", "tied_embeddings",
// "qkv_bias", "rope_theta", "rope_scaling": {"type": "linear"|"llama3", "factor", ...}). Unknown
// keys are a ConfigError naming the key.
ModelConfig model_config_from_json(const nlohmann::json& j);
// Hugging Face's rope_scaling object (null: none) with base `theta`: "linear" or "llama3"
// (models/kernels/rope_spec.h); any other kind or key is a ConfigError naming `where`.
RopeSpec rope_scaling_from_json(const nlohmann::json& j, float theta, std::string_view where);

// Parameters of the model (tied embeddings counted once).
std::int64_t param_count(const ModelConfig& config);
// Training FLOPs per token (forward + backward) at sequence length seq_len, with the PaLM appendix
// convention: 6 x (parameters in matmuls, LM head included) + 12 x layers x d_attn x seq_len for the
// attention score and value products (not halved for the causal mask).
double train_flops_per_token(const ModelConfig& config, std::int64_t seq_len);

}  // namespace strata::models
