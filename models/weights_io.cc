// safetensors <-> ParamProvider weights, Strata or Hugging Face names (see models/weights_io.h).
#include "models/weights_io.h"

#include <cstring>
#include <map>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
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

struct Located {
  std::size_t group, index;
  const ParamTensorSpec* spec;
};

std::map<std::string, Located> locate(const ParamProvider& provider) {
  std::map<std::string, Located> out;
  auto groups = provider.groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (std::size_t i = 0; i < groups[g].tensors.size(); ++i) out[groups[g].tensors[i].name] = {g, i, &groups[g].tensors[i]};
  }
  return out;
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

}  // namespace

WeightNaming load_weights(const std::string& path, const ModelConfig& config, ParamProvider& provider, Stream* stream) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  const auto where = locate(provider);
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
    const Located& loc = where.at(m.strata_name);
    std::vector<std::int64_t> want = loc.spec->shape;
    if (transposed) std::swap(want[0], want[1]);
    if (it->second->shape != want) {
      throw FormatError(fmt::format("weights file '{}': tensor '{}' has shape {} but model '{}' needs {}", path, file_name,
                                    format_shape(it->second->shape), config.name, format_shape(want)));
    }
    std::vector<std::uint8_t> host(loc.spec->bytes());
    file.read(*it->second, loc.spec->dtype, host.data());
    if (transposed) host = transpose(host, want[0], want[1], dtype_bytes(loc.spec->dtype));
    const GroupViews v = provider.acquire_params(loc.group, ParamPhase::Forward, stream);
    copy_to_device(stream, v[loc.index], host.data(), host.size());
    provider.release_params(loc.group, stream);
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
  const auto where = locate(provider);
  std::vector<std::vector<std::uint8_t>> storage;
  std::vector<SafetensorsTensorOut> out;
  for (const auto& m : hf_tensor_names(config)) {
    const Located& loc = where.at(m.strata_name);
    std::vector<std::uint8_t> host(loc.spec->bytes());
    const GroupViews v = provider.acquire_params(loc.group, ParamPhase::Forward, stream);
    copy_to_host(stream, host.data(), v[loc.index], host.size());
    provider.release_params(loc.group, stream);
    std::vector<std::int64_t> shape = loc.spec->shape;
    if (naming == WeightNaming::HuggingFace && m.transposed) {
      host = transpose(host, shape[0], shape[1], dtype_bytes(loc.spec->dtype));
      std::swap(shape[0], shape[1]);
    }
    storage.push_back(std::move(host));
    out.push_back({naming == WeightNaming::Strata ? m.strata_name : m.hf_name, loc.spec->dtype, shape,
                   storage.back().data()});
  }
  write_safetensors(path, out,
                    {{"format", "pt"}, {"strata.model", config.name}, {"strata.arch", std::string(architecture_name(config.arch))}});
}

}  // namespace strata::models
