// Weights from a safetensors file or a Hugging Face folder (see models/weight_source.h).
#include "models/weight_source.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "models/decoder_params.h"
#include "models/hf_config.h"
#include "models/hf_names.h"

namespace strata::models {

namespace {

float value_at(const void* data, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::F32: {
      float v = 0;
      std::memcpy(&v, static_cast<const float*>(data) + i, sizeof v);
      return v;
    }
    case DType::BF16: return bf16_to_f32(static_cast<const bf16*>(data)[i]);
    case DType::F16: return f16_to_f32(static_cast<const fp16*>(data)[i]);
  }
  return 0;
}

// A tensor of the files, by the name the model's table uses (HF names normalized).
struct Found {
  std::size_t file;
  const SafetensorsEntry* entry;
};
using FoundTensors = std::map<std::string, Found>;

// Every tensor of every file; with a sharded folder's index, only the copy the index names.
FoundTensors find_tensors(const std::vector<SafetensorsFile>& files, const std::vector<std::string>& paths,
                          const std::map<std::string, std::string>& index, const std::string& index_file,
                          const ModelConfig& config, bool strata_names, const std::string& what,
                          const std::string& path) {
  FoundTensors by_name;
  for (std::size_t fi = 0; fi < files.size(); ++fi) {
    for (const SafetensorsEntry& e : files[fi].tensors()) {
      if (!index.empty()) {
        const auto it = index.find(e.name);
        if (it == index.end() || it->second != paths[fi]) continue;  // the index decides which copy counts
      }
      const std::string n = strata_names ? e.name : normalize_hf_name(config, e.name);
      if (!strata_names && is_ignorable_hf_tensor(config, n)) continue;
      if (const auto prev = by_name.find(n); prev != by_name.end()) {
        throw FormatError(fmt::format("{} '{}': tensor '{}' is in both '{}' and '{}'", what, path, e.name,
                                      paths[prev->second.file], paths[fi]));
      }
      by_name[n] = {fi, &e};
    }
  }
  for (const auto& [tensor, shard] : index) {
    bool held = false;
    for (std::size_t fi = 0; fi < files.size(); ++fi) held = held || (paths[fi] == shard && files[fi].find(tensor));
    if (!held) {
      throw FormatError(fmt::format("'{}' maps tensor '{}' to '{}', which does not hold it; the folder's files are "
                                    "from different downloads",
                                    index_file, tensor, shard));
    }
  }
  return by_name;
}

// Another model's weights are refused whole before a shape is compared: tensors the model does
// not have (a deeper model's blocks, which would be dropped) first, then the ones it lacks.
void check_same_model(const FoundTensors& by_name, const std::vector<HfTensorName>& names, bool strata_names,
                      const ModelConfig& config, const std::string& what, const std::string& path) {
  std::set<std::string> wanted;
  for (const HfTensorName& m : names) wanted.insert(strata_names ? m.strata_name : m.hf_name);
  std::vector<std::string> extra, missing;
  for (const auto& [n, found] : by_name) {
    if (!wanted.contains(n)) extra.push_back(found.entry->name);
  }
  for (const HfTensorName& m : names) {
    const std::string& n = strata_names ? m.strata_name : m.hf_name;
    if (!by_name.contains(n)) missing.push_back(n);
  }
  const auto listed = [](const std::vector<std::string>& v) {  // a few names; the count says how many more
    std::string out;
    for (std::size_t i = 0; i < v.size() && i < 4; ++i) out += fmt::format("{}'{}'", i == 0 ? "" : ", ", v[i]);
    if (v.size() > 4) out += fmt::format(" and {} more", v.size() - 4);
    return out;
  };
  if (!extra.empty()) {
    throw FormatError(fmt::format("{} '{}' holds {} tensor(s) model '{}' does not have ({}); they are the weights of "
                                  "another model (more layers, another size or architecture), which would be dropped: "
                                  "give the weights of model '{}', or set strata.model to theirs",
                                  what, path, extra.size(), config.name, listed(extra), config.name));
  }
  if (!missing.empty()) {
    throw FormatError(fmt::format("{} '{}' lacks {} tensor(s) of model '{}' ({}); they are the weights of another "
                                  "model or incomplete: give the weights of model '{}' (strata train --save-weights "
                                  "and strata ckpt export write such files)",
                                  what, path, missing.size(), config.name, listed(missing), config.name));
  }
}

}  // namespace

