// Helpers shared by the decoder and tiling tests: the tiny models and deterministic token streams.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "models/model_config.h"

namespace strata::models::testing {

inline ModelConfig tiny(Architecture arch) {
  return model_config_by_name(arch == Architecture::Gpt2 ? "tiny" : "tiny-llama");
}

// The tiny models of the parameterized suites: GPT-2, LLaMA, and LLaMA with every option the
// Hugging Face families add (a tied head, q/k/v biases as Qwen2's, head_dim 12 where d_model /
// heads is 8, llama3 rope scaling with pairs in each of its three regimes).
enum class Tiny { Gpt2, Llama, LlamaOptions };
inline ModelConfig tiny(Tiny t) {
  if (t != Tiny::LlamaOptions) return tiny(t == Tiny::Gpt2 ? Architecture::Gpt2 : Architecture::Llama);
  ModelConfig c = model_config_by_name("tiny-llama");
  c.name = "tiny-llama-options";
  c.tied_embeddings = true;
  c.qkv_bias = true;
  c.attn_head_dim = 12;
  c.rope.scaling = RopeScaling::Llama3;
  c.rope.factor = 8.0f;
  c.rope.low_freq_factor = 1.0f;
  c.rope.high_freq_factor = 4.0f;
  c.rope.original_max_positions = 16.0f;
  c.validate();
  return c;
}
inline std::string tiny_name(Tiny t) {
  return t == Tiny::Gpt2 ? "gpt2" : t == Tiny::Llama ? "llama" : "llama_options";
}
inline const auto kEveryTiny = ::testing::Values(Tiny::Gpt2, Tiny::Llama, Tiny::LlamaOptions);

inline std::vector<std::int32_t> random_tokens(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = static_cast<std::int32_t>(rng() % 256);
  return t;
}

}  // namespace strata::models::testing
