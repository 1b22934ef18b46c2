// The whole tensors of a checkpoint, whichever way its run cut them (tiles, models/tiling.h; tensor
// ranks, models/tensor_parallel.h; or neither), and the state of another cut made from them: what
// `strata ckpt export` writes and what a resume across a change of tensor ranks loads
// (load_checkpoint_resliced in checkpoint/checkpoint.h).
#pragma once

#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "models/model_config.h"
#include "models/tensor_parallel.h"

namespace strata::train {

class CheckpointTensors {
 public:
  // FormatError naming the manifest when its groups are not `model`'s (cut into tiles or tensor
  // ranks, or whole).
  CheckpointTensors(const CheckpointManifest& manifest, const models::ModelConfig& model);

  // The whole tensors in the untiled declaration order (models/decoder_params.h).
  const std::vector<ParamTensorSpec>& tensors() const { return order_; }
  // State array `array` (0: master, then the moments) of whole tensor `name`, fp32.
  std::vector<float> read(CheckpointReader& reader, const std::string& name, int array) const;

 private:
  struct Part {
    std::size_t group = 0;         // in the checkpoint
    std::size_t offset_elems = 0;  // in the group's flat buffer
    std::size_t elems = 0;
    models::TensorSlice slice;  // where its elements go in the whole tensor
  };
  struct Whole {
    ParamTensorSpec spec;
    std::vector<Part> parts;
  };
  std::vector<ParamTensorSpec> order_;
  std::map<std::string, Whole> wholes_;
};

// A CheckpointReslicer (checkpoint/checkpoint.h) for an engine holding `groups`, which are `model`'s
// cut by `tensor` (the tensor parallel layout of this rank: null without tensor parallelism, where
// tile tensors are recognised by name). Checks on construction that the checkpoint holds every
// whole tensor the groups are cut from, so every rank refuses alike before any collective.
class TensorReslicer {
 public:
  TensorReslicer(const CheckpointManifest& manifest, const models::ModelConfig& model,
                 std::span<const ParamGroupSpec> groups, const models::TensorParallelLayout* tensor);
  void operator()(CheckpointReader& reader, std::size_t group, int array, std::size_t offset_elems,
                  std::span<float> out);

 private:
  struct Cut {
    ParamTensorSpec whole;
    models::TensorSlice slice;
  };
  CheckpointTensors saved_;
  std::vector<ParamGroupSpec> groups_;
  std::vector<std::vector<Cut>> cuts_;  // [group][tensor]
  // The cached group's flat buffers, one per state array read so far: an import asks for a group's
  // chunks one after another, each for every array, so each array is built once per group.
  std::size_t cached_group_ = static_cast<std::size_t>(-1);
  std::vector<std::vector<float>> flats_;
};

}  // namespace strata::train
