// Whole tensors out of a checkpoint's groups, and the state of another cut (see
// train/checkpoint_tensors.h).
#include "train/checkpoint_tensors.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "plan/partition.h"
#include "models/decoder_params.h"
#include "models/tiling.h"

namespace strata::train {

CheckpointTensors::CheckpointTensors(const CheckpointManifest& m, const models::ModelConfig& model) {
  for (const ParamGroupSpec& g : models::decoder_param_groups(model)) {
    for (const ParamTensorSpec& t : g.tensors) {
      order_.push_back(t);
      wholes_[t.name].spec = t;
    }
  }
  const auto saved = [&](std::size_t g, std::size_t k) -> const CheckpointTensor& {
    if (k >= m.groups[g].tensors.size()) {
      throw FormatError(fmt::format("{}: group '{}' has {} tensors, model '{}' gives it more", m.path, m.groups[g].name,
                                    m.groups[g].tensors.size(), model.name));
    }
    return m.groups[g].tensors[k];
  };
  if (m.tensor_size > 1) {
    // Every tensor rank's physical groups, in rank order (checkpoint/checkpoint.h); a replicated
    // tensor is read from tensor rank 0.
    std::size_t first = 0;
    for (int t = 0; t < m.tensor_size; ++t) {
      const models::TensorParallelLayout L = models::tensor_parallel_layout(model, m.tensor_size, t);
      if (m.groups.size() != L.groups.size() * static_cast<std::size_t>(m.tensor_size)) {
        throw FormatError(fmt::format("{}: {} param groups, but model '{}' over {} tensor ranks has {} per rank", m.path,
                                      m.groups.size(), model.name, m.tensor_size, L.groups.size()));
      }
      for (std::size_t g = 0; g < L.groups.size(); ++g, ++first) {
        for (std::size_t k = 0; k < L.groups[g].tensors.size(); ++k) {
          const CheckpointTensor& c = saved(first, k);
          const ParamTensorSpec& mine = L.groups[g].tensors[k];
          if (c.name != mine.name || c.shape != mine.shape) {
            throw FormatError(fmt::format("{}: tensor rank {}'s tensor '{}' {} is not model '{}''s '{}' {}", m.path, t,
                                          c.name, nlohmann::json(c.shape).dump(), model.name, mine.name,
                                          nlohmann::json(mine.shape).dump()));
          }
          if (t > 0 && L.slices[g][k].kind == models::SliceKind::Whole) continue;
          wholes_.at(mine.name).parts.push_back(Part{first, c.offset_elems, mine.elems(), L.slices[g][k]});
        }
      }
    }
  } else {
    // Whole tensors, or tiles of them ("W[r0:r1]", models/tiling.h).
    std::vector<ParamGroupSpec> groups;
    for (const CheckpointGroup& g : m.groups) {
      ParamGroupSpec spec{g.name, {}};
      for (const CheckpointTensor& t : g.tensors) spec.tensors.push_back(ParamTensorSpec{t.name, t.shape, model.dtype});
      groups.push_back(std::move(spec));
    }
    for (const models::WholeTensor& w : models::whole_tensors(model, groups)) {
      Whole& whole = wholes_.at(w.spec.name);
      const std::size_t row = w.row_bytes() / dtype_bytes(w.spec.dtype);
      for (const models::TensorPart& p : w.parts) {
        models::TensorSlice slice{models::SliceKind::Rows, {p.rows}};
        whole.parts.push_back(Part{p.group, m.groups[p.group].tensors[p.tensor].offset_elems,
                                   static_cast<std::size_t>(p.rows.rows()) * row, slice});
      }
    }
  }
  for (const ParamTensorSpec& t : order_) {
    if (wholes_.at(t.name).parts.empty()) {
      throw FormatError(fmt::format("{}: no group holds tensor '{}' of model '{}'", m.path, t.name, model.name));
    }
  }
}

std::vector<float> CheckpointTensors::read(CheckpointReader& reader, const std::string& name, int array) const {
  const Whole& whole = wholes_.at(name);
  std::vector<float> values(whole.spec.elems());
  std::vector<float> part;
  for (const Part& p : whole.parts) {
    part.resize(p.elems);
    reader.read(p.group, array, p.offset_elems, part);
    models::place_slice(whole.spec, p.slice, part, values);
  }
  return values;
}

TensorReslicer::TensorReslicer(const CheckpointManifest& manifest, const models::ModelConfig& model,
                               std::span<const ParamGroupSpec> groups, const models::TensorParallelLayout* tensor)
    : saved_(manifest, model), groups_(groups.begin(), groups.end()) {
  std::map<std::string, ParamTensorSpec> whole;
  for (const ParamTensorSpec& t : saved_.tensors()) whole.emplace(t.name, t);
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    std::vector<Cut> cuts;
    for (std::size_t k = 0; k < groups_[g].tensors.size(); ++k) {
      if (tensor != nullptr) {
        cuts.push_back(Cut{tensor->whole.at(g).tensors.at(k), tensor->slices.at(g).at(k)});
        continue;
      }
      const std::string& name = groups_[g].tensors[k].name;
      const std::optional<models::WholeTensorRows> tile = models::whole_tensor_of(name);
      const auto it = whole.find(tile ? tile->whole_name : name);
      if (it == whole.end()) {
        throw FormatError(fmt::format("{}: tensor '{}' of this run is not one of model '{}''s", manifest.path, name,
                                      model.name));
      }
      cuts.push_back(Cut{it->second, tile ? models::TensorSlice{models::SliceKind::Rows, {tile->rows}}
                                          : models::TensorSlice{}});
    }
    cuts_.push_back(std::move(cuts));
  }
}

void TensorReslicer::operator()(CheckpointReader& reader, std::size_t group, int array, std::size_t offset_elems,
                                std::span<float> out) {
  if (group != cached_group_) {
    flats_.clear();
    cached_group_ = group;
  }
  const auto a = static_cast<std::size_t>(array);
  if (flats_.size() <= a) flats_.resize(a + 1);
  std::vector<float>& flat = flats_[a];
  if (flat.empty()) {
    const GroupLayout layout(groups_.at(group), 1);  // tensor offsets do not depend on the shard count
    flat.assign(layout.total_elems(), 0.0f);
    for (std::size_t k = 0; k < cuts_[group].size(); ++k) {
      const Cut& cut = cuts_[group][k];
      const std::vector<float> whole = saved_.read(reader, cut.whole.name, array);
      const ParamTensorSpec& mine = groups_[group].tensors[k];
      cut_slice(cut.whole, cut.slice, whole,
                std::span<float>(flat.data() + layout.slots()[k].offset_elems, mine.elems()));
    }
  }
  // Elements past the flat buffer are the shards' padding: zero.
  std::fill(out.begin(), out.end(), 0.0f);
  if (offset_elems < flat.size()) {
    const std::size_t n = std::min(out.size(), flat.size() - offset_elems);
    std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(offset_elems), n, out.begin());
  }
}

}  // namespace strata::train
