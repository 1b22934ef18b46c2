// safetensors <-> ParamProvider weights, Strata or Hugging Face names (see models/weights_io.h).
#include "models/weights_io.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "models/decoder_params.h"
#include "models/hf_names.h"
#include "models/safetensors.h"

namespace strata::models {

namespace {

// [rows, cols] -> [cols, rows] of `esize`-byte elements.
std::vector<std::uint8_t> transpose(const std::vector<std::uint8_t>& src, std::int64_t rows, std::int64_t cols,
                                    std::size_t esize) {
  std::vector<std::uint8_t> dst(src.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      std::memcpy(dst.data() + static_cast<std::size_t>(c * rows + r) * esize,
                  src.data() + static_cast<std::size_t>(r * cols + c) * esize, esize);
    }
  }
  return dst;
}

void copy_to_device(Stream* stream, void* dst, const void* src, std::size_t bytes) {
  if (stream == nullptr) {
    std::memcpy(dst, src, bytes);
  } else {
    stream->copy_h2d(dst, src, bytes);
    stream->synchronize();  // the staging buffer dies after this call (load path, not hot)
  }
}

void copy_to_host(Stream* stream, void* dst, const void* src, std::size_t bytes) {
  if (stream == nullptr) {
    std::memcpy(dst, src, bytes);
  } else {
    stream->copy_d2h(dst, src, bytes);
    stream->synchronize();
  }
}

// The index of the first NaN or infinity among `n` values of `dtype` at `data`, if any.
std::optional<std::size_t> first_non_finite(const void* data, DType dtype, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    float v = 0;
    switch (dtype) {
      case DType::F32: std::memcpy(&v, static_cast<const float*>(data) + i, sizeof v); break;
      case DType::BF16: v = bf16_to_f32(static_cast<const bf16*>(data)[i]); break;
      case DType::F16: v = f16_to_f32(static_cast<const fp16*>(data)[i]); break;
    }
    if (!std::isfinite(v)) return i;
  }
  return std::nullopt;
}

// Weights are where training starts or what eval scores: a NaN or infinity in them makes every loss
// NaN and every step skip, so it is refused when read, naming the tensor and the element.
void check_finite_weights(const void* data, DType dtype, std::size_t n, std::size_t first_index,
                          std::string_view what, const std::string& path, const std::string& tensor,
                          std::size_t tensor_elems, std::string_view fix) {
  const std::optional<std::size_t> bad = first_non_finite(data, dtype, n);
  if (!bad) return;
  float v = 0;
  switch (dtype) {
    case DType::F32: std::memcpy(&v, static_cast<const float*>(data) + *bad, sizeof v); break;
    case DType::BF16: v = bf16_to_f32(static_cast<const bf16*>(data)[*bad]); break;
    case DType::F16: v = f16_to_f32(static_cast<const fp16*>(data)[*bad]); break;
  }
  throw FormatError(fmt::format("{} '{}': tensor '{}' element {} (of {}) is {}; weights must be finite numbers; {}",
                                what, path, tensor, first_index + *bad, tensor_elems, v, fix));
}

}  // namespace

