// Memory-centric tiling of the decoders' large linear layers: what a tiled block looks like, how it
// is configured (`strata.tiling`), the automatic rule that picks tile counts from a live budget, and
// the names that map a tile tensor back to the whole tensor it is a slice of.
//
// A block's large linear weights fall into four stages, computed one after another:
//   attention in   GPT-2 attn.qkv            LLaMA attn.q, attn.k, attn.v
//   attention out  GPT-2 attn.proj           LLaMA attn.o
//   MLP in         GPT-2 mlp.fc              LLaMA mlp.gate, mlp.up
//   MLP out        GPT-2 mlp.proj            LLaMA mlp.down
// With T > 1 tiles, each stage's weights ([out, in], row-major) are split into T row ranges (along
// the output dimension); tile t of a stage is one param group holding rows t of each of the stage's
// weights. The block's other tensors (norms, all biases, the weights of untiled stages) stay whole
// in the block's base group, named "blocks.N" as in an untiled model. The decoder holds the base
// group for the whole block and one tile group at a time (models/decoder.h), so the live parameter
// bytes of a block are those of its base group plus its largest tile.
//
// Config (`strata.tiling`, every key optional; {} leaves every block untiled):
//   {
//     "default": 4 | {"attn": 2, "mlp": 4} | "auto",   // every block not named in "layers"
//     "layers":  {"3": 8, "5": {"mlp": 8}},           // per block (0-based index), overrides default
//     "chunks":  16                                   // reduction chunks per linear (see below)
//   }
// A number sets both attention and MLP tiles; an object sets them apart (a missing one is 1); "auto"
// (as the default, in a layer, or as "attn"/"mlp") is resolved by resolve_auto_tiles() with the
// live budget. Tile counts must divide `chunks` and be at most the smallest output dimension of the
// stage's weights, so that every tile holds at least one row of every weight.
//
// Note [Tile-invariant linear layers]: tiled and untiled runs give the same bits in fp32 (on sim
// at any precision; on cuda in exact mode: Note [Linear chunks by default] in models/tiling_plan.h). Splitting
// W [out, in] by output rows keeps the forward (y = x W^T sums over `in`) and the weight gradient
// (dW = dy^T x sums over tokens) whole per element, but splits dx = dy W, a sum over `out`. So every
// block linear, tiled or not, is computed in `chunks` fixed row chunks (chunk c = rows
// [c*out/chunks, (c+1)*out/chunks)): one matmul per chunk for y, dW and dbias, and dx accumulated
// chunk by chunk in ascending order (the stage's weights interleaved chunk-major, e.g. LLaMA q0 k0 v0
// q1 k1 v1 ...). A tile is a whole number of chunks, so a tiled run issues exactly the matmul calls
// of the untiled run, in the same order, on the same values: bit-identical results for any T that
// divides `chunks`. That holds on the CPU kernels (tested); on cuBLAS it holds as far as the kernel
// choice depends on the call's shape only (cuBLAS may also look at pointer alignment; a tile starts
// 256-byte aligned, an untiled chunk at row offset x `in` elements; not verified on a GPU).
// Changing `chunks` changes the summation order of dx, so compare runs with equal chunks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "models/model_config.h"

namespace strata::models {

inline constexpr std::int64_t kDefaultTileChunks = 16;
// A tile count still to be chosen by resolve_auto_tiles().
inline constexpr std::int64_t kAutoTiles = 0;

// Tile counts of one block: `attn` for the attention-in and -out stages, `mlp` for the MLP-in and
// -out stages. 1 = untiled.
struct BlockTiling {
  std::int64_t attn = 1;
  std::int64_t mlp = 1;
  bool operator==(const BlockTiling&) const = default;
};

struct TilingSpec {
  std::int64_t chunks = kDefaultTileChunks;  // Note [Tile-invariant linear layers]
  std::vector<BlockTiling> layers;           // one per block, or empty: every block untiled

