// The all-resident param provider (see models/resident_provider.h).
#include "models/resident_provider.h"

#include <cstring>

#include <fmt/format.h>

#include "core/dtype_bulk.h"
#include "core/error.h"
#include "models/param_init.h"

namespace strata::models {

namespace {
constexpr std::size_t kTensorAlignBytes = 256;

void copy_in(Device* device, Stream* stream, void* dst, const void* src, std::size_t bytes) {
  if (device == nullptr) {
    std::memcpy(dst, src, bytes);
    return;
  }
  STRATA_CHECK(stream != nullptr, "device copies need a stream");
  stream->copy_h2d(dst, src, bytes);
  stream->synchronize();  // the host source may go away right after (init and load only, not a hot path)
}

void copy_out(Device* device, Stream* stream, void* dst, const void* src, std::size_t bytes) {
  if (device == nullptr) {
    std::memcpy(dst, src, bytes);
    return;
  }
  STRATA_CHECK(stream != nullptr, "device copies need a stream");
  stream->copy_d2h(dst, src, bytes);
  stream->synchronize();
}
}  // namespace

ResidentParamProvider::ResidentParamProvider(std::vector<ParamGroupSpec> groups, Device* device)
    : groups_(std::move(groups)), device_(device) {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    std::size_t offset = 0;
    std::vector<std::size_t> offs;
    for (std::size_t i = 0; i < groups_[g].tensors.size(); ++i) {
      const auto& t = groups_[g].tensors[i];
      STRATA_CHECK(!slots_.contains(t.name), "duplicate tensor name {}", t.name);
      slots_[t.name] = Slot{g, i, offset};
      offs.push_back(offset);
      offset += (t.bytes() + kTensorAlignBytes - 1) / kTensorAlignBytes * kTensorAlignBytes;
    }
    offsets_.push_back(std::move(offs));
    group_bytes_.push_back(offset);
    for (auto* regions : {&weights_, &grads_}) {
      Region r;
      if (device_ != nullptr) {
        r.device = device_->allocate(offset, regions == &weights_ ? "param.resident" : "grad.resident");
      } else {
        r.host = HostBuffer::allocate(offset);
      }
      regions->push_back(std::move(r));
    }
  }
  acquire_counts_.assign(groups_.size(), 0);
  held_.assign(groups_.size(), false);
}

GroupViews ResidentParamProvider::acquire_params(std::size_t group, ParamPhase, Stream*) {
  STRATA_CHECK(group < groups_.size(), "group {} out of range", group);
  ++acquire_counts_[group];
  if (!held_[group]) ++live_;
  held_[group] = true;
  GroupViews v;
  for (auto off : offsets_[group]) v.tensors.push_back(static_cast<char*>(weights_[group].data()) + off);
  return v;
}

void ResidentParamProvider::release_params(std::size_t group, Stream*) {
  STRATA_CHECK(group < groups_.size() && held_[group], "release of group {} that is not acquired", group);
  held_[group] = false;
  --live_;
}

GroupViews ResidentParamProvider::acquire_grads(std::size_t group, Stream*) {
  STRATA_CHECK(group < groups_.size(), "group {} out of range", group);
  GroupViews v;
  for (auto off : offsets_[group]) v.tensors.push_back(static_cast<char*>(grads_[group].data()) + off);
  return v;
}

void ResidentParamProvider::grads_ready(std::size_t group, Stream*) {
  STRATA_CHECK(group < groups_.size(), "group {} out of range", group);
}

void ResidentParamProvider::zero_grads(Stream* stream) {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (device_ == nullptr) {
      std::memset(grads_[g].data(), 0, group_bytes_[g]);
    } else {
      STRATA_CHECK(stream != nullptr, "zero_grads on a device needs a stream");
      stream->memset(grads_[g].data(), 0, group_bytes_[g]);
    }
  }
}

const ParamTensorSpec& ResidentParamProvider::tensor_spec(const std::string& name) const {
  auto it = slots_.find(name);
  if (it == slots_.end()) throw Error(fmt::format("no parameter tensor named '{}'", name));
  return groups_[it->second.group].tensors[it->second.index];
}

std::vector<std::string> ResidentParamProvider::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& g : groups_) {
    for (const auto& t : g.tensors) names.push_back(t.name);
  }
  return names;
}

void* ResidentParamProvider::tensor_ptr(const std::vector<Region>& regions, const std::string& name) const {
  auto it = slots_.find(name);
  if (it == slots_.end()) throw Error(fmt::format("no parameter tensor named '{}'", name));
  return static_cast<char*>(regions[it->second.group].data()) + it->second.offset_bytes;
}

void ResidentParamProvider::write_param(const std::string& name, const void* src, Stream* stream) {
  copy_in(device_, stream, tensor_ptr(weights_, name), src, tensor_spec(name).bytes());
}

void ResidentParamProvider::read_param(const std::string& name, void* dst, Stream* stream) const {
  copy_out(device_, stream, dst, tensor_ptr(weights_, name), tensor_spec(name).bytes());
}

void ResidentParamProvider::read_grad(const std::string& name, void* dst, Stream* stream) const {
  copy_out(device_, stream, dst, tensor_ptr(grads_, name), tensor_spec(name).bytes());
}

void ResidentParamProvider::init_gpt2_style(std::uint64_t seed, std::int64_t n_layers, Stream* stream) {
  for (const auto& g : groups_) {
    for (const auto& t : g.tensors) {
      std::vector<float> values(t.elems());
      init_tensor_gpt2_style(n_layers, t, seed, values);
      std::vector<std::uint8_t> host(t.bytes());
      convert(values.data(), DType::F32, host.data(), t.dtype, t.elems());
      write_param(t.name, host.data(), stream);
    }
  }
}

}  // namespace strata::models
