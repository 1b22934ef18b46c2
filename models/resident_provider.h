// The "all resident" ParamProvider: every group's weights and gradients live in memory for the
// whole run (one flat allocation per group for weights and one for gradients, tensors 256-byte
// aligned inside it). acquire/release are bookkeeping only. It serves the tests and single-device
// runs until the ZeRO coordinator (engine/) implements the same interface with fetch and release.
//
// With a Device the memory is device memory (tags "param.resident", "grad.resident") and host
// access goes through copies on the given stream; without one it is host memory (the inline,
// plain in-memory run).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/host_buffer.h"
#include "plan/param_provider.h"

namespace strata::models {

class ResidentParamProvider final : public ParamProvider {
 public:
  // device may be null: host memory, streams must then be null too.
  ResidentParamProvider(std::vector<ParamGroupSpec> groups, Device* device);

  std::span<const ParamGroupSpec> groups() const override { return groups_; }
  GroupViews acquire_params(std::size_t group, ParamPhase phase, Stream* stream) override;
  void release_params(std::size_t group, Stream* stream) override;
  GroupViews acquire_grads(std::size_t group, Stream* stream) override;
  void grads_ready(std::size_t group, Stream* stream) override;

  // Zeroes every gradient (start of an optimizer step), enqueued on `stream`.
  void zero_grads(Stream* stream);

  // Host access by tensor name, through `stream` (synchronized before returning).
  void write_param(const std::string& name, const void* host_src, Stream* stream);
  void read_param(const std::string& name, void* host_dst, Stream* stream) const;
  void read_grad(const std::string& name, void* host_dst, Stream* stream) const;
  const ParamTensorSpec& tensor_spec(const std::string& name) const;
  std::vector<std::string> tensor_names() const;

  // GPT-2-style initialization: weights N(0, 0.02) (output projections 0.02/sqrt(2 n_layers)),
  // norm weights 1, biases 0; deterministic from `seed` (models/param_init.h, per tensor, the same
  // values the ZeRO engine initializes). n_layers scales the projections.
  void init_gpt2_style(std::uint64_t seed, std::int64_t n_layers, Stream* stream);

  // Times acquire_params was called per group (the tests check the model's fetch pattern).
  const std::vector<int>& acquire_counts() const { return acquire_counts_; }
  // Groups currently acquired (params) and not released.
  int live_groups() const { return live_; }

 private:
  struct Slot {
    std::size_t group, index, offset_bytes;
  };
  struct Region {
    DeviceMemory device;
    HostBuffer host;
    void* data() const { return device.empty() ? host.data() : device.data(); }
  };
  void* tensor_ptr(const std::vector<Region>& regions, const std::string& name) const;

  std::vector<ParamGroupSpec> groups_;
  Device* device_;
  std::vector<Region> weights_, grads_;
  std::vector<std::size_t> group_bytes_;
  std::map<std::string, Slot> slots_;
  std::vector<std::vector<std::size_t>> offsets_;
  std::vector<int> acquire_counts_;
  std::vector<bool> held_;
  int live_ = 0;
};

}  // namespace strata::models
