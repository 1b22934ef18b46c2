// Hugging Face model folders: what `from_pretrained` reads, read by Strata. A folder holds
// config.json (the architecture), the weights as model.safetensors or shards listed by
// model.safetensors.index.json, and maybe generation_config.json and the tokenizer's files.
//
// Note [Hugging Face configs]: config.json's model_type picks the family: "gpt2" (GPT2LMHeadModel)
// or "llama", "mistral", "qwen2" (the LLaMA decoder with options: Qwen2's q/k/v biases, Mistral's
// head_dim, tied heads, rope_scaling). A field that changes the model's math in a way Strata does
// not compute is refused by name with its value (a sliding window shorter than the context,
// attention or MLP biases beyond Qwen2's, an activation other than the family's, rope scaling other
// than linear and llama3, cross-attention); fields that change nothing Strata computes (dropout
// probabilities, token ids, use_cache, torch_dtype, ...) are read past. Dropout is the one of those
// that would change training: Strata trains without it, and says so once at startup when the
// config has any.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model_config.h"

namespace strata::models {

// Whether `path` is a directory holding config.json (a Hugging Face model folder).
bool is_hf_model_folder(const std::string& path);

// The model of a config.json already parsed (`where` names the file in messages). ConfigError
// naming the file, the field, its value and the fix for an unknown family or a field Strata cannot
// honour. `notes` collects lines worth printing once (dropout not applied, a window that caps
// max_seq_len).
ModelConfig model_config_from_hf(const nlohmann::json& config, const std::string& where,
                                 std::vector<std::string>* notes = nullptr);

// config.json for `config`, as transformers writes it for the family it came from (`model_type`
// "gpt2", "llama", "mistral" or "qwen2"; empty: gpt2 or llama by architecture, mistral when
// head_dim is its own, qwen2 with q/k/v biases), so that AutoModelForCausalLM loads it.
nlohmann::json hf_config_json(const ModelConfig& config, std::string model_type = "");

struct HfModelFolder {
  std::string dir;
  nlohmann::json config_json;  // config.json as read
  ModelConfig config;
  std::vector<std::string> notes;
  // The weights: one file, or the shards the index names, each once, in the index's order.
  std::vector<std::string> weight_files;
  std::string index_file;                         // empty for one file
  std::map<std::string, std::string> weight_map;  // tensor name -> shard path (index only)
  // The files a loadable export copies beside the weights (tokenizer, generation config) that
  // exist in the folder.
  std::vector<std::string> companion_files;
};

// Reads and checks `dir`: config.json, then model.safetensors, or without it (transformers' order)
// model.safetensors.index.json (every shard present, its names plain file names in the folder).
// ConfigError / FormatError naming the
// file and the fix (a folder with only pytorch_model.bin is told how to convert it).
HfModelFolder open_hf_model_folder(const std::string& dir);

}  // namespace strata::models
