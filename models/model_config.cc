// Model configurations by name and by fields (see models/model_config.h).
#include "models/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace strata::models {

std::string_view architecture_name(Architecture arch) { return arch == Architecture::Gpt2 ? "gpt2" : "llama"; }

namespace {

ModelConfig gpt2(std::string name, std::int64_t layers, std::int64_t d, std::int64_t heads) {
  ModelConfig c;
  c.name = std::move(name);
  c.arch = Architecture::Gpt2;
  c.vocab_size = 50257;
  c.max_seq_len = 1024;
  c.n_layers = layers;
  c.d_model = d;
  c.n_heads = heads;
  c.n_kv_heads = heads;
  c.ffn_hidden = 4 * d;
  c.norm_eps = 1e-5f;
  return c;
}

ModelConfig llama(std::string name, std::int64_t layers, std::int64_t d, std::int64_t heads, std::int64_t kv_heads,
                  std::int64_t ffn, std::int64_t vocab, std::int64_t seq, float eps, float theta) {
  ModelConfig c;
  c.name = std::move(name);
  c.arch = Architecture::Llama;
  c.vocab_size = vocab;
  c.max_seq_len = seq;
  c.n_layers = layers;
  c.d_model = d;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.ffn_hidden = ffn;
  c.norm_eps = eps;
  c.rope.theta = theta;
  c.tied_embeddings = false;
  return c;
}

std::vector<ModelConfig> known_configs() {
  ModelConfig tiny = gpt2("tiny", 2, 32, 4);
  tiny.vocab_size = 256;  // byte-level tokens
  tiny.max_seq_len = 64;
  // GPT-3 175B's shape (Brown et al. 2020, table 2.1: 96 layers, d_model 12288, 96 heads, context 2048).
  ModelConfig gpt3 = gpt2("gpt3-175b", 96, 12288, 96);
  gpt3.max_seq_len = 2048;
  return {
      tiny,
      llama("tiny-llama", 2, 32, 4, 2, 64, 256, 64, 1e-5f, 10000.0f),
      gpt2("gpt2-124m", 12, 768, 12),
      gpt2("gpt2-1.5b", 48, 1600, 25),
      // TinyLlama-1.1B's shape (LLaMA-2 architecture with grouped-query attention).
      llama("llama-1b", 22, 2048, 32, 4, 5632, 32000, 2048, 1e-5f, 10000.0f),
      llama("llama-7b", 32, 4096, 32, 32, 11008, 32000, 4096, 1e-5f, 10000.0f),
      llama("llama-13b", 40, 5120, 40, 40, 13824, 32000, 4096, 1e-5f, 10000.0f),
      llama("llama-70b", 80, 8192, 64, 8, 28672, 32000, 4096, 1e-5f, 10000.0f),
      gpt3,
  };
}

}  // namespace

void ModelConfig::validate() const {
  auto need = [&](bool ok, std::string_view what) {
    if (!ok) throw ConfigError(fmt::format("model '{}': {}", name, what));
  };
  need(vocab_size > 0, "vocab_size must be positive");
  need(max_seq_len > 0, "max_seq_len must be positive");
  need(n_layers > 0, "n_layers must be positive");
  need(d_model > 0 && n_heads > 0, "d_model and n_heads must be positive");
  need(attn_head_dim >= 0, "head_dim must be positive (or 0: d_model / n_heads)");
  need(attn_head_dim > 0 || d_model % n_heads == 0, "d_model must be a multiple of n_heads (or head_dim given)");
  need(n_kv_heads > 0, fmt::format("n_kv_heads is {} (0: missing); a llama model needs at least 1 KV head: set "
                                   "n_kv_heads (equal to n_heads for multi-head attention)",
                                   n_kv_heads));
  need(n_heads % n_kv_heads == 0, "n_heads must be a multiple of n_kv_heads");
  const bool gpt2 = arch == Architecture::Gpt2;
  need(!gpt2 || n_kv_heads == n_heads, "gpt2 models have n_kv_heads == n_heads");
  need(!gpt2 || attn_head_dim == 0 || attn_head_dim * n_heads == d_model, "gpt2 models have head_dim = d_model / n_heads");
  need(!gpt2 || tied_embeddings, "gpt2 models tie the LM head to the token embedding");
  need(!gpt2 || !qkv_bias, "qkv_bias is a llama option (gpt2 models have every bias)");
  need(!gpt2 || rope.scaling == RopeScaling::None, "rope_scaling is a llama option (gpt2 has learned positions)");
  need(gpt2 || head_dim() % 2 == 0, "RoPE needs an even head dimension");
  need(gpt2 || rope.theta > 0, "rope_theta must be positive");
  need(rope.scaling == RopeScaling::None || rope.factor >= 1, "rope_scaling.factor must be at least 1");
  need(rope.scaling != RopeScaling::Llama3 ||
           (rope.low_freq_factor > 0 && rope.high_freq_factor > rope.low_freq_factor && rope.original_max_positions > 0),
       "rope_scaling llama3 needs 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0");
  need(ffn_hidden > 0, "ffn_hidden must be positive");
  need(norm_eps > 0, "norm_eps must be positive");
}

