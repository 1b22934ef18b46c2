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

}  // namespace

WeightNaming load_weights(const std::string& path, const ModelConfig& config, ParamProvider& provider, Stream* stream) {
  const WeightSource source = WeightSource::open(path, config, "weights");
  for (const WholeTensor& whole : whole_tensors(config, provider.groups())) {
    std::vector<std::uint8_t> host(whole.spec.bytes());
    source.read(whole.spec.name, whole.spec.dtype, host.data());
    // A tiled weight goes to its tiles, rows by rows (models/tiling.h).
    for (const TensorPart& part : whole.parts) {
      const GroupViews v = provider.acquire_params(part.group, ParamPhase::Forward, stream);
      copy_to_device(stream, v[part.tensor], host.data() + whole.part_offset_bytes(part), whole.part_bytes(part));
      provider.release_params(part.group, stream);
    }
  }
  return source.naming();
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

void read_init_tensor(const WeightSource& source, const ModelConfig& config, const ParamTensorSpec& tensor,
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
  if (tile) {
    source.read_rows(whole_name, DType::F32, tile->rows.begin, tile->rows.end, out.data());
  } else {
    source.read(whole_name, DType::F32, out.data());
  }
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
