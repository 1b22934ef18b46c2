// Hugging Face model folders out (see models/hf_export.h, Note [Hugging Face export] in models/hf_export.h).
#include "models/hf_export.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "core/dtype_bulk.h"
#include "core/error.h"
#include "core/file_io.h"
#include "models/hf_config.h"
#include "models/hf_names.h"
#include "models/safetensors.h"

namespace strata::models {

namespace fs = std::filesystem;

namespace {

void write_json(const fs::path& path, const nlohmann::json& j) {
  const std::string text = j.dump(2) + "\n";
  UniqueFd fd = create_new_file(path.string(), "Hugging Face export", 0644);
  write_exact(fd.get(), text.data(), text.size(), 0, path.string());
  fsync_file(fd.get(), path.string());
}

// The tensors of each shard, in hf_tensor_names() order: a new shard starts when the next tensor
// would pass `max_bytes` (a tensor larger than that is a shard alone).
std::vector<std::vector<std::size_t>> plan_shards(const std::vector<std::uint64_t>& bytes, std::uint64_t max_bytes) {
  std::vector<std::vector<std::size_t>> shards;
  std::uint64_t in_shard = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (shards.empty() || (in_shard > 0 && in_shard + bytes[i] > max_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes[i];
  }
  return shards;
}

}  // namespace

std::vector<float> transposed_matrix(std::span<const float> src, std::int64_t rows, std::int64_t cols) {
  std::vector<float> dst(src.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      dst[static_cast<std::size_t>(c * rows + r)] = src[static_cast<std::size_t>(r * cols + c)];
    }
  }
  return dst;
}

namespace {

using WholeTensorFn = std::function<void(const ParamTensorSpec&, std::vector<float>&)>;

// A fresh staging folder beside `out`, which must not exist or be an empty directory.
fs::path make_staging(const HfExport& e, const fs::path& out) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out, ec))) {
    if (!fs::is_directory(fs::symlink_status(out, ec)) || !fs::is_empty(out, ec)) {
      throw ConfigError(fmt::format("Hugging Face export folder '{}' already exists and is not an empty directory; "
                                    "give a new folder (transformers' from_pretrained reads the whole folder, so "
                                    "files of another model there would mix with this one)",
                                    e.out_dir));
    }
  }
  const fs::path staging = out.string() + ".strata-partial";
  fs::remove_all(staging, ec);
  if (ec) throw IoError(fmt::format("cannot remove the unfinished export '{}': {}", staging.string(), ec.message()), ec.value());
  ensure_directory(staging.string(), "Hugging Face export folder");
  return staging;
}

// The weights into `staging`, one safetensors file per shard (with an index when several), under
// their Hugging Face names, in the model's order.
void write_weight_files(const HfExport& e, const WholeTensorFn& whole_tensor, const fs::path& staging,
                        HfExportResult& result) {
  std::vector<ParamTensorSpec> specs;
  for (const ParamGroupSpec& g : decoder_param_groups(e.model)) {
    for (const ParamTensorSpec& t : g.tensors) specs.push_back(t);
  }
  const std::vector<HfTensorName> names = hf_tensor_names(e.model);
  STRATA_CHECK(names.size() == specs.size(), "{} Hugging Face names for {} tensors", names.size(), specs.size());
  std::vector<std::uint64_t> bytes;
  for (const ParamTensorSpec& t : specs) bytes.push_back(t.elems() * dtype_bytes(e.dtype));
  const std::vector<std::vector<std::size_t>> shards = plan_shards(bytes, e.max_shard_bytes);

  nlohmann::json weight_map = nlohmann::json::object();
  std::map<std::string, std::string> metadata = e.metadata;
  metadata["format"] = "pt";  // what transformers' safetensors loader requires
  std::vector<float> values;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? "model.safetensors"
                                                : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<std::vector<std::byte>> held;
    std::vector<SafetensorsTensorOut> tensors;
    std::uint64_t shard_bytes = 0;
    for (std::size_t i : shards[s]) {
      const ParamTensorSpec& t = specs[i];
      const HfTensorName& h = names[i];
      STRATA_CHECK(h.strata_name == t.name, "Hugging Face name table out of order at '{}'", t.name);
      values.assign(t.elems(), 0.0f);
      whole_tensor(t, values);
      std::vector<std::int64_t> shape = t.shape;
      if (h.transposed) {  // GPT-2's Conv1D weights are stored [in, out]
        values = transposed_matrix(values, shape[0], shape[1]);
        std::swap(shape[0], shape[1]);
      }
      std::vector<std::byte> converted(values.size() * dtype_bytes(e.dtype));
      convert_parallel(values.data(), DType::F32, converted.data(), e.dtype, values.size());
      shard_bytes += converted.size();
      held.push_back(std::move(converted));
      tensors.push_back(SafetensorsTensorOut{h.hf_name, e.dtype, std::move(shape), held.back().data()});
      weight_map[h.hf_name] = file;
    }
    write_safetensors((staging / file).string(), tensors, metadata);
    result.weight_files.push_back(file);
    result.tensors += tensors.size();
    result.weight_bytes += shard_bytes;
    result.peak_shard_bytes = std::max(result.peak_shard_bytes, shard_bytes);
  }
  if (shards.size() > 1) {
    write_json(staging / "model.safetensors.index.json",
               {{"metadata", {{"total_size", result.weight_bytes}}}, {"weight_map", weight_map}});
  }
}

// config.json (the source's keys, such as token ids and the chat template, under the trained
// model's architecture), the companion files, and a generation_config.json where none came along.
void write_config_files(const HfExport& e, const fs::path& staging) {
  const std::string type = e.source_config.is_object() ? e.source_config.value("model_type", std::string()) : "";
  nlohmann::json config = e.source_config.is_object() ? e.source_config : nlohmann::json::object();
  config.update(hf_config_json(e.model, type));
  config["torch_dtype"] = e.dtype == DType::BF16 ? "bfloat16" : "float32";
  write_json(staging / "config.json", config);

  std::error_code ec;
  bool has_generation_config = false;
  for (const std::string& f : e.companion_files) {
    const fs::path name = fs::path(f).filename();
    has_generation_config = has_generation_config || name == "generation_config.json";
    fs::copy_file(f, staging / name, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      throw IoError(fmt::format("Hugging Face export: copying '{}' into '{}' failed: {}", f, staging.string(),
                                ec.message()),
                    ec.value());
    }
  }
  if (!has_generation_config) {
    nlohmann::json generation = {{"_from_model_config", true}};
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
      if (config.contains(key) && !config[key].is_null()) generation[key] = config[key];
    }
    write_json(staging / "generation_config.json", generation);
  }
}

}  // namespace

HfExportResult write_hf_model_folder(const HfExport& e, const WholeTensorFn& whole_tensor) {
  STRATA_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16, "Hugging Face export in {}", dtype_name(e.dtype));
  STRATA_CHECK(e.max_shard_bytes > 0, "Hugging Face export with a shard size of 0");
  const fs::path out(e.out_dir);
  const fs::path staging = make_staging(e, out);
  HfExportResult result;
  write_weight_files(e, whole_tensor, staging, result);
  write_config_files(e, staging);
  fsync_directory(staging.string());
  std::error_code ec;
  if (fs::exists(out, ec)) fs::remove(out, ec);  // the empty directory checked above
  rename_path(staging.string(), out.string());
  fsync_directory(out.parent_path().empty() ? "." : out.parent_path().string());
  return result;
}

}  // namespace strata::models