std::vector<std::string> known_model_names() {
  std::vector<std::string> names;
  for (const auto& c : known_configs()) names.push_back(c.name);
  return names;
}

ModelConfig model_config_by_name(std::string_view name) {
  for (auto& c : known_configs()) {
    if (c.name == name) return c;
  }
  // A path that is not a Hugging Face folder (models/hf_config.h reads those) says what it lacks.
  std::error_code ec;
  const std::filesystem::path path{std::string(name)};
  if (std::filesystem::is_directory(path, ec)) {
    throw ConfigError(fmt::format("model '{}' is a directory without config.json; a Hugging Face model folder holds "
                                  "config.json and model.safetensors (or its shards); known model names: {}",
                                  name, fmt::join(known_model_names(), ", ")));
  }
  if (std::filesystem::exists(path, ec)) {
    throw ConfigError(fmt::format("model '{}' is a file; give a model name ({}) or a Hugging Face model folder (the "
                                  "directory holding config.json)",
                                  name, fmt::join(known_model_names(), ", ")));
  }
  throw ConfigError(fmt::format("unknown model '{}': neither a model name ({}) nor a Hugging Face model folder (a "
                                "directory holding config.json)",
                                name, fmt::join(known_model_names(), ", ")));
}

namespace {

// A count of the model config: an integer, never a fraction quietly truncated (n_layers: 1.5).
std::int64_t model_integer(const nlohmann::json& value, const std::string& key) {
  if (value.is_number_integer()) return value.get<std::int64_t>();
  if (value.is_number_float()) {
    const double v = value.get<double>();
    if (std::floor(v) == v && std::abs(v) < 9.0e18) return static_cast<std::int64_t>(v);  // 32.0 is 32
    throw ConfigError(fmt::format("model config key '{}' is {}, not a whole number; give an integer", key,
                                  value.dump()));
  }
  throw ConfigError(fmt::format("model config key '{}' must be an integer, found {} {}", key, value.type_name(),
                                value.dump()));
}

}  // namespace

