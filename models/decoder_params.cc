// Param-group declaration of the decoders (see models/decoder_params.h).
#include "models/decoder_params.h"

#include <fmt/format.h>

namespace strata::models {

std::vector<ParamGroupSpec> decoder_param_groups(const ModelConfig& c) {
  const DType t = c.dtype;
  const std::int64_t d = c.d_model, f = c.ffn_hidden, hd = c.head_dim();
  std::vector<ParamGroupSpec> groups;
  ParamGroupSpec emb{"embedding", {{"embedding.wte", {c.vocab_size, d}, t}}};
  if (c.arch == Architecture::Gpt2) emb.tensors.push_back({"embedding.wpe", {c.max_seq_len, d}, t});
  groups.push_back(std::move(emb));
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = fmt::format("blocks.{}", l);
    ParamGroupSpec g{p, {}};
    auto add = [&](const char* n, std::vector<std::int64_t> shape) { g.tensors.push_back({p + "." + n, std::move(shape), t}); };
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
    }
    groups.push_back(std::move(g));
  }
  ParamGroupSpec head{"head", {}};
  if (c.arch == Architecture::Gpt2) {
    head.tensors = {{"head.norm.weight", {d}, t}, {"head.norm.bias", {d}, t}};
  } else {
    head.tensors = {{"head.norm.weight", {d}, t}, {"head.lm_head.weight", {c.vocab_size, d}, t}};
  }
  groups.push_back(std::move(head));
  return groups;
}

}  // namespace strata::models
