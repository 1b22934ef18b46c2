// Tiling specs, their parsing and the automatic rule (see models/tiling.h).
#include "models/tiling.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <optional>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "models/decoder_params.h"

namespace strata::models {

namespace {

constexpr std::int64_t kMaxChunks = 1 << 16;

enum class StageKind { Attn, Mlp };

std::string_view kind_name(StageKind k) { return k == StageKind::Attn ? "attn" : "mlp"; }

std::array<BlockStage, 2> stages_of(StageKind k) {
  return k == StageKind::Attn ? std::array{BlockStage::AttnIn, BlockStage::AttnOut}
                              : std::array{BlockStage::MlpIn, BlockStage::MlpOut};
}

// The most tiles a stage kind allows: every tile must hold at least one row of every weight.
std::int64_t max_tiles(const ModelConfig& model, StageKind k) {
  std::int64_t rows = std::numeric_limits<std::int64_t>::max();
  for (BlockStage s : stages_of(k)) {
    for (const StageLinear& lin : stage_linears(model, s)) rows = std::min(rows, lin.out);
  }
  return rows;
}

// Empty when `tiles` is valid, else why not (the caller names the place).
std::string count_problem(const ModelConfig& model, std::int64_t chunks, StageKind k, std::int64_t tiles) {
  if (tiles < 1) return fmt::format("{} tiles must be at least 1", tiles);
  // The cap first: raising chunks cannot help a count past it.
  const std::int64_t most = max_tiles(model, k);
  if (tiles > most) {
    return fmt::format(
        "{} tiles exceed the {} rows of the smallest {} weight of model '{}' (every tile needs a row of it); use at "
        "most {}",
        tiles, most, kind_name(k), model.name, most);
  }
  if (chunks % tiles != 0) {
    return fmt::format(
        "{} tiles do not divide the {} reduction chunks (tile counts must divide strata.tiling.chunks; "
        "raise chunks to a multiple of {})",
        tiles, chunks, tiles);
  }
  return {};
}

std::int64_t parse_count(const nlohmann::json& v, const std::string& path) {
  if (v.is_string() && v.get<std::string>() == "auto") return kAutoTiles;
  if (!v.is_number_integer()) {
    throw ConfigError(fmt::format("{}: expected a positive tile count or \"auto\", got {}", path, v.dump()));
  }
  const auto n = v.get<std::int64_t>();
  if (n < 1) throw ConfigError(fmt::format("{}: tile count {} must be at least 1 (1 = untiled)", path, n));
  return n;
}

BlockTiling parse_block(const nlohmann::json& v, const std::string& path) {
  if (!v.is_object()) {
    const std::int64_t n = parse_count(v, path);
    return {n, n};
  }
  BlockTiling b;
  for (const auto& [key, value] : v.items()) {
    if (key == "attn") {
      b.attn = parse_count(value, path + ".attn");
    } else if (key == "mlp") {
      b.mlp = parse_count(value, path + ".mlp");
    } else {
      throw ConfigError(fmt::format("{}: unknown key '{}'; known keys: attn, mlp", path, key));
    }
  }
  return b;
}

void check_block(const ModelConfig& model, std::int64_t chunks, const BlockTiling& b, const std::string& where,
                 bool allow_auto) {
  for (StageKind k : {StageKind::Attn, StageKind::Mlp}) {
    const std::int64_t tiles = k == StageKind::Attn ? b.attn : b.mlp;
    if (tiles == kAutoTiles && allow_auto) continue;
    const std::string why = tiles == kAutoTiles ? std::string("\"auto\" must be resolved with a live budget first")
                                                : count_problem(model, chunks, k, tiles);
    if (!why.empty()) throw ConfigError(fmt::format("{}.{}: {}", where, kind_name(k), why));
  }
}

std::uint64_t weight_bytes(const ModelConfig& model, const StageLinear& lin, std::int64_t rows) {
  return static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(lin.in) * dtype_bytes(model.dtype);
}

}  // namespace

BlockTiling TilingSpec::block(std::int64_t layer) const {
  if (layers.empty()) return {};
  STRATA_CHECK(layer >= 0 && static_cast<std::size_t>(layer) < layers.size(), "layer {} of {} tiled blocks", layer,
               layers.size());
  return layers[static_cast<std::size_t>(layer)];
}

bool TilingSpec::tiled() const {
  return std::any_of(layers.begin(), layers.end(), [](const BlockTiling& b) { return b.attn > 1 || b.mlp > 1; });
}

bool TilingSpec::has_auto() const {
  return std::any_of(layers.begin(), layers.end(),
                     [](const BlockTiling& b) { return b.attn == kAutoTiles || b.mlp == kAutoTiles; });
}

std::string_view block_stage_name(Architecture arch, BlockStage stage) {
  const bool gpt2 = arch == Architecture::Gpt2;
  switch (stage) {
    case BlockStage::AttnIn:
      return "attn.qkv";
    case BlockStage::AttnOut:
      return gpt2 ? "attn.proj" : "attn.o";
    case BlockStage::MlpIn:
      return gpt2 ? "mlp.fc" : "mlp.gate_up";
    case BlockStage::MlpOut:
      return gpt2 ? "mlp.proj" : "mlp.down";
  }
  return "?";
}

std::int64_t stage_tiles(const BlockTiling& tiling, BlockStage stage) {
  return stage == BlockStage::AttnIn || stage == BlockStage::AttnOut ? tiling.attn : tiling.mlp;
}

std::vector<StageLinear> stage_linears(const ModelConfig& c, BlockStage stage) {
  const std::int64_t C = c.d_model, F = c.ffn_hidden, hd = c.head_dim();
  if (c.arch == Architecture::Gpt2) {
    using namespace gpt2_block;
    switch (stage) {
      case BlockStage::AttnIn:
        return {{kQkvW, kQkvB, C, 3 * C}};
      case BlockStage::AttnOut:
        return {{kAttnProjW, kAttnProjB, C, C}};
      case BlockStage::MlpIn:
        return {{kFcW, kFcB, C, F}};
      case BlockStage::MlpOut:
        return {{kMlpProjW, kMlpProjB, F, C}};
    }
  } else {
    using namespace llama_block;
    switch (stage) {
      case BlockStage::AttnIn:
        return {{kQ, c.qkv_bias ? kQBias : kNoBias, C, c.n_heads * hd},
                {kK, c.qkv_bias ? kKBias : kNoBias, C, c.n_kv_heads * hd},
                {kV, c.qkv_bias ? kVBias : kNoBias, C, c.n_kv_heads * hd}};
      case BlockStage::AttnOut:
        return {{kO, kNoBias, c.n_heads * hd, C}};
      case BlockStage::MlpIn:
        return {{kGate, kNoBias, C, F}, {kUp, kNoBias, C, F}};
      case BlockStage::MlpOut:
        return {{kDown, kNoBias, F, C}};
    }
  }
  return {};
}

RowRange chunk_rows(std::int64_t out, std::int64_t chunks, std::int64_t chunk) {
  return {chunk * out / chunks, (chunk + 1) * out / chunks};
}

RowRange tile_rows(std::int64_t out, std::int64_t chunks, std::int64_t tiles, std::int64_t tile) {
  const std::int64_t per_tile = chunks / tiles;
  return {chunk_rows(out, chunks, tile * per_tile).begin, chunk_rows(out, chunks, (tile + 1) * per_tile - 1).end};
}

void validate_tiling(const TilingSpec& spec, const ModelConfig& model, bool allow_auto) {
  if (spec.chunks < 1 || spec.chunks > kMaxChunks) {
    throw ConfigError(fmt::format("tiling chunks {} must be in 1..{}", spec.chunks, kMaxChunks));
  }
  if (!spec.layers.empty() && static_cast<std::int64_t>(spec.layers.size()) != model.n_layers) {
    throw ConfigError(
        fmt::format("tiling has {} blocks but model '{}' has {}", spec.layers.size(), model.name, model.n_layers));
  }
  for (std::size_t l = 0; l < spec.layers.size(); ++l) {
    check_block(model, spec.chunks, spec.layers[l], fmt::format("tiling of block {}", l), allow_auto);
  }
}

TilingSpec parse_tiling(const nlohmann::json& j, const ModelConfig& model, std::string_view where) {
  const std::string w(where);
  if (!j.is_object()) {
    throw ConfigError(fmt::format("{}: expected an object such as {{\"default\": 2, \"layers\": {{\"3\": 4}}}}, got {}",
                                  w, j.dump()));
  }
  TilingSpec spec;
  for (const auto& [key, value] : j.items()) {
    if (key != "default" && key != "layers" && key != "chunks") {
      throw ConfigError(fmt::format("{}: unknown key '{}'; known keys: default, layers, chunks", w, key));
    }
  }
  if (j.contains("chunks")) {
    const auto& v = j["chunks"];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > kMaxChunks) {
      throw ConfigError(fmt::format("{}.chunks: expected an integer in 1..{}, got {}", w, kMaxChunks, v.dump()));
    }
    spec.chunks = v.get<std::int64_t>();
  }
  BlockTiling fallback;
  if (j.contains("default")) {
    fallback = parse_block(j["default"], w + ".default");
    check_block(model, spec.chunks, fallback, w + ".default", true);
  }
  std::vector<BlockTiling> layers(static_cast<std::size_t>(model.n_layers), fallback);
  if (j.contains("layers")) {
    const auto& per = j["layers"];
    if (!per.is_object()) {
      throw ConfigError(
          fmt::format("{}.layers: expected an object from block index to tiles, such as {{\"3\": 4}}, "
                      "got {}",
                      w, per.dump()));
    }
    for (const auto& [key, value] : per.items()) {
      const std::string path = fmt::format("{}.layers.{}", w, key);
      std::int64_t layer = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), layer);
      if (ec != std::errc() || end != key.data() + key.size() || layer < 0 || layer >= model.n_layers) {
        throw ConfigError(fmt::format("{}: '{}' is not a block index of model '{}' (0..{})", path, key, model.name,
                                      model.n_layers - 1));
      }
      const BlockTiling b = parse_block(value, path);
      check_block(model, spec.chunks, b, path, true);
      layers[static_cast<std::size_t>(layer)] = b;
    }
  }
  const bool trivial =
      std::all_of(layers.begin(), layers.end(), [](const BlockTiling& b) { return b == BlockTiling{}; });
  if (!trivial) spec.layers = std::move(layers);
  return spec;
}