WeightSource WeightSource::open(const std::string& path, const ModelConfig& config, std::string what) {
  WeightSource s;
  s.path_ = path;
  s.what_ = std::move(what);
  std::map<std::string, std::string> index;  // tensor -> shard path, for a sharded folder
  std::string index_file;
  if (is_hf_model_folder(path)) {
    const HfModelFolder folder = open_hf_model_folder(path);
    s.file_paths_ = folder.weight_files;
    index = folder.weight_map;
    index_file = folder.index_file;
  } else {
    s.file_paths_ = {path};
  }
  for (const std::string& f : s.file_paths_) s.files_.push_back(SafetensorsFile::open(f));
  const std::vector<HfTensorName> names = hf_tensor_names(config);
  bool strata_names = false;
  for (const SafetensorsFile& f : s.files_) strata_names = strata_names || f.find(names.front().strata_name) != nullptr;
  s.naming_ = strata_names ? WeightNaming::Strata : WeightNaming::HuggingFace;
  const FoundTensors by_name =
      find_tensors(s.files_, s.file_paths_, index, index_file, config, strata_names, s.what_, path);
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const ParamGroupSpec& g : decoder_param_groups(config)) {
    for (const ParamTensorSpec& t : g.tensors) shapes[t.name] = t.shape;
  }
  check_same_model(by_name, names, strata_names, config, s.what_, path);
  for (const HfTensorName& m : names) {
    const std::string file_name = strata_names ? m.strata_name : m.hf_name;
    const Found& found = by_name.at(file_name);
    Tensor t{found.file, found.entry->name, shapes.at(m.strata_name), !strata_names && m.transposed};
    std::vector<std::int64_t> want = t.shape;
    if (t.transposed) std::swap(want[0], want[1]);
    if (found.entry->shape != want) {
      throw FormatError(fmt::format("{} '{}': tensor '{}' has shape {} but model '{}' needs {}", s.what_,
                                    s.file_paths_[t.file], t.file_name, format_shape(found.entry->shape),
                                    config.name, format_shape(want)));
    }
    if (!found.entry->dtype) {
      throw FormatError(fmt::format("{} '{}': tensor '{}' is {}; weights must be F32, BF16 or F16", s.what_,
                                    s.file_paths_[t.file], t.file_name, found.entry->dtype_name));
    }
    t.elems = 1;
    for (std::int64_t d : t.shape) t.elems *= static_cast<std::uint64_t>(d);
    t.file_dtype = *found.entry->dtype;
    s.tensors_.emplace(m.strata_name, std::move(t));
  }
  return s;
}

void WeightSource::read_rows(const std::string& strata_name, DType to, std::int64_t row_begin, std::int64_t row_end,
                             void* dst) const {
  const auto it = tensors_.find(strata_name);
  STRATA_CHECK(it != tensors_.end(), "weights of '{}' have no tensor '{}'", path_, strata_name);
  const Tensor& t = it->second;
  const SafetensorsFile& file = files_[t.file];
  const SafetensorsEntry& e = *file.find(t.file_name);
  std::int64_t row_elems = 1;
  for (std::size_t d = 1; d < t.shape.size(); ++d) row_elems *= t.shape[d];
  STRATA_CHECK(row_begin >= 0 && row_begin <= row_end && row_end <= t.shape[0], "rows [{}, {}) of '{}' ({} rows)",
               row_begin, row_end, strata_name, t.shape[0]);
  const std::size_t esize = dtype_bytes(to), n = static_cast<std::size_t>((row_end - row_begin) * row_elems);
  if (!t.transposed) {
    file.read_rows(e, to, row_begin, row_end, dst);
  } else {  // a GPT-2 Conv1D [in, out]: the whole tensor, then rows of its transpose
    const std::int64_t in = t.shape[1];
    std::vector<std::uint8_t> whole(static_cast<std::size_t>(t.shape[0] * in) * esize);
    file.read(e, to, whole.data());
    auto* out = static_cast<std::uint8_t*>(dst);
    for (std::int64_t r = row_begin; r < row_end; ++r) {
      for (std::int64_t c = 0; c < in; ++c) {
        std::memcpy(out + static_cast<std::size_t>((r - row_begin) * in + c) * esize,
                    whole.data() + static_cast<std::size_t>(c * t.shape[0] + r) * esize, esize);
      }
    }
  }
  // Weights are where training starts or what eval scores: a NaN or infinity makes every loss NaN
  // and every step skip, so it is refused here, naming the tensor and the element.
  for (std::size_t i = 0; i < n; ++i) {
    const float v = value_at(dst, to, i);
    if (std::isfinite(v)) continue;
    const std::size_t whole_index = static_cast<std::size_t>(row_begin * row_elems) + i;
    throw FormatError(fmt::format("{} '{}': tensor '{}' element {} is {}; weights must be finite numbers; the file is "
                                  "damaged or from a run that diverged",
                                  what_, file_paths_[t.file], t.file_name, whole_index, v));
  }
}

void WeightSource::read(const std::string& strata_name, DType to, void* dst) const {
  const auto it = tensors_.find(strata_name);
  STRATA_CHECK(it != tensors_.end(), "weights of '{}' have no tensor '{}'", path_, strata_name);
  read_rows(strata_name, to, 0, it->second.shape.empty() ? 1 : it->second.shape[0], dst);
}

std::uint64_t WeightSource::read_staging_bytes() const {
  std::uint64_t most = 0;
  for (const auto& [name, t] : tensors_) {
    const std::uint64_t raw = t.file_dtype != DType::F32 ? t.elems * dtype_bytes(t.file_dtype) : 0;
    most = std::max(most, raw + (t.transposed ? t.elems * 4 : 0));
  }
  return most;
}

std::uint64_t WeightSource::file_bytes() const {
  std::uint64_t bytes = 0;
  for (const auto& [name, t] : tensors_) bytes += t.elems * dtype_bytes(t.file_dtype);
  return bytes;
}

}  // namespace strata::models
