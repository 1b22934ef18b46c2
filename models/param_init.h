// Per-tensor initialization of decoder weights, deterministic from (seed, tensor name) alone, so
// any owner of the weights — the resident provider, or a ZeRO engine that initializes one shard
// group at a time on every rank — produces the same values without a shared random stream.
// GPT-2 style: weights N(0, 0.02), output projections N(0, 0.02 / sqrt(2 n_layers)), norm weights
// 1, biases 0.
#pragma once

#include <cstdint>
#include <span>

#include "plan/param_provider.h"

namespace strata::models {

// `n_layers` scales the output projections. A tile tensor ("W[r0:r1]", models/tiling.h) gets
// exactly rows r0..r1-1 of the values whole tensor W gets, so tiled and untiled runs start equal.
void init_tensor_gpt2_style(std::int64_t n_layers, const ParamTensorSpec& tensor, std::uint64_t seed,
                            std::span<float> out);

}  // namespace strata::models