ModelConfig model_config_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw ConfigError("model config must be a JSON object");
  ModelConfig c;
  if (j.contains("name") && j["name"].is_string()) {
    const auto base = j["name"].get<std::string>();
    bool known = false;
    for (const auto& n : known_model_names()) known = known || n == base;
    if (known) {
      c = model_config_by_name(base);
    } else {
      c.name = base;
    }
  }
  for (const auto& [key, value] : j.items()) {
    try {
      if (key == "name") {
        c.name = value.get<std::string>();
      } else if (key == "arch") {
        const auto a = value.get<std::string>();
        if (a != "gpt2" && a != "llama") throw ConfigError(fmt::format("model.arch '{}' must be gpt2 or llama", a));
        c.arch = a == "gpt2" ? Architecture::Gpt2 : Architecture::Llama;
      } else if (key == "vocab_size") {
        c.vocab_size = model_integer(value, key);
      } else if (key == "max_seq_len") {
        c.max_seq_len = model_integer(value, key);
      } else if (key == "n_layers") {
        c.n_layers = model_integer(value, key);
      } else if (key == "d_model") {
        c.d_model = model_integer(value, key);
      } else if (key == "n_heads") {
        c.n_heads = model_integer(value, key);
        if (!j.contains("n_kv_heads") && c.arch == Architecture::Gpt2) c.n_kv_heads = c.n_heads;
      } else if (key == "n_kv_heads") {
        c.n_kv_heads = model_integer(value, key);
      } else if (key == "ffn_hidden") {
        c.ffn_hidden = model_integer(value, key);
      } else if (key == "norm_eps") {
        c.norm_eps = value.get<float>();
      } else if (key == "rope_theta") {
        c.rope.theta = value.get<float>();
      } else if (key == "head_dim") {
        c.attn_head_dim = value.get<std::int64_t>();
      } else if (key == "tied_embeddings") {
        c.tied_embeddings = value.get<bool>();
      } else if (key == "qkv_bias") {
        c.qkv_bias = value.get<bool>();
      } else if (key == "rope_scaling") {
        c.rope = rope_scaling_from_json(value, c.rope.theta, "model.rope_scaling");
      } else if (key == "dtype") {
        if (!parse_dtype(value.get<std::string>(), &c.dtype)) {
          throw ConfigError(fmt::format("model.dtype '{}' must be fp32, bf16 or fp16", value.get<std::string>()));
        }
      } else {
        throw ConfigError(fmt::format(
            "unknown model config key '{}'; known keys: name, arch, vocab_size, max_seq_len, n_layers, d_model, "
            "n_heads, n_kv_heads, ffn_hidden, norm_eps, rope_theta, head_dim, tied_embeddings, qkv_bias, rope_scaling, "
            "dtype",
            key));
      }
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("model config key '{}' has the wrong type: {}", key, e.what()));
    }
  }
  if (c.arch == Architecture::Gpt2 && c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
  // A model given by its fields: LLaMA's head is untied unless asked (a named base keeps its own).
  if (j.contains("arch") && !j.contains("tied_embeddings")) c.tied_embeddings = c.arch == Architecture::Gpt2;
  // A key the architecture does not read is refused, not carried silently.
  if (c.arch == Architecture::Gpt2 && j.contains("rope_theta")) {
    throw ConfigError(fmt::format("model config key 'rope_theta' applies to llama models (rotary positions), and "
                                  "model '{}' is gpt2 (learned positions), which does not read it: remove the key or "
                                  "set arch to llama",
                                  c.name));
  }
  c.validate();
  return c;
}

RopeSpec rope_scaling_from_json(const nlohmann::json& j, float theta, std::string_view where) {
  RopeSpec r;
  r.theta = theta;
  if (j.is_null()) return r;
  if (!j.is_object()) throw ConfigError(fmt::format("{} must be an object or null", where));
  // Hugging Face spells the kind "rope_type" (older files: "type").
  const char* kind_key = j.contains("rope_type") ? "rope_type" : "type";
  if (!j.contains(kind_key) || !j[kind_key].is_string()) {
    throw ConfigError(fmt::format("{} needs \"rope_type\": \"linear\" or \"llama3\"", where));
  }
  const std::string kind = j[kind_key].get<std::string>();
  const auto number = [&](const char* key, bool required, float fallback) {
    if (!j.contains(key)) {
      if (required) throw ConfigError(fmt::format("{}: rope_type '{}' needs \"{}\"", where, kind, key));
      return fallback;
    }
    if (!j[key].is_number()) throw ConfigError(fmt::format("{}.{} must be a number", where, key));
    return j[key].get<float>();
  };
  if (kind == "default") return r;
  if (kind == "linear") {
    r.scaling = RopeScaling::Linear;
    r.factor = number("factor", true, 1.0f);
  } else if (kind == "llama3") {
    r.scaling = RopeScaling::Llama3;
    r.factor = number("factor", true, 1.0f);
    r.low_freq_factor = number("low_freq_factor", true, 1.0f);
    r.high_freq_factor = number("high_freq_factor", true, 4.0f);
    r.original_max_positions = number("original_max_position_embeddings", true, 8192.0f);
  } else {
    throw ConfigError(fmt::format("{}: rope_type '{}' is not supported; Strata computes \"linear\" and \"llama3\" "
                                  "(dynamic, yarn, longrope and su change attention beyond the frequencies)",
                                  where, kind));
  }
  for (const auto& [key, value] : j.items()) {
    static constexpr std::string_view kKnown[] = {"rope_type", "type", "factor", "low_freq_factor",
                                                  "high_freq_factor", "original_max_position_embeddings"};
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      throw ConfigError(fmt::format("{}: key '{}' is not one Strata honours for rope_type '{}'", where, key, kind));
    }
  }
  return r;
}

