// Param-group declaration of the decoders, untiled and tiled (see models/decoder_params.h).
#include "models/decoder_params.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace strata::models {

ParamGroupSpec decoder_block_group(const ModelConfig& c, std::int64_t layer) {
  const DType t = c.dtype;
  const std::int64_t d = c.d_model, f = c.ffn_hidden, hd = c.head_dim();
  const std::string p = fmt::format("blocks.{}", layer);
  ParamGroupSpec g{p, {}};
  auto add = [&](const char* n, std::vector<std::int64_t> shape) {
    g.tensors.push_back({p + "." + n, std::move(shape), t});
  };
  if (c.arch == Architecture::Gpt2) {
    add("ln1.weight", {d});
    add("ln1.bias", {d});
    add("attn.qkv.weight", {3 * d, d});
    add("attn.qkv.bias", {3 * d});
    add("attn.proj.weight", {d, d});
    add("attn.proj.bias", {d});
    add("ln2.weight", {d});
    add("ln2.bias", {d});
    add("mlp.fc.weight", {f, d});
    add("mlp.fc.bias", {f});
    add("mlp.proj.weight", {d, f});
    add("mlp.proj.bias", {d});
  } else {
    add("attn_norm.weight", {d});
    add("attn.q.weight", {c.n_heads * hd, d});
    add("attn.k.weight", {c.n_kv_heads * hd, d});
    add("attn.v.weight", {c.n_kv_heads * hd, d});
    add("attn.o.weight", {d, c.n_heads * hd});
    add("mlp_norm.weight", {d});
    add("mlp.gate.weight", {f, d});
    add("mlp.up.weight", {f, d});
    add("mlp.down.weight", {d, f});
    if (c.qkv_bias) {
      add("attn.q.bias", {c.n_heads * hd});
      add("attn.k.bias", {c.n_kv_heads * hd});
      add("attn.v.bias", {c.n_kv_heads * hd});
    }
  }
  return g;
}

std::vector<ParamGroupSpec> decoder_param_groups(const ModelConfig& c) {
  const DType t = c.dtype;
  const std::int64_t d = c.d_model;
  std::vector<ParamGroupSpec> groups;
  ParamGroupSpec emb{"embedding", {{"embedding.wte", {c.vocab_size, d}, t}}};
  if (c.arch == Architecture::Gpt2) emb.tensors.push_back({"embedding.wpe", {c.max_seq_len, d}, t});
  groups.push_back(std::move(emb));
  for (std::int64_t l = 0; l < c.n_layers; ++l) groups.push_back(decoder_block_group(c, l));
  ParamGroupSpec head{"head", {}};
  head.tensors = {{"head.norm.weight", {d}, t}};
  if (c.arch == Architecture::Gpt2) head.tensors.push_back({"head.norm.bias", {d}, t});
  if (c.tied_embeddings) {
    head.gathered_with = {"embedding"};  // the tied head's weight (ModelPass::run_head)
  } else {
    head.tensors.push_back({"head.lm_head.weight", {c.vocab_size, d}, t});
  }
  groups.push_back(std::move(head));
  // The decoder calls grads_ready once per group per backward (GPT-2's tied head adds its part to
  // the embedding's gradient inside the embedding's own backward step).
  for (auto& g : groups) g.grads_ready_calls = 1;
  return groups;
}

DecoderLayout decoder_layout(const ModelConfig& c, const TilingSpec& tiling) {
  validate_tiling(tiling, c);
  DecoderLayout L;
  L.tiling = tiling;
  std::vector<ParamGroupSpec> untiled = decoder_param_groups(c);
  L.embedding = 0;
  L.groups.push_back(std::move(untiled.front()));
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const ParamGroupSpec& whole = untiled[static_cast<std::size_t>(1 + l)];
    BlockGroups bg;
    bg.tiling = tiling.block(l);
    std::vector<bool> tiled(whole.tensors.size(), false);
    for (std::size_t s = 0; s < kBlockStages; ++s) {
      if (bg.tiles(static_cast<BlockStage>(s)) == 1) continue;
      for (const StageLinear& lin : stage_linears(c, static_cast<BlockStage>(s))) tiled[lin.weight] = true;
    }
    ParamGroupSpec base{whole.name, {}};
    for (std::size_t i = 0; i < whole.tensors.size(); ++i) {
      bg.base_index.push_back(tiled[i] ? kTiledTensor : base.tensors.size());
      if (!tiled[i]) base.tensors.push_back(whole.tensors[i]);
    }
    bg.base = L.groups.size();
    L.groups.push_back(std::move(base));
    for (std::size_t s = 0; s < kBlockStages; ++s) {
      const auto stage = static_cast<BlockStage>(s);
      const std::int64_t T = bg.tiles(stage);
      if (T == 1) continue;
      bg.first_tile[s] = L.groups.size();
      for (std::int64_t t = 0; t < T; ++t) {
        ParamGroupSpec g{fmt::format("{}.{}.tile{}of{}", whole.name, block_stage_name(c.arch, stage), t, T), {}};
        g.gathered_with = {L.groups[bg.base].name};  // the block's base stays acquired beside its tiles
        for (const StageLinear& lin : stage_linears(c, stage)) {
          const ParamTensorSpec& w = whole.tensors[lin.weight];
          const RowRange rows = tile_rows(lin.out, tiling.chunks, T, t);
          g.tensors.push_back({tile_tensor_name(w.name, rows), {rows.rows(), lin.in}, w.dtype});
        }
        L.groups.push_back(std::move(g));
      }
    }
    L.blocks.push_back(std::move(bg));
  }
  L.head = L.groups.size();
  L.groups.push_back(std::move(untiled.back()));
  for (auto& g : L.groups) g.grads_ready_calls = 1;  // each tile and base group: once per backward
  return L;
}