BlockTileBytes block_tile_bytes(const ModelConfig& model, const BlockTiling& tiling, std::int64_t chunks) {
  BlockTileBytes out;
  for (const ParamTensorSpec& t : decoder_block_group(model, 0).tensors) out.base += t.bytes();
  for (std::size_t s = 0; s < kBlockStages; ++s) {
    const auto stage = static_cast<BlockStage>(s);
    const std::int64_t T = stage_tiles(tiling, stage);
    if (T <= 1) continue;
    const auto lins = stage_linears(model, stage);
    for (const StageLinear& lin : lins) out.base -= weight_bytes(model, lin, lin.out);
    for (std::int64_t t = 0; t < T; ++t) {
      std::uint64_t bytes = 0;
      for (const StageLinear& lin : lins) bytes += weight_bytes(model, lin, tile_rows(lin.out, chunks, T, t).rows());
      out.largest_tile = std::max(out.largest_tile, bytes);
    }
  }
  return out;
}

namespace {

// Tile counts allowed for a stage kind: the divisors of chunks up to max_tiles, ascending.
std::vector<std::int64_t> allowed_counts(const ModelConfig& model, std::int64_t chunks, StageKind k) {
  std::vector<std::int64_t> out;
  const std::int64_t most = max_tiles(model, k);
  for (std::int64_t t = 1; t <= chunks && t <= most; ++t) {
    if (chunks % t == 0) out.push_back(t);
  }
  return out;
}

BlockTiling choose(const ModelConfig& model, BlockTiling want, std::int64_t chunks, std::uint64_t budget_bytes,
                   const std::string& block) {
  const std::vector<std::int64_t> fixed_attn{want.attn}, fixed_mlp{want.mlp};
  const auto attn = want.attn == kAutoTiles ? allowed_counts(model, chunks, StageKind::Attn) : fixed_attn;
  const auto mlp = want.mlp == kAutoTiles ? allowed_counts(model, chunks, StageKind::Mlp) : fixed_mlp;
  std::optional<BlockTiling> best;
  auto better = [](const BlockTiling& a, const BlockTiling& b) {  // fewer tiles first, then the more even split
    return std::tuple(a.attn + a.mlp, std::max(a.attn, a.mlp), a.attn) <
           std::tuple(b.attn + b.mlp, std::max(b.attn, b.mlp), b.attn);
  };
  for (std::int64_t a : attn) {
    for (std::int64_t m : mlp) {
      const BlockTiling cand{a, m};
      if (block_tile_bytes(model, cand, chunks).live() > budget_bytes) continue;
      if (!best || better(cand, *best)) best = cand;
    }
  }
  if (best) return *best;
  const BlockTiling most{attn.back(), mlp.back()};
  const BlockTileBytes bytes = block_tile_bytes(model, most, chunks);
  throw ConfigError(fmt::format(
      "{} of model '{}' does not fit the live parameter budget of {}: with the most tiles allowed (attn {}, mlp {}; "
      "strata.tiling.chunks {}) its base group ({}) plus its largest tile ({}) take {}; raise the live budget "
      "(zero_optimization.stage3_max_live_parameters, strata.device.memory) or strata.tiling.chunks",
      block, model.name, format_bytes(budget_bytes), most.attn, most.mlp, chunks, format_bytes(bytes.base),
      format_bytes(bytes.largest_tile), format_bytes(bytes.live())));
}

}  // namespace

