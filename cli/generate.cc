// `strata generate`: text (or token ids) after a prompt, from a built-in model with --weights or a
// Hugging Face model folder, decoded over a KV cache (models/kv_decoder.h, Note [KV cache] in models/kv_decoder.h): the
// prompt is prefilled once, then each new token runs one position. Greedy by default (temperature
// 0), else temperature / top-k / top-p sampling from --seed (models/generation.h). With a folder
// that holds a tokenizer, --prompt is encoded (no BOS is added: write it into the text if the model
// wants one) and the new tokens are decoded; otherwise --prompt-ids gives ids and ids are printed.
// Generation stops after an end-of-sequence id (generation_config.json's eos_token_id, else
// config.json's) or --max-tokens. A prompt that leaves fewer than --max-tokens positions of the
// model's max_seq_len is refused (no silent truncation). Weights stay resident on the device
// (--device, default sim); offloaded weights are not streamed here.
#include "cli/commands.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/device/device.h"
#include "core/error.h"
#include "core/units.h"
#include "models/decoder_params.h"
#include "models/generation.h"
#include "models/kv_decoder.h"
#include "models/resident_provider.h"
#include "models/tokenizer.h"
#include "models/weights_io.h"
#include "train/compute_device.h"
#include "train/model_source.h"

namespace strata::cli {

namespace {

namespace fs = std::filesystem;

struct GenerateFlags {
  std::string model;
  std::string weights;
  std::string prompt;
  std::string prompt_ids;
  bool has_prompt = false;
  std::int64_t max_tokens = 32;
  double temperature = 0;
  std::int64_t top_k = 0;
  double top_p = 1;
  std::uint64_t seed = 0;
  bool json = false;
  std::string device = "sim";  // sim | cuda | auto
};

// "1,2,3" -> ids; a ConfigError naming the flag, the piece and the fix otherwise.
std::vector<std::int32_t> parse_prompt_ids(const std::string& text) {
  std::vector<std::int32_t> ids;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string piece = text.substr(start, end - start);
    while (!piece.empty() && piece.front() == ' ') piece.erase(piece.begin());
    while (!piece.empty() && piece.back() == ' ') piece.pop_back();
    long long v = -1;
    std::size_t used = 0;
    bool ok = !piece.empty() && piece.find_first_not_of("0123456789") == std::string::npos;
    if (ok) {
      try {
        v = std::stoll(piece, &used);
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (!ok || used != piece.size() || v > 0x7fffffffLL) {
      throw ConfigError(fmt::format("--prompt-ids '{}': '{}' is not a token id; give comma-separated non-negative "
                                    "integers, e.g. --prompt-ids 15496,11,995",
                                    text, piece));
    }
    ids.push_back(static_cast<std::int32_t>(v));
    start = end + 1;
  }
  return ids;
}

// eos_token_id (an id or a list of ids) of generation_config.json, else of config.json.
std::vector<std::int32_t> folder_eos_ids(const std::string& folder) {
  for (const char* name : {"generation_config.json", "config.json"}) {
    const fs::path path = fs::path(folder) / name;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) continue;
    std::ifstream in(path);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      throw FormatError(fmt::format("{} is not a JSON object; fix or remove it", path.string()));
    }
    if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) continue;
    const nlohmann::json& e = j["eos_token_id"];
    std::vector<std::int32_t> ids;
    for (const nlohmann::json& v : e.is_array() ? e : nlohmann::json::array({e})) {
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0) {
        throw FormatError(fmt::format("{}: eos_token_id holds {}, not a token id", path.string(), v.dump()));
      }
      ids.push_back(static_cast<std::int32_t>(v.get<std::int64_t>()));
    }
    return ids;
  }
  return {};
}

bool folder_has_tokenizer(const std::string& folder) {
  std::error_code ec;
  return !folder.empty() && (fs::is_regular_file(fs::path(folder) / "tokenizer.json", ec) ||
                             fs::is_regular_file(fs::path(folder) / "tokenizer.model", ec));
}

