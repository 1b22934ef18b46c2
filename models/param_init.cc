// Per-tensor initialization (see models/param_init.h).
#include "models/param_init.h"

#include <cmath>
#include <optional>
#include <random>
#include <string_view>

#include "models/tiling.h"

namespace strata::models {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// FNV-1a of the name, mixed with the seed: the tensor's own random stream.
std::uint64_t tensor_seed(std::uint64_t seed, std::string_view name) {
  std::uint64_t h = 1469598103934665603ull ^ (seed * 0x9E3779B97F4A7C15ull);
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

void init_tensor_gpt2_style(std::int64_t n_layers, const ParamTensorSpec& tensor, std::uint64_t seed,
                            std::span<float> out) {
  // A tile takes its rows of the whole tensor's values: same name, same stream, advanced past the
  // rows before it (models/tiling.h).
  const std::optional<WholeTensorRows> tile = whole_tensor_of(tensor.name);
  const std::string_view name = tile ? std::string_view(tile->whole_name) : std::string_view(tensor.name);
  const bool is_norm = name.find("norm") != std::string_view::npos || name.find(".ln") != std::string_view::npos;
  const bool is_bias = ends_with(name, ".bias");
  if (is_bias) {
    for (auto& v : out) v = 0.0f;
    return;
  }
  if (is_norm) {
    for (auto& v : out) v = 1.0f;
    return;
  }
  const bool is_out_proj = ends_with(name, "attn.proj.weight") || ends_with(name, "mlp.proj.weight") ||
                           ends_with(name, "attn.o.weight") || ends_with(name, "mlp.down.weight");
  const double stddev = is_out_proj ? 0.02 / std::sqrt(2.0 * static_cast<double>(n_layers)) : 0.02;
  std::mt19937_64 rng(tensor_seed(seed, name));
  std::normal_distribution<double> dist(0.0, stddev);
  if (tile) {
    std::size_t row_elems = 1;
    for (std::size_t d = 1; d < tensor.shape.size(); ++d) row_elems *= static_cast<std::size_t>(tensor.shape[d]);
    const std::size_t skip = static_cast<std::size_t>(tile->rows.begin) * row_elems;
    // The same draws the whole tensor makes (the distribution caches pairs, so draw, do not discard).
    for (std::size_t i = 0; i < skip; ++i) static_cast<void>(dist(rng));
  }
  for (auto& v : out) v = static_cast<float>(dist(rng));
}

}  // namespace strata::models
