// Tensor parallelism in the trainer (tools/trainer.cc): the checks of strata.parallel before any
// work (check_parallel_layout, declared in tools/trainer.h for estimate too) and the whole
// tensors of a tensor-parallel run, for --save-weights.
#pragma once

#include <vector>

#include "models/model_config.h"
#include "models/tensor_parallel.h"

namespace strata::tools {

// Each whole tensor of `model` (the physical groups' order of models::tensor_parallel_layout) from
// the tensor group's slices, `mine` being this rank's (collective over the group): rank r's slice
// of every tensor is broadcast from r and put in its place.
std::vector<std::vector<float>> gather_tensor_slices(const models::ModelConfig& model, const models::TensorParallel& tp,
                                                     const std::vector<std::vector<float>>& mine);

}  // namespace strata::tools
