// Helpers shared by the decoder and tiling tests: the tiny models and deterministic token streams.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "models/model_config.h"

namespace strata::models::testing {

inline ModelConfig tiny(Architecture arch) {
  return model_config_by_name(arch == Architecture::Gpt2 ? "tiny" : "tiny-llama");
}

inline std::vector<std::int32_t> random_tokens(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = static_cast<std::int32_t>(rng() % 256);
  return t;
}

}  // namespace strata::models::testing