WeightNaming load_weights(const std::string& path, const ModelConfig& config, ParamProvider& provider, Stream* stream) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::map<std::string, WholeTensor> where;
  for (auto& w : whole_tensors(config, provider.groups())) where.emplace(w.spec.name, std::move(w));
  const auto hf = hf_tensor_names(config);
  // Detect the naming from the first parameter's name.
  const bool strata_names = file.find(hf.front().strata_name) != nullptr;
  const WeightNaming naming = strata_names ? WeightNaming::Strata : WeightNaming::HuggingFace;
  std::map<std::string, const SafetensorsEntry*> by_name;
  for (const auto& e : file.tensors()) {
    const std::string n = strata_names ? e.name : normalize_hf_name(config, e.name);
    if (!strata_names && is_ignorable_hf_tensor(config, n)) continue;
    by_name[n] = &e;
  }
  std::set<std::string> used;
  for (const auto& m : hf) {
    const std::string file_name = strata_names ? m.strata_name : m.hf_name;
    const bool transposed = !strata_names && m.transposed;
    auto it = by_name.find(file_name);
    if (it == by_name.end()) {
      throw FormatError(fmt::format("weights file '{}' has no tensor '{}' (model '{}' parameter '{}'); the file is for "
                                    "another model or is incomplete",
                                    path, file_name, config.name, m.strata_name));
    }
    const WholeTensor& whole = where.at(m.strata_name);
    std::vector<std::int64_t> want = whole.spec.shape;
    if (transposed) std::swap(want[0], want[1]);
    if (it->second->shape != want) {
      throw FormatError(fmt::format("weights file '{}': tensor '{}' has shape {} but model '{}' needs {}", path, file_name,
                                    format_shape(it->second->shape), config.name, format_shape(want)));
    }
    std::vector<std::uint8_t> host(whole.spec.bytes());
    file.read(*it->second, whole.spec.dtype, host.data());
    check_finite_weights(host.data(), whole.spec.dtype, whole.spec.elems(), 0, "weights file", path, file_name,
                         whole.spec.elems(), "the file is damaged or from a run that diverged");
    if (transposed) host = transpose(host, want[0], want[1], dtype_bytes(whole.spec.dtype));
    // A tiled weight goes to its tiles, rows by rows (models/tiling.h).
    for (const TensorPart& part : whole.parts) {
      const GroupViews v = provider.acquire_params(part.group, ParamPhase::Forward, stream);
      copy_to_device(stream, v[part.tensor], host.data() + whole.part_offset_bytes(part), whole.part_bytes(part));
      provider.release_params(part.group, stream);
    }
    used.insert(file_name);
  }
  for (const auto& [n, e] : by_name) {
    if (!used.contains(n)) {
      throw FormatError(fmt::format("weights file '{}' has tensor '{}' that model '{}' does not have; check --model "
                                    "(a different size or architecture)",
                                    path, e->name, config.name));
    }
  }
  return naming;
}

void save_weights(const std::string& path, const ModelConfig& config, ParamProvider& provider, Stream* stream,
                  WeightNaming naming) {
  std::map<std::string, WholeTensor> where;
  for (auto& w : whole_tensors(config, provider.groups())) where.emplace(w.spec.name, std::move(w));
  std::vector<std::vector<std::uint8_t>> storage;
  std::vector<SafetensorsTensorOut> out;
  for (const auto& m : hf_tensor_names(config)) {
    const WholeTensor& whole = where.at(m.strata_name);
    std::vector<std::uint8_t> host(whole.spec.bytes());
    // A tiled weight is reassembled from its tiles: the file is the untiled model's.
    for (const TensorPart& part : whole.parts) {
      const GroupViews v = provider.acquire_params(part.group, ParamPhase::Forward, stream);
      copy_to_host(stream, host.data() + whole.part_offset_bytes(part), v[part.tensor], whole.part_bytes(part));
      provider.release_params(part.group, stream);
    }
    std::vector<std::int64_t> shape = whole.spec.shape;
    if (naming == WeightNaming::HuggingFace && m.transposed) {
      host = transpose(host, shape[0], shape[1], dtype_bytes(whole.spec.dtype));
      std::swap(shape[0], shape[1]);
    }
    storage.push_back(std::move(host));
    out.push_back({naming == WeightNaming::Strata ? m.strata_name : m.hf_name, whole.spec.dtype, shape,
                   storage.back().data()});
  }
  write_safetensors(path, out,
                    {{"format", "pt"}, {"strata.model", config.name}, {"strata.arch", std::string(architecture_name(config.arch))}});
}

void check_init_weights_tensors(const SafetensorsFile& file, const ModelConfig& config) {
  std::set<std::string> model_names;
  for (const auto& g : decoder_param_groups(config)) {
    for (const auto& t : g.tensors) model_names.insert(t.name);
  }
  // At most a few names in a message; the count says how many more.
  const auto listed = [](const std::vector<std::string>& names) {
    std::string s;
    for (std::size_t i = 0; i < names.size() && i < 4; ++i) s += fmt::format("{}'{}'", i == 0 ? "" : ", ", names[i]);
    if (names.size() > 4) s += fmt::format(" and {} more", names.size() - 4);
    return s;
  };
  std::vector<std::string> extra, missing;
  std::set<std::string> in_file;
  for (const auto& e : file.tensors()) {
    in_file.insert(e.name);
    if (!model_names.contains(e.name)) extra.push_back(e.name);
  }
  for (const auto& n : model_names) {
    if (!in_file.contains(n)) missing.push_back(n);
  }
  if (!extra.empty()) {
    throw FormatError(fmt::format("strata.init_weights '{}' holds {} tensor(s) model '{}' does not have ({}); it holds "
                                  "the weights of another model (more layers, another size or architecture), which "
                                  "would be dropped: give weights saved from model '{}', or set strata.model to "
                                  "theirs",
                                  file.path(), extra.size(), config.name, listed(extra), config.name));
  }
  if (!missing.empty()) {
    throw FormatError(fmt::format("strata.init_weights '{}' lacks {} tensor(s) of model '{}' ({}); it holds the "
                                  "weights of another model or is incomplete: give weights saved from model '{}' "
                                  "(strata train --save-weights writes such files)",
                                  file.path(), missing.size(), config.name, listed(missing), config.name));
  }
}

