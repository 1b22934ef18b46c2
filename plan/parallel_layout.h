// How a world of ranks splits into data x tensor x pipeline parallel groups (3D parallelism,
// Megatron-Turing NLG's layout): world = D x T x P, with the most tightly coupled axis on neighbouring
// ranks. A tensor group (the T ranks that split each layer and all-reduce inside every layer) is T
// consecutive ranks; a pipeline group (the P stages that pass activations point to point) strides by
// T; a data group (the D replicas that reduce gradients once per step, and shard ZeRO state) strides
// by T x P. So rank = t + T * (p + P * d).
//
// This file is the layout only. Tensor parallelism is models/tensor_parallel.h and pipeline
// parallelism models/pipeline.h; the trainer splits the world communicator into tensor, pipeline
// and data groups by these coordinates.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace strata {

struct RankCoords {
  int data = 0;
  int tensor = 0;
  int pipeline = 0;
  bool operator==(const RankCoords&) const = default;
};

class ParallelLayout {
 public:
  // Throws ConfigError (naming `source`, the keys and the valid choices) when T x P does not divide
  // the world.
  ParallelLayout(const ParallelConfig& config, int world_size, const std::string& source);

  int world() const { return world_; }
  int data() const { return data_; }
  int tensor() const { return tensor_; }
  int pipeline() const { return pipeline_; }

  RankCoords coords(int rank) const;
  int rank_of(const RankCoords& c) const;
  // The ranks of `rank`'s group along one axis, in the axis's order (rank's own included).
  std::vector<int> tensor_group(int rank) const;
  std::vector<int> pipeline_group(int rank) const;
  std::vector<int> data_group(int rank) const;
  std::string describe() const;  // "world 8 = data 2 x tensor 2 x pipeline 2"

 private:
  int world_ = 1, data_ = 1, tensor_ = 1, pipeline_ = 1;
};

}  // namespace strata