void check_flags(const GenerateFlags& f) {
  if (f.max_tokens < 1) {
    throw ConfigError(fmt::format("--max-tokens {} must be at least 1", f.max_tokens));
  }
  if (!std::isfinite(f.temperature) || f.temperature < 0) {
    throw ConfigError(fmt::format("--temperature {} must be 0 (greedy) or positive; e.g. --temperature 0.8",
                                  f.temperature));
  }
  if (f.top_k < 0) throw ConfigError(fmt::format("--top-k {} must be 0 (every token) or positive", f.top_k));
  if (!(f.top_p > 0 && f.top_p <= 1)) {
    throw ConfigError(fmt::format("--top-p {} must be in (0, 1] (1 keeps every token); e.g. --top-p 0.9", f.top_p));
  }
  if (f.has_prompt == !f.prompt_ids.empty()) {
    throw ConfigError("give the prompt once: --prompt \"text\" (a model folder with a tokenizer) or --prompt-ids 1,2,3");
  }
}

// The prompt as ids: --prompt through the folder's tokenizer, or --prompt-ids; each id checked
// against the model's vocabulary.
std::vector<std::int32_t> prompt_ids(const GenerateFlags& f, const models::ModelConfig& config,
                                     const train::ModelSource& source, const models::Tokenizer* tokenizer) {
  std::vector<std::int32_t> prompt;
  if (f.has_prompt) {
    if (!tokenizer) {
      throw ConfigError(fmt::format(
          "--prompt needs a tokenizer, and {} has none (no tokenizer.json or tokenizer.model{}); give token ids "
          "with --prompt-ids 1,2,3",
          source.folder.empty() ? fmt::format("built-in model '{}'", f.model) : fmt::format("'{}'", source.folder),
          source.folder.empty() ? " in a model folder" : " there"));
    }
    for (const std::uint32_t id : tokenizer->encode(f.prompt, "--prompt")) prompt.push_back(static_cast<std::int32_t>(id));
    if (prompt.empty()) throw ConfigError("--prompt is empty after tokenization; give some text");
  } else {
    prompt = parse_prompt_ids(f.prompt_ids);
  }
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] >= config.vocab_size) {
      throw ConfigError(fmt::format("--prompt-ids: token {} (position {}) is outside model '{}' vocabulary of {}; give "
                                    "ids in 0..{}",
                                    prompt[i], i, config.name, config.vocab_size, config.vocab_size - 1));
    }
  }
  return prompt;
}

