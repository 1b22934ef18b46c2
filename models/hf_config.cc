// Hugging Face config.json and model folders (see models/hf_config.h, Note [Hugging Face configs] in
// models/hf_config.h).
#include "models/hf_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace strata::models {

namespace {

namespace fs = std::filesystem;

// One family's reading of config.json: transformers' class defaults stand for absent keys
// (save_pretrained writes only the values that differ from them).
class HfReader {
 public:
  HfReader(const nlohmann::json& j, std::string where, std::string family)
      : j_(j), where_(std::move(where)), family_(std::move(family)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  bool present(const char* key) const { return j_.contains(key); }
  const nlohmann::json& raw(const char* key) const { return j_[key]; }

  std::int64_t count(const char* key, std::int64_t fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_number_integer() || j_[key].get<std::int64_t>() <= 0) {
      fail(key, fmt::format("{}", j_[key].dump()), "a positive integer");
    }
    return j_[key].get<std::int64_t>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_number()) fail(key, j_[key].dump(), "a number");
    return j_[key].get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean()) fail(key, j_[key].dump(), "true or false");
    return j_[key].get<bool>();
  }
  std::string text(const char* key, std::string fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_string()) fail(key, j_[key].dump(), "a string");
    return j_[key].get<std::string>();
  }
  // A field whose value changes the math in a way Strata does not compute.
  [[noreturn]] void refuse(const char* key, std::string_view why) const {
    throw ConfigError(fmt::format("{}: {} model field \"{}\" = {} is not supported: {}", where_, family_, key,
                                  j_[key].dump(), why));
  }
  [[noreturn]] void fail(const char* key, const std::string& value, std::string_view want) const {
    throw ConfigError(fmt::format("{}: \"{}\" = {} must be {}", where_, key, value, want));
  }
  // Dropout probabilities above 0: transformers applies them in train mode; Strata has no dropout.
  void note_dropout(std::initializer_list<const char*> keys, std::vector<std::string>* notes) const {
    std::vector<std::string> set;
    for (const char* k : keys) {
      if (has(k) && j_[k].is_number() && j_[k].get<double>() > 0) set.push_back(fmt::format("{} {}", k, j_[k].dump()));
    }
    if (!set.empty() && notes != nullptr) {
      notes->push_back(fmt::format("{}: {} is not applied; Strata trains without dropout (eval and generate are the "
                                   "same as transformers' eval mode)",
                                   where_, fmt::join(set, ", ")));
    }
  }

 private:
  const nlohmann::json& j_;
  std::string where_;
  std::string family_;
};

ModelConfig gpt2_from_hf(const HfReader& r, std::vector<std::string>* notes) {
  ModelConfig c;
  c.arch = Architecture::Gpt2;
  c.vocab_size = r.count("vocab_size", 50257);
  c.max_seq_len = r.count("n_positions", 1024);
  c.d_model = r.count("n_embd", 768);
  c.n_layers = r.count("n_layer", 12);
  c.n_heads = r.count("n_head", 12);
  c.n_kv_heads = c.n_heads;
  c.ffn_hidden = r.count("n_inner", 4 * c.d_model);
  c.norm_eps = static_cast<float>(r.number("layer_norm_epsilon", 1e-5));
  c.tied_embeddings = true;
  const std::string act = r.text("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    r.refuse("activation_function", "Strata's GPT-2 MLP computes the tanh GELU (\"gelu_new\", \"gelu_pytorch_tanh\")");
  }
  if (!r.flag("scale_attn_weights", true)) r.refuse("scale_attn_weights", "Strata scales scores by 1/sqrt(head_dim)");
  if (r.flag("scale_attn_by_inverse_layer_idx", false)) {
    r.refuse("scale_attn_by_inverse_layer_idx", "Strata scales every layer's scores alike");
  }
  if (r.flag("add_cross_attention", false)) r.refuse("add_cross_attention", "Strata trains decoder-only models");
  if (!r.flag("tie_word_embeddings", true)) r.refuse("tie_word_embeddings", "Strata's GPT-2 head is the embedding");
  r.note_dropout({"resid_pdrop", "embd_pdrop", "attn_pdrop"}, notes);
  return c;
}