TilingSpec auto_tiles(const ModelConfig& model, std::uint64_t budget_bytes, std::int64_t chunks) {
  TilingSpec spec;
  spec.chunks = chunks;
  spec.layers.assign(static_cast<std::size_t>(model.n_layers), BlockTiling{kAutoTiles, kAutoTiles});
  return resolve_auto_tiles(spec, model, budget_bytes);
}

TilingSpec resolve_auto_tiles(const TilingSpec& spec, const ModelConfig& model, std::uint64_t budget_bytes) {
  validate_tiling(spec, model, true);
  TilingSpec out = spec;
  for (std::size_t l = 0; l < out.layers.size(); ++l) {
    BlockTiling& b = out.layers[l];
    if (b.attn != kAutoTiles && b.mlp != kAutoTiles) continue;
    b = choose(model, b, spec.chunks, budget_bytes, fmt::format("block {}", l));
  }
  if (!out.tiled()) out.layers.clear();
  return out;
}

std::string tile_tensor_name(std::string_view whole_name, RowRange rows) {
  return fmt::format("{}[{}:{}]", whole_name, rows.begin, rows.end);
}

std::optional<WholeTensorRows> whole_tensor_of(std::string_view name) {
  if (name.empty() || name.back() != ']') return std::nullopt;
  const std::size_t open = name.rfind('[');
  if (open == std::string_view::npos || open == 0) return std::nullopt;
  const std::string_view inside = name.substr(open + 1, name.size() - open - 2);
  const std::size_t colon = inside.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  auto parse = [](std::string_view s, std::int64_t* v) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
    return !s.empty() && ec == std::errc() && end == s.data() + s.size() && *v >= 0;
  };
  RowRange rows;
  if (!parse(inside.substr(0, colon), &rows.begin) || !parse(inside.substr(colon + 1), &rows.end) ||
      rows.end < rows.begin) {
    return std::nullopt;
  }
  return WholeTensorRows{std::string(name.substr(0, open)), rows};
}

}  // namespace strata::models