std::int64_t param_count(const ModelConfig& c) {
  const std::int64_t d = c.d_model, hd = c.head_dim();
  if (c.arch == Architecture::Gpt2) {
    const std::int64_t block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (c.ffn_hidden * d + c.ffn_hidden) +
                               (d * c.ffn_hidden + d);
    return c.vocab_size * d + c.max_seq_len * d + c.n_layers * block + 2 * d;
  }
  const std::int64_t attn = d * c.n_heads * hd + 2 * d * c.n_kv_heads * hd + c.n_heads * hd * d +
                             (c.qkv_bias ? (c.n_heads + 2 * c.n_kv_heads) * hd : 0);
  const std::int64_t block = d + attn + d + 3 * d * c.ffn_hidden;
  return c.vocab_size * d + c.n_layers * block + d + (c.tied_embeddings ? 0 : c.vocab_size * d);
}

double train_flops_per_token(const ModelConfig& c, std::int64_t seq_len) {
  const double d = static_cast<double>(c.d_model), hd = static_cast<double>(c.head_dim());
  double block_matmul = 0;
  if (c.arch == Architecture::Gpt2) {
    block_matmul = 4 * d * d + 2 * d * static_cast<double>(c.ffn_hidden);
  } else {
    block_matmul = d * static_cast<double>(c.n_heads) * hd * 2 + 2 * d * static_cast<double>(c.n_kv_heads) * hd +
                   3 * d * static_cast<double>(c.ffn_hidden);
  }
  const double matmul_params = static_cast<double>(c.n_layers) * block_matmul + static_cast<double>(c.vocab_size) * d;
  const double attn = 12.0 * static_cast<double>(c.n_layers) * static_cast<double>(c.n_heads) * hd *
                      static_cast<double>(seq_len);
  return 6.0 * matmul_params + attn;
}

namespace {

bool tensor_split_ok(const ModelConfig& m, int t) {
  const std::int64_t kv = m.n_kv_heads;
  const bool kv_ok = kv >= t ? kv % t == 0 : t % kv == 0;
  return m.n_heads % t == 0 && m.ffn_hidden % t == 0 && kv_ok;
}

}  // namespace

void check_parallel_shape(const ModelConfig& m, int tensor, int pipeline, const std::string& source) {
  if (!tensor_split_ok(m, tensor)) {
    std::string valid;
    for (int t = 1; t <= m.n_heads; ++t) {
      if (tensor_split_ok(m, t)) valid += fmt::format("{}{}", valid.empty() ? "" : ", ", t);
    }
    throw ConfigError(fmt::format(
        "{}: strata.parallel.tensor = {} does not split model '{}' evenly ({} attention heads, {} KV heads, MLP width "
        "{}: each must divide by it, or KV heads fewer than the ranks divide it); valid choices: {}",
        source, tensor, m.name, m.n_heads, m.n_kv_heads, m.ffn_hidden, valid));
  }
  if (pipeline > m.n_layers) {
    throw ConfigError(fmt::format("{}: strata.parallel.pipeline = {} stages for model '{}' of {} layers; each stage needs "
                                  "at least one layer: valid choices 1..{}",
                                  source, pipeline, m.name, m.n_layers, m.n_layers));
  }
}

}  // namespace strata::models
