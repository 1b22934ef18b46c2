// The data x tensor x pipeline layout of a world of ranks (plan/parallel_layout.h).
#include "plan/parallel_layout.h"

#include <fmt/format.h>

#include "core/error.h"

namespace strata {

namespace {

// The factorizations of `world` into T x P with a whole D, for the message.
std::string valid_choices(int world) {
  std::string out;
  for (int t = 1; t <= world; ++t) {
    if (world % t != 0) continue;
    for (int p = 1; p <= world / t; ++p) {
      if ((world / t) % p != 0) continue;
      out += fmt::format("{}(tensor {}, pipeline {})", out.empty() ? "" : ", ", t, p);
    }
  }
  return out;
}

}  // namespace

ParallelLayout::ParallelLayout(const ParallelConfig& config, int world_size, const std::string& source)
    : world_(world_size), tensor_(config.tensor), pipeline_(config.pipeline) {
  STRATA_CHECK(world_size >= 1 && config.tensor >= 1 && config.pipeline >= 1, "parallel layout of {} ranks, T {}, P {}",
               world_size, config.tensor, config.pipeline);
  const int slice = tensor_ * pipeline_;
  if (world_size % slice != 0) {
    throw ConfigError(fmt::format(
        "{}: strata.parallel.tensor {} x strata.parallel.pipeline {} = {} ranks per model replica does not divide the "
        "world of {} ranks (world = data x tensor x pipeline); valid choices for {} ranks: {}",
        source, tensor_, pipeline_, slice, world_size, world_size, valid_choices(world_size)));
  }
  data_ = world_size / slice;
}

RankCoords ParallelLayout::coords(int rank) const {
  STRATA_CHECK(rank >= 0 && rank < world_, "rank {} of a world of {}", rank, world_);
  return RankCoords{rank / (tensor_ * pipeline_), rank % tensor_, (rank / tensor_) % pipeline_};
}

int ParallelLayout::rank_of(const RankCoords& c) const {
  STRATA_CHECK(c.data >= 0 && c.data < data_ && c.tensor >= 0 && c.tensor < tensor_ && c.pipeline >= 0 &&
                   c.pipeline < pipeline_,
               "coordinates (data {}, tensor {}, pipeline {}) outside {}", c.data, c.tensor, c.pipeline, describe());
  return c.tensor + tensor_ * (c.pipeline + pipeline_ * c.data);
}

std::vector<int> ParallelLayout::tensor_group(int rank) const {
  RankCoords c = coords(rank);
  std::vector<int> out;
  for (c.tensor = 0; c.tensor < tensor_; ++c.tensor) out.push_back(rank_of(c));
  return out;
}

std::vector<int> ParallelLayout::pipeline_group(int rank) const {
  RankCoords c = coords(rank);
  std::vector<int> out;
  for (c.pipeline = 0; c.pipeline < pipeline_; ++c.pipeline) out.push_back(rank_of(c));
  return out;
}

std::vector<int> ParallelLayout::data_group(int rank) const {
  RankCoords c = coords(rank);
  std::vector<int> out;
  for (c.data = 0; c.data < data_; ++c.data) out.push_back(rank_of(c));
  return out;
}

std::string ParallelLayout::describe() const {
  return fmt::format("world {} = data {} x tensor {} x pipeline {}", world_, data_, tensor_, pipeline_);
}

}  // namespace strata
