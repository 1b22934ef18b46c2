// Tensor and pipeline parallelism in the trainer (tools/trainer.cc): the checks of strata.parallel
// before any work (check_parallel_layout, declared in tools/trainer.h for estimate too) and the
// whole tensors of a tensor- or pipeline-parallel run, for --save-weights.
#pragma once

#include <span>
#include <vector>

#include "engine/param_provider.h"
#include "models/model_config.h"
#include "models/tensor_parallel.h"

namespace strata {
class Communicator;
}

namespace strata::tools {

// Each whole tensor of `model` (the physical groups' order of models::tensor_parallel_layout) from
// the tensor group's slices, `mine` being this rank's (collective over the group): rank r's slice
// of every tensor is broadcast from r and put in its place.
// `groups` are the physical groups this rank holds (a pipeline stage's; every group without one),
// and the result covers those groups only.
std::vector<std::vector<float>> gather_tensor_slices(const models::ModelConfig& model, const models::TensorParallel& tp,
                                                     std::span<const std::size_t> groups,
                                                     const std::vector<std::vector<float>>& mine);

// Every group's tensors on every rank of the pipeline group, in `all_groups` order, from each
// stage's: `mine` holds the tensors of this stage's groups `mine_groups` (ascending indices into
// `all_groups`), tensor by tensor (collective over the group).
std::vector<std::vector<float>> gather_pipeline_stages(Communicator& pipe, std::span<const ParamGroupSpec> all_groups,
                                                       std::span<const std::size_t> mine_groups,
                                                       const std::vector<std::vector<float>>& mine);

}  // namespace strata::tools
