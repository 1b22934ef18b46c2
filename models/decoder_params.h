// The param groups of a decoder (plan/param_provider.h): group 0 is the embedding, then each
// transformer block, the last group the final norm (and the LM head when it is not tied). Tensor names
// are Strata's own ("blocks.3.attn.qkv.weight"); models/hf_names.h maps them to Hugging Face names.
// Linear weights are stored [out, in].
//
// Untiled, block N is one group "blocks.N" (groups 1..n_layers). A tiled block (models/tiling.h)
// is its base group "blocks.N" (the untiled group less its tiled weights) followed by its tile
// groups, stage by stage ("blocks.N.mlp.fc.tile1of4" holds "blocks.N.mlp.fc.weight[r0:r1]"), so
// group indices come from DecoderLayout; the index helpers below hold for untiled models only.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <vector>

#include "plan/param_provider.h"
#include "models/model_config.h"
#include "models/tiling.h"

namespace strata::models {

// Tensor indices inside an untiled block group (and the embedding and head groups), in declaration order.
namespace gpt2_block {
enum : std::size_t { kLn1W, kLn1B, kQkvW, kQkvB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kMlpProjW, kMlpProjB };
}
namespace llama_block {
// The biases of q, k and v follow the weights, present only with ModelConfig::qkv_bias (Qwen2).
enum : std::size_t { kAttnNorm, kQ, kK, kV, kO, kMlpNorm, kGate, kUp, kDown, kQBias, kKBias, kVBias };
}
namespace embedding_group {
enum : std::size_t { kWte, kWpe };  // kWpe: GPT-2 only
}
namespace head_group {
// GPT-2: norm weight+bias (head tied to wte); LLaMA: norm, lm_head (none when tied_embeddings).
enum : std::size_t { kNormW, kNormB, kLmHead = 1 };
}

// Untiled models only (DecoderLayout gives the indices of any model).
inline std::size_t embedding_group_index() { return 0; }
inline std::size_t block_group_index(std::int64_t layer) { return static_cast<std::size_t>(1 + layer); }
inline std::size_t head_group_index(const ModelConfig& c) { return static_cast<std::size_t>(1 + c.n_layers); }

// The untiled groups.
std::vector<ParamGroupSpec> decoder_param_groups(const ModelConfig& config);
// Block `layer`'s untiled group "blocks.N".
ParamGroupSpec decoder_block_group(const ModelConfig& config, std::int64_t layer);

// Where one block's tensors live.
inline constexpr std::size_t kTiledTensor = static_cast<std::size_t>(-1);
struct BlockGroups {
  std::size_t base = 0;  // the base group: norms, biases, the weights of untiled stages
  BlockTiling tiling;
  std::array<std::size_t, kBlockStages> first_tile{};  // group of tile 0 of each tiled stage
  // Untiled block tensor index (gpt2_block::k*, llama_block::k*) -> index in the base group, or
  // kTiledTensor for a weight of a tiled stage.
  std::vector<std::size_t> base_index;

  std::int64_t tiles(BlockStage stage) const { return stage_tiles(tiling, stage); }
  std::size_t tile_group(BlockStage stage, std::int64_t tile) const {
    return first_tile[static_cast<std::size_t>(stage)] + static_cast<std::size_t>(tile);
  }
};

// The groups of a decoder under a tiling, and where each block's tensors went.
struct DecoderLayout {
  TilingSpec tiling;
  std::size_t embedding = 0;
  std::size_t head = 0;
  std::vector<BlockGroups> blocks;
  std::vector<ParamGroupSpec> groups;
};
// Validates `tiling` for `config` (models/tiling.h; auto counts must be resolved first).
DecoderLayout decoder_layout(const ModelConfig& config, const TilingSpec& tiling);
std::vector<ParamGroupSpec> decoder_param_groups(const ModelConfig& config, const TilingSpec& tiling);

// A whole tensor of the untiled model and where its rows live among a provider's groups: one part
// for a tensor declared whole, one per tile for a tiled weight (ascending rows).
struct TensorPart {
  std::size_t group = 0, tensor = 0;
  RowRange rows;
};
struct WholeTensor {
  ParamTensorSpec spec;  // the untiled tensor
  std::vector<TensorPart> parts;

  std::size_t row_bytes() const;  // bytes of one row (first dimension) in spec.dtype
  std::size_t part_offset_bytes(const TensorPart& part) const {
    return static_cast<std::size_t>(part.rows.begin) * row_bytes();
  }
  std::size_t part_bytes(const TensorPart& part) const {
    return static_cast<std::size_t>(part.rows.rows()) * row_bytes();
  }
};
// Every whole tensor of `config`, in the untiled declaration order (the order of the safetensors
// files Strata writes), located in `groups` (tiled or not). Error naming the tensor when `groups`
// lack rows of it, overlap, or do not belong to `config`.
std::vector<WholeTensor> whole_tensors(const ModelConfig& config, std::span<const ParamGroupSpec> groups);

}  // namespace strata::models