  BlockTiling block(std::int64_t layer) const;
  bool tiled() const;     // some block has a stage with more than one tile
  bool has_auto() const;  // some count is kAutoTiles
  bool operator==(const TilingSpec&) const = default;
};

// Parses `strata.tiling` (schema above) for `model`; ConfigError naming the key path (`where`, e.g.
// "strata.tiling") and the fix on bad input. The result passes validate_tiling (auto counts aside).
TilingSpec parse_tiling(const nlohmann::json& j, const ModelConfig& model, std::string_view where = "strata.tiling");

// ConfigError naming the block, the stage and the rule when a count is invalid for `model`.
// kAutoTiles counts are accepted only with allow_auto.
void validate_tiling(const TilingSpec& spec, const ModelConfig& model, bool allow_auto = false);

// The four stages of a block's large linear layers, in execution order.
enum class BlockStage : std::size_t { AttnIn, AttnOut, MlpIn, MlpOut };
inline constexpr std::size_t kBlockStages = 4;
// "attn.qkv", "attn.proj" (LLaMA "attn.o"), "mlp.fc" (LLaMA "mlp.gate_up"), "mlp.proj" (LLaMA "mlp.down").
std::string_view block_stage_name(Architecture arch, BlockStage stage);
std::int64_t stage_tiles(const BlockTiling& tiling, BlockStage stage);

// One linear layer of a stage: its weight and bias (indices into the untiled block group of
// models/decoder_params.h; kNoBias for none) and its dimensions.
inline constexpr std::size_t kNoBias = static_cast<std::size_t>(-1);
struct StageLinear {
  std::size_t weight = 0;
  std::size_t bias = kNoBias;
  std::int64_t in = 0, out = 0;
};
std::vector<StageLinear> stage_linears(const ModelConfig& model, BlockStage stage);

// Row ranges: chunk c of a linear with `out` rows, and the rows of tile t of `tiles` (a whole
// number of chunks).
struct RowRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t rows() const { return end - begin; }
  bool operator==(const RowRange&) const = default;
};
RowRange chunk_rows(std::int64_t out, std::int64_t chunks, std::int64_t chunk);
RowRange tile_rows(std::int64_t out, std::int64_t chunks, std::int64_t tiles, std::int64_t tile);

// Working-dtype bytes of a block's base group and of its largest tile group under `tiling`.
struct BlockTileBytes {
  std::uint64_t base = 0;
  std::uint64_t largest_tile = 0;  // 0 when the block is untiled
  std::uint64_t live() const { return base + largest_tile; }
};
BlockTileBytes block_tile_bytes(const ModelConfig& model, const BlockTiling& tiling, std::int64_t chunks);

// The automatic rule: for every block, the fewest tiles (attention + MLP counts, dividing `chunks`)
// such that the block's base group plus its largest tile fit `budget_bytes` (working dtype). An
// untiled block that fits gets 1/1. ConfigError with the numbers and the knobs when even the most
// tiles allowed do not fit.
TilingSpec auto_tiles(const ModelConfig& model, std::uint64_t budget_bytes, std::int64_t chunks = kDefaultTileChunks);
// `spec` with every kAutoTiles count replaced by the automatic rule's choice for that block (a
// fixed count of the other stage kind is kept, and the auto one chosen to fit beside it).
TilingSpec resolve_auto_tiles(const TilingSpec& spec, const ModelConfig& model, std::uint64_t budget_bytes);

// Tile tensor names: "<whole name>[<row begin>:<row end>]", e.g. "blocks.3.mlp.fc.weight[768:1536]"
// holds rows 768..1535 of "blocks.3.mlp.fc.weight" (its other dimensions whole).
std::string tile_tensor_name(std::string_view whole_name, RowRange rows);
struct WholeTensorRows {
  std::string whole_name;
  RowRange rows;
};
// The whole tensor and rows a tile tensor name stands for; nullopt for a name that is not a tile.
std::optional<WholeTensorRows> whole_tensor_of(std::string_view tensor_name);

}  // namespace strata::models