void print_generated(const GenerateFlags& f, const models::ModelConfig& config, const train::ModelSource& source,
                     const Device& device, const std::vector<std::int32_t>& prompt,
                     const models::GenerateResult& r, const models::Tokenizer* tokenizer) {
  const auto prompt_len = static_cast<std::int64_t>(prompt.size());
  const auto decode_steps = static_cast<double>(r.tokens.size()) - 1;
  const double decode_tps = decode_steps > 0 && r.decode_seconds > 0 ? decode_steps / r.decode_seconds : 0;
  std::vector<std::uint32_t> new_ids(r.tokens.begin(), r.tokens.end());
  const std::string text = tokenizer ? tokenizer->decode(new_ids) : std::string();
  if (f.json) {
    nlohmann::json j = {{"model", config.name},
                        {"weights", source.weights},
                        {"device", device.name()},
                        {"prompt_ids", prompt},
                        {"ids", r.tokens},
                        {"logprobs", r.logprobs},
                        {"stop", r.stopped_at_eos ? "eos" : "max_tokens"},
                        {"prefill_seconds", r.prefill_seconds},
                        {"decode_seconds", r.decode_seconds},
                        {"decode_tokens_per_s", decode_tps}};
    if (tokenizer) j["text"] = text;
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  if (tokenizer) {
    std::printf("%s\n", text.c_str());
  } else {
    std::string ids;
    for (std::size_t i = 0; i < r.tokens.size(); ++i) ids += fmt::format("{}{}", i == 0 ? "" : ",", r.tokens[i]);
    std::printf("%s\n", ids.c_str());
  }
  std::fprintf(stderr, "%zu tokens (%s) after a %lld-token prompt on %s: prefill and first token %.3f s, then %.1f tokens/s\n",
               r.tokens.size(), r.stopped_at_eos ? "stopped at end of sequence" : "--max-tokens reached",
               static_cast<long long>(prompt_len), device.name().c_str(), r.prefill_seconds, decode_tps);
}

int run_generate(const GenerateFlags& f) {
  using namespace strata::models;
  check_flags(f);
  const train::ModelSource source = train::resolve_model_source(f.model, f.weights, "strata generate");
  const ModelConfig& config = source.config;
  // source.notes are about training (dropout not applied) or already in config.max_seq_len (a
  // sliding window that caps it): nothing generate needs to say.

  std::unique_ptr<Tokenizer> tokenizer;
  if (folder_has_tokenizer(source.folder)) tokenizer = load_tokenizer(source.folder);
  const std::vector<std::int32_t> prompt = prompt_ids(f, config, source, tokenizer.get());
  const auto prompt_len = static_cast<std::int64_t>(prompt.size());
  if (prompt_len + f.max_tokens > config.max_seq_len) {
    throw ConfigError(fmt::format("a prompt of {} tokens and --max-tokens {} exceed model '{}' max_seq_len of {}; "
                                  "lower --max-tokens to at most {} or shorten the prompt (it is never truncated)",
                                  prompt_len, f.max_tokens, config.name, config.max_seq_len,
                                  std::max<std::int64_t>(0, config.max_seq_len - prompt_len)));
  }

  // The device: every weight resident (and its gradient buffer, which the resident provider
  // keeps), the KV cache and its work buffers.
  const std::vector<ParamGroupSpec> groups = decoder_param_groups(config);
  std::size_t param_bytes = 0;
  for (const auto& g : groups) param_bytes += g.bytes() + 256 * g.tensors.size();
  const std::int64_t capacity = prompt_len + f.max_tokens;
  SimDeviceOptions dev_opts;
  dev_opts.capacity_bytes = 2 * param_bytes + KvDecoder::device_bytes(config, capacity) + (64u << 20);
  dev_opts.capacity_knob = "strata generate --max-tokens and the prompt's length";
  auto device = train::open_compute_device(train::parse_device_flag(f.device), 0, dev_opts, {"strata generate", "--device"});
  if (device->kind() == DeviceKind::Cuda && dev_opts.capacity_bytes > device->capacity_bytes()) {
    throw ConfigError(fmt::format("model '{}' with a KV cache of {} positions needs {} of device memory, more than the "
                                  "{} free on {}; lower --max-tokens or use --device sim",
                                  config.name, capacity, format_bytes(dev_opts.capacity_bytes),
                                  format_bytes(device->capacity_bytes()), device->name()));
  }
  train::ComputeStream cs(*device, "compute");
  ResidentParamProvider params(groups, device.get());
  load_weights(source.weights, config, params, &cs.stream());
  KvDecoder decoder(config, DecoderRuntime{cs.context(), device.get()}, capacity);

  GenerateOptions go;
  go.max_new_tokens = f.max_tokens;
  if (!source.folder.empty()) go.stop_ids = folder_eos_ids(source.folder);
  go.sampling = {static_cast<float>(f.temperature), f.top_k, static_cast<float>(f.top_p), f.seed};
  const GenerateResult r = generate(decoder, params, prompt, go);

  print_generated(f, config, source, *device, prompt, r, tokenizer.get());
  return 0;
}

}  // namespace

void register_generate(CLI::App& app, bench::CommandTable& table) {
  auto f = std::make_shared<GenerateFlags>();
  auto* cmd = app.add_subcommand("generate", "text or token ids after a prompt, over a KV cache (greedy by default)");
  train::add_model_flags(*cmd, f->model, f->weights);
  auto* prompt = cmd->add_option("--prompt", f->prompt, "prompt text (needs a model folder with a tokenizer; no BOS added)");
  cmd->add_option("--prompt-ids", f->prompt_ids, "prompt as comma-separated token ids, e.g. 15496,11,995");
  cmd->add_option("--max-tokens", f->max_tokens, "most new tokens (default 32)");
  cmd->add_option("--temperature", f->temperature, "0: greedy (default); > 0 samples");
  cmd->add_option("--top-k", f->top_k, "sample among the k most likely tokens (0: all; default 0)");
  cmd->add_option("--top-p", f->top_p, "sample among the most likely tokens of total probability p, in (0, 1] (default 1)");
  cmd->add_option("--seed", f->seed, "sampling seed: the same seed gives the same tokens (default 0)");
  cmd->add_flag("--json", f->json, "print one JSON object: ids, per-token logprobs, text, timings");
  cmd->add_option("--device", f->device, "sim, cuda or auto (default sim)");
  table[cmd] = [f, prompt]() {
    f->has_prompt = prompt->count() > 0;
    return run_generate(*f);
  };
}

}  // namespace strata::cli
