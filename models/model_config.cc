// Model configurations by name and by fields (see models/model_config.h).
#include "models/model_config.h"

#include <cmath>

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
  c.rope_theta = theta;
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
  need(d_model % n_heads == 0, "d_model must be a multiple of n_heads");
  need(n_kv_heads > 0, fmt::format("n_kv_heads is {} (0: missing); a llama model needs at least 1 KV head: set "
                                   "n_kv_heads (equal to n_heads for multi-head attention)",
                                   n_kv_heads));
  need(n_heads % n_kv_heads == 0, "n_heads must be a multiple of n_kv_heads");
  need(arch == Architecture::Llama || n_kv_heads == n_heads, "gpt2 models have n_kv_heads == n_heads");
  need(arch == Architecture::Gpt2 || head_dim() % 2 == 0, "RoPE needs an even head dimension (d_model / n_heads)");
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
  throw ConfigError(fmt::format("unknown model '{}'; known models: {}", name, fmt::join(known_model_names(), ", ")));
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
        c.rope_theta = value.get<float>();
      } else if (key == "dtype") {
        if (!parse_dtype(value.get<std::string>(), &c.dtype)) {
          throw ConfigError(fmt::format("model.dtype '{}' must be fp32, bf16 or fp16", value.get<std::string>()));
        }
      } else {
        throw ConfigError(fmt::format(
            "unknown model config key '{}'; known keys: name, arch, vocab_size, max_seq_len, n_layers, d_model, "
            "n_heads, n_kv_heads, ffn_hidden, norm_eps, rope_theta, dtype",
            key));
      }
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("model config key '{}' has the wrong type: {}", key, e.what()));
    }
  }
  if (c.arch == Architecture::Gpt2 && c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
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

std::int64_t param_count(const ModelConfig& c) {
  const std::int64_t d = c.d_model, hd = c.head_dim();
  if (c.arch == Architecture::Gpt2) {
    const std::int64_t block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (c.ffn_hidden * d + c.ffn_hidden) +
                               (d * c.ffn_hidden + d);
    return c.vocab_size * d + c.max_seq_len * d + c.n_layers * block + 2 * d;
  }
  const std::int64_t attn = d * c.n_heads * hd + 2 * d * c.n_kv_heads * hd + c.n_heads * hd * d;
  const std::int64_t block = d + attn + d + 3 * d * c.ffn_hidden;
  return c.vocab_size * d + c.n_layers * block + d + c.vocab_size * d;
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
