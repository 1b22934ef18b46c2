// Strata <-> Hugging Face tensor names (see models/hf_names.h).
#include "models/hf_names.h"

#include <fmt/format.h>

#include "models/decoder_params.h"

namespace strata::models {

std::optional<std::string_view> hf_model_class(Architecture arch) {
  switch (arch) {  // no default: a new architecture must decide here (-Wswitch)
    case Architecture::Gpt2: return "GPT2LMHeadModel";
    case Architecture::Llama: return "LlamaForCausalLM";
  }
  return std::nullopt;
}

std::vector<HfTensorName> hf_tensor_names(const ModelConfig& c) {
  std::vector<HfTensorName> out;
  const bool gpt2 = c.arch == Architecture::Gpt2;
  out.push_back({"embedding.wte", gpt2 ? "wte.weight" : "model.embed_tokens.weight", false});
  if (gpt2) out.push_back({"embedding.wpe", "wpe.weight", false});
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const std::string s = fmt::format("blocks.{}.", l);
    if (gpt2) {
      const std::string h = fmt::format("h.{}.", l);
      out.push_back({s + "ln1.weight", h + "ln_1.weight", false});
      out.push_back({s + "ln1.bias", h + "ln_1.bias", false});
      out.push_back({s + "attn.qkv.weight", h + "attn.c_attn.weight", true});
      out.push_back({s + "attn.qkv.bias", h + "attn.c_attn.bias", false});
      out.push_back({s + "attn.proj.weight", h + "attn.c_proj.weight", true});
      out.push_back({s + "attn.proj.bias", h + "attn.c_proj.bias", false});
      out.push_back({s + "ln2.weight", h + "ln_2.weight", false});
      out.push_back({s + "ln2.bias", h + "ln_2.bias", false});
      out.push_back({s + "mlp.fc.weight", h + "mlp.c_fc.weight", true});
      out.push_back({s + "mlp.fc.bias", h + "mlp.c_fc.bias", false});
      out.push_back({s + "mlp.proj.weight", h + "mlp.c_proj.weight", true});
      out.push_back({s + "mlp.proj.bias", h + "mlp.c_proj.bias", false});
    } else {
      const std::string h = fmt::format("model.layers.{}.", l);
      out.push_back({s + "attn_norm.weight", h + "input_layernorm.weight", false});
      out.push_back({s + "attn.q.weight", h + "self_attn.q_proj.weight", false});
      out.push_back({s + "attn.k.weight", h + "self_attn.k_proj.weight", false});
      out.push_back({s + "attn.v.weight", h + "self_attn.v_proj.weight", false});
      out.push_back({s + "attn.o.weight", h + "self_attn.o_proj.weight", false});
      out.push_back({s + "mlp_norm.weight", h + "post_attention_layernorm.weight", false});
      out.push_back({s + "mlp.gate.weight", h + "mlp.gate_proj.weight", false});
      out.push_back({s + "mlp.up.weight", h + "mlp.up_proj.weight", false});
      out.push_back({s + "mlp.down.weight", h + "mlp.down_proj.weight", false});
      if (c.qkv_bias) {
        out.push_back({s + "attn.q.bias", h + "self_attn.q_proj.bias", false});
        out.push_back({s + "attn.k.bias", h + "self_attn.k_proj.bias", false});
        out.push_back({s + "attn.v.bias", h + "self_attn.v_proj.bias", false});
      }
    }
  }
  if (gpt2) {
    out.push_back({"head.norm.weight", "ln_f.weight", false});
    out.push_back({"head.norm.bias", "ln_f.bias", false});
  } else {
    out.push_back({"head.norm.weight", "model.norm.weight", false});
    if (!c.tied_embeddings) out.push_back({"head.lm_head.weight", "lm_head.weight", false});
  }
  return out;
}

std::string normalize_hf_name(const ModelConfig& c, std::string_view name) {
  constexpr std::string_view kPrefix = "transformer.";
  if (c.arch == Architecture::Gpt2 && name.substr(0, kPrefix.size()) == kPrefix) {
    return std::string(name.substr(kPrefix.size()));
  }
  return std::string(name);
}

bool is_ignorable_hf_tensor(const ModelConfig& c, std::string_view n) {
  auto ends_with = [&](std::string_view suffix) {
    return n.size() >= suffix.size() && n.substr(n.size() - suffix.size()) == suffix;
  };
  if (c.arch == Architecture::Gpt2) {
    return n == "lm_head.weight" || ends_with(".attn.bias") || ends_with(".attn.masked_bias");
  }
  // A tied LLaMA's head is the embedding; a file that still carries it has a copy (read nothing from it).
  return ends_with(".rotary_emb.inv_freq") || (c.tied_embeddings && n == "lm_head.weight");
}

}  // namespace strata::models