std::vector<ParamGroupSpec> decoder_param_groups(const ModelConfig& config, const TilingSpec& tiling) {
  return decoder_layout(config, tiling).groups;
}

std::size_t WholeTensor::row_bytes() const {
  std::size_t n = dtype_bytes(spec.dtype);
  for (std::size_t d = 1; d < spec.shape.size(); ++d) n *= static_cast<std::size_t>(spec.shape[d]);
  return n;
}

std::vector<WholeTensor> whole_tensors(const ModelConfig& config, std::span<const ParamGroupSpec> groups) {
  std::map<std::string, TensorPart> direct;
  std::map<std::string, std::vector<TensorPart>> tiles;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (std::size_t i = 0; i < groups[g].tensors.size(); ++i) {
      const ParamTensorSpec& t = groups[g].tensors[i];
      if (auto w = whole_tensor_of(t.name)) {
        if (t.shape.empty() || t.shape[0] != w->rows.rows()) {
          throw Error(fmt::format("tile tensor '{}' (group '{}') has shape {} that does not hold its {} rows", t.name,
                                  groups[g].name, fmt::join(t.shape, "x"), w->rows.rows()));
        }
        tiles[w->whole_name].push_back({g, i, w->rows});
      } else {
        direct[t.name] = {g, i, {0, t.shape.empty() ? 1 : t.shape[0]}};
      }
    }
  }
  std::vector<WholeTensor> out;
  std::size_t used = 0;
  for (const ParamGroupSpec& g : decoder_param_groups(config)) {
    for (const ParamTensorSpec& spec : g.tensors) {
      WholeTensor w{spec, {}};
      const auto same_inner = [&](const ParamTensorSpec& part) {
        return part.dtype == spec.dtype && part.shape.size() == spec.shape.size() &&
               std::equal(part.shape.begin() + 1, part.shape.end(), spec.shape.begin() + 1);
      };
      if (auto it = direct.find(spec.name); it != direct.end()) {
        const ParamTensorSpec& have = groups[it->second.group].tensors[it->second.tensor];
        if (have.shape != spec.shape || have.dtype != spec.dtype) {
          throw Error(fmt::format("tensor '{}' has shape {} ({}) but model '{}' declares {} ({})", spec.name,
                                  fmt::join(have.shape, "x"), dtype_name(have.dtype), config.name,
                                  fmt::join(spec.shape, "x"), dtype_name(spec.dtype)));
        }
        w.parts.push_back(it->second);
        ++used;
      } else if (auto jt = tiles.find(spec.name); jt != tiles.end()) {
        w.parts = jt->second;
        std::sort(w.parts.begin(), w.parts.end(),
                  [](const TensorPart& a, const TensorPart& b) { return a.rows.begin < b.rows.begin; });
        std::int64_t next = 0;
        for (const TensorPart& p : w.parts) {
          const ParamTensorSpec& have = groups[p.group].tensors[p.tensor];
          if (p.rows.begin != next || !same_inner(have)) {
            throw Error(fmt::format("tiles of tensor '{}' of model '{}' do not cover its {} rows once each with its "
                                    "shape ({}): '{}' starts at row {}, expected {}",
                                    spec.name, config.name, spec.shape[0], fmt::join(spec.shape, "x"), have.name,
                                    p.rows.begin, next));
          }
          next = p.rows.end;
        }
        if (next != spec.shape[0]) {
          throw Error(fmt::format("tiles of tensor '{}' of model '{}' end at row {} of {}", spec.name, config.name,
                                  next, spec.shape[0]));
        }
        used += w.parts.size();
      } else {
        throw Error(fmt::format("the param groups have no tensor '{}' (nor tiles of it) of model '{}'", spec.name,
                                config.name));
      }
      out.push_back(std::move(w));
    }
  }
  std::size_t declared = 0;
  for (const auto& g : groups) declared += g.tensors.size();
  if (used != declared) {
    throw Error(fmt::format("the param groups hold {} tensors that model '{}' does not declare", declared - used,
                            config.name));
  }
  return out;
}

}  // namespace strata::models
