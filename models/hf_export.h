// A Hugging Face model folder written from a model's whole tensors: what
// `AutoModelForCausalLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` read.
//
// Note [Hugging Face export]: the folder holds config.json (the source folder's own, when the model
// came from one, with every architecture field rewritten from the model Strata trained, so token ids,
// chat templates and the like survive), generation_config.json (the source's, else one naming the
// config's bos/eos ids), the tokenizer files of the source folder, and the weights under Hugging
// Face names: model.safetensors, or shards model-0000i-of-0000N.safetensors with
// model.safetensors.index.json once they pass the shard size (a tensor larger than the size gets a
// shard of its own, as transformers does). Tensors are read, converted and written one shard at a
// time, so the export holds at most one shard in host memory. The folder is written under
// OUT.strata-partial and renamed to OUT at the end: a failed export never leaves a folder that
// looks complete.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "models/decoder_params.h"
#include "models/model_config.h"

namespace strata::models {

struct HfExport {
  std::string out_dir;
  ModelConfig model;
  nlohmann::json source_config;  // config.json of the folder the model was imported from; null if none
  std::vector<std::string> companion_files;  // generation config and tokenizer files to copy
  DType dtype = DType::F32;  // F32 or BF16
  std::uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default "5GB"
  std::map<std::string, std::string> metadata;  // added to every shard's header beside "format": "pt"
};

struct HfExportResult {
  std::vector<std::string> weight_files;  // in the folder
  std::size_t tensors = 0;
  std::uint64_t weight_bytes = 0;
  std::uint64_t peak_shard_bytes = 0;  // the most tensor bytes held at once
};

// [rows, cols] -> [cols, rows].
std::vector<float> transposed_matrix(std::span<const float> src, std::int64_t rows, std::int64_t cols);

// Writes the folder. `whole_tensor(spec, out)` fills `out` with the fp32 values of the untiled
// tensor `spec` (Strata's shape). ConfigError when OUT exists and is not an empty directory;
// IoError naming the file on a failed write (OUT is then left as it was).
HfExportResult write_hf_model_folder(const HfExport& e,
                                     const std::function<void(const ParamTensorSpec&, std::vector<float>&)>& whole_tensor);

}  // namespace strata::models