// LLaMA, Mistral and Qwen2: one decoder; the families differ in defaults and in Qwen2's biases.
ModelConfig llama_from_hf(const HfReader& r, const std::string& type, std::vector<std::string>* notes) {
  const bool mistral = type == "mistral", qwen2 = type == "qwen2";
  ModelConfig c;
  c.arch = Architecture::Llama;
  c.vocab_size = r.count("vocab_size", qwen2 ? 151936 : 32000);
  c.max_seq_len = r.count("max_position_embeddings", mistral ? 131072 : qwen2 ? 32768 : 2048);
  c.d_model = r.count("hidden_size", 4096);
  c.n_layers = r.count("num_hidden_layers", 32);
  c.n_heads = r.count("num_attention_heads", 32);
  c.n_kv_heads = r.count("num_key_value_heads", mistral ? 8 : c.n_heads);
  c.ffn_hidden = r.count("intermediate_size", mistral ? 14336 : qwen2 ? 22016 : 11008);
  c.norm_eps = static_cast<float>(r.number("rms_norm_eps", 1e-6));
  c.tied_embeddings = r.flag("tie_word_embeddings", false);
  c.qkv_bias = qwen2;
  if (r.has("head_dim")) {
    const std::int64_t hd = r.count("head_dim", 0);
    if (hd * c.n_heads != c.d_model) c.attn_head_dim = hd;
  }
  const float theta = static_cast<float>(r.number("rope_theta", 10000.0));
  c.rope = rope_scaling_from_json(r.has("rope_scaling") ? r.raw("rope_scaling") : nlohmann::json(), theta,
                                  "config.json rope_scaling");
  if (r.text("hidden_act", "silu") != "silu") r.refuse("hidden_act", "Strata's LLaMA MLP is SwiGLU (\"silu\")");
  if (r.flag("attention_bias", false)) {
    r.refuse("attention_bias", "Strata computes the q/k/v biases of Qwen2 only (no o_proj bias)");
  }
  if (r.flag("mlp_bias", false)) r.refuse("mlp_bias", "Strata's LLaMA MLP has no biases");
  if (r.flag("add_cross_attention", false)) r.refuse("add_cross_attention", "Strata trains decoder-only models");
  // A sliding window changes attention only for sequences longer than it: Strata attends to the
  // whole sequence, which is the same up to the window, so the window caps max_seq_len.
  std::int64_t window = 0;
  if (mistral) {
    window = r.present("sliding_window") ? r.count("sliding_window", 0) : 4096;  // MistralConfig's default; null: none
  } else if (qwen2 && r.flag("use_sliding_window", false)) {
    window = r.count("sliding_window", 4096);
  }
  if (window > 0 && window < c.max_seq_len) {
    if (qwen2 && r.count("max_window_layers", 28) < c.n_layers) {
      r.refuse("use_sliding_window", fmt::format("the upper layers attend through a {}-token window; Strata has no "
                                                 "sliding window (set use_sliding_window false if you train on "
                                                 "sequences of at most {} tokens)",
                                                 window, window));
    }
    if (notes != nullptr) {
      notes->push_back(fmt::format("sliding_window {}: Strata attends to whole sequences, which is the same up to {} "
                                   "tokens; max_seq_len is {} (not max_position_embeddings {})",
                                   window, window, window, c.max_seq_len));
    }
    c.max_seq_len = window;
  }
  r.note_dropout({"attention_dropout"}, notes);
  return c;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("cannot read '{}'", path), errno);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw FormatError(fmt::format("'{}' is not valid JSON (byte {}): {}", path, e.byte, e.what()));
  }
}

}  // namespace

bool is_hf_model_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / "config.json", ec);
}

ModelConfig model_config_from_hf(const nlohmann::json& j, const std::string& where, std::vector<std::string>* notes) {
  if (!j.is_object()) throw ConfigError(fmt::format("{} must be a JSON object", where));
  if (!j.contains("model_type") || !j["model_type"].is_string()) {
    throw ConfigError(fmt::format("{} has no \"model_type\"; Strata reads gpt2, llama, mistral and qwen2 configs", where));
  }
  const std::string type = j["model_type"].get<std::string>();
  const HfReader r(j, where, type);
  ModelConfig c;
  if (type == "gpt2") {
    c = gpt2_from_hf(r, notes);
  } else if (type == "llama" || type == "mistral" || type == "qwen2") {
    c = llama_from_hf(r, type, notes);
  } else {
    throw ConfigError(fmt::format("{}: model_type \"{}\" is not one Strata trains; it reads gpt2, llama, mistral and "
                                  "qwen2 (the LLaMA decoder with Mistral's and Qwen2's options)",
                                  where, type));
  }
  c.name = fmt::format("{} ({})", fs::path(where).parent_path().filename().string(), type);
  try {
    c.validate();
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{}: {}", where, e.what()));
  }
  return c;
}