void read_init_tensor(const SafetensorsFile& file, const ModelConfig& config, const ParamTensorSpec& tensor,
                      std::span<float> out) {
  STRATA_CHECK(out.size() == tensor.elems(), "init of '{}': {} values for {} elements", tensor.name, out.size(),
               tensor.elems());
  const std::optional<WholeTensorRows> tile = whole_tensor_of(tensor.name);
  const std::string whole_name = tile ? tile->whole_name : tensor.name;
  const ParamTensorSpec* whole = nullptr;
  const auto groups = decoder_param_groups(config);
  for (const auto& g : groups) {
    for (const auto& t : g.tensors) whole = t.name == whole_name ? &t : whole;
  }
  if (whole == nullptr) {
    throw FormatError(fmt::format("init of '{}': model '{}' has no tensor '{}'", tensor.name, config.name, whole_name));
  }
  const SafetensorsEntry* e = file.find(whole_name);
  if (e == nullptr) {
    throw FormatError(fmt::format("strata.init_weights '{}' has no tensor '{}'; it must hold Strata-named weights of "
                                  "model '{}' (strata train --save-weights writes such files)",
                                  file.path(), whole_name, config.name));
  }
  if (e->shape != whole->shape) {
    throw FormatError(fmt::format("strata.init_weights '{}': tensor '{}' has shape {}, the model needs {}", file.path(),
                                  whole_name, format_shape(e->shape), format_shape(whole->shape)));
  }
  std::size_t first_index = 0;  // of `out` in the whole tensor
  if (tile) {
    file.read_rows(*e, DType::F32, tile->rows.begin, tile->rows.end, out.data());
    first_index = static_cast<std::size_t>(tile->rows.begin) * (whole->elems() / static_cast<std::size_t>(whole->shape[0]));
  } else {
    file.read(*e, DType::F32, out.data());
  }
  check_finite_weights(out.data(), DType::F32, out.size(), first_index, "strata.init_weights", file.path(), whole_name,
                       whole->elems(),
                       "fix the file, or remove strata.init_weights to start from the default initialization");
}

std::vector<WholeTensorValues> assemble_whole_tensors(const ModelConfig& config, std::span<const ParamGroupSpec> groups,
                                                      std::span<const std::vector<float>> values) {
  std::vector<std::size_t> first(groups.size() + 1, 0);  // flat index of each group's first tensor
  for (std::size_t g = 0; g < groups.size(); ++g) first[g + 1] = first[g] + groups[g].tensors.size();
  STRATA_CHECK(values.size() == first.back(), "{} value arrays for {} tensors", values.size(), first.back());
  std::vector<WholeTensorValues> out;
  for (const WholeTensor& w : whole_tensors(config, groups)) {
    WholeTensorValues v{w.spec.name, w.spec.shape, std::vector<float>(w.spec.elems())};
    const std::size_t row_elems = w.row_bytes() / dtype_bytes(w.spec.dtype);
    for (const TensorPart& p : w.parts) {
      const std::vector<float>& src = values[first[p.group] + p.tensor];
      const std::size_t n = static_cast<std::size_t>(p.rows.rows()) * row_elems;
      STRATA_CHECK(src.size() == n, "tensor '{}' has {} values, expected {}", groups[p.group].tensors[p.tensor].name,
                   src.size(), n);
      std::copy(src.begin(), src.end(), v.values.begin() + static_cast<std::ptrdiff_t>(p.rows.begin) *
                                                              static_cast<std::ptrdiff_t>(row_elems));
    }
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace strata::models