nlohmann::json hf_config_json(const ModelConfig& c, std::string type) {
  if (type.empty()) {
    type = c.arch == Architecture::Gpt2 ? "gpt2" : c.qkv_bias ? "qwen2" : c.attn_head_dim > 0 ? "mistral" : "llama";
  }
  nlohmann::json j;
  j["model_type"] = type;
  j["torch_dtype"] = "float32";
  if (type == "gpt2") {
    j["architectures"] = {"GPT2LMHeadModel"};
    j["vocab_size"] = c.vocab_size;
    j["n_positions"] = c.max_seq_len;
    j["n_embd"] = c.d_model;
    j["n_layer"] = c.n_layers;
    j["n_head"] = c.n_heads;
    j["n_inner"] = c.ffn_hidden;
    j["layer_norm_epsilon"] = c.norm_eps;
    j["activation_function"] = "gelu_new";
    j["tie_word_embeddings"] = true;
    return j;
  }
  j["architectures"] = {type == "qwen2" ? "Qwen2ForCausalLM" : type == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM"};
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["hidden_size"] = c.d_model;
  j["intermediate_size"] = c.ffn_hidden;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim();
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope.theta;
  j["tie_word_embeddings"] = c.tied_embeddings;
  if (type == "mistral") j["sliding_window"] = nullptr;
  if (type == "qwen2") j["use_sliding_window"] = false;
  if (type == "llama") j["attention_bias"] = false;
  switch (c.rope.scaling) {
    case RopeScaling::None: j["rope_scaling"] = nullptr; break;
    case RopeScaling::Linear: j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope.factor}}; break;
    case RopeScaling::Llama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope.factor},
                           {"low_freq_factor", c.rope.low_freq_factor},
                           {"high_freq_factor", c.rope.high_freq_factor},
                           {"original_max_position_embeddings", static_cast<std::int64_t>(c.rope.original_max_positions)}};
      break;
  }
  return j;
}

HfModelFolder open_hf_model_folder(const std::string& dir) {
  HfModelFolder f;
  f.dir = dir;
  const fs::path root(dir);
  const std::string config_path = (root / "config.json").string();
  f.config_json = read_json_file(config_path);
  f.config = model_config_from_hf(f.config_json, config_path, &f.notes);
  const fs::path index = root / "model.safetensors.index.json", single = root / "model.safetensors";
  std::error_code ec;
  // transformers' order: model.safetensors when it is there, else the index.
  if (fs::exists(single, ec)) {
    f.weight_files.push_back(single.string());
  } else if (fs::exists(index, ec)) {
    f.index_file = index.string();
    const nlohmann::json j = read_json_file(f.index_file);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      throw FormatError(fmt::format("'{}' has no \"weight_map\" object (tensor name -> shard file)", f.index_file));
    }
    std::set<std::string> seen;
    for (const auto& [tensor, shard] : j["weight_map"].items()) {
      if (!shard.is_string()) {
        throw FormatError(fmt::format("'{}': weight_map[\"{}\"] must be a shard file name", f.index_file, tensor));
      }
      const std::string name = shard.get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
        throw FormatError(fmt::format("'{}': weight_map[\"{}\"] = \"{}\" must name a file in the folder", f.index_file,
                                      tensor, name));
      }
      const std::string path = (root / name).string();
      if (seen.insert(name).second) {
        if (!fs::is_regular_file(path, ec)) {
          throw FormatError(fmt::format("'{}' names shard '{}' (for tensor '{}' and maybe others), which is missing; "
                                        "download the whole model folder again",
                                        f.index_file, path, tensor));
        }
        f.weight_files.push_back(path);
      }
      f.weight_map[tensor] = path;
    }
  } else if (fs::exists(root / "pytorch_model.bin", ec) || fs::exists(root / "pytorch_model.bin.index.json", ec)) {
    throw FormatError(fmt::format("'{}' holds PyTorch pickle weights (pytorch_model.bin), which Strata does not "
                                  "unpickle; convert them once with transformers: "
                                  "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)",
                                  dir));
  } else {
    throw FormatError(fmt::format("'{}' has config.json but no weights (model.safetensors or "
                                  "model.safetensors.index.json)",
                                  dir));
  }
  for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                           "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt",
                           "added_tokens.json"}) {
    if (fs::is_regular_file(root / name, ec)) f.companion_files.push_back((root / name).string());
  }
  return f;
}

}  // namespace strata::models
