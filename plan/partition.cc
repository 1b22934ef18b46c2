// Partitioning of param groups into flat, padded, sharded buffers (see plan/partition.h).
#include "plan/partition.h"

#include <fmt/format.h>

#include "core/error.h"

namespace strata {
namespace {
std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }
}  // namespace

GroupLayout::GroupLayout(const ParamGroupSpec& spec, int shard_count) : name_(spec.name), shard_count_(shard_count) {
  STRATA_CHECK(shard_count >= 1, "group {}: shard count {}", spec.name, shard_count);
  std::size_t offset = 0;
  for (const auto& t : spec.tensors) {
    offset = round_up(offset, kTensorAlignElems);
    slots_.push_back(TensorSlot{offset, t.elems()});
    offset += t.elems();
    payload_elems_ += t.elems();
  }
  const std::size_t unit = kShardAlignElems * static_cast<std::size_t>(shard_count);
  total_elems_ = std::max(unit, round_up(offset, unit));
}

ShardTopology make_shard_topology(int world_size, int rank, int stage, int requested_factor) {
  STRATA_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "rank {} of {}", rank, world_size);
  ShardTopology t;
  t.world_size = world_size;
  t.rank = rank;
  if (stage == 0) {
    t.sharding_factor = 1;
    return t;
  }
  const int factor = requested_factor == 0 ? world_size : requested_factor;
  if (factor < 1 || factor > world_size || world_size % factor != 0) {
    throw ConfigError(fmt::format("zero_optimization.mics_shard_size = {} must divide the world size {} (use 0 to "
                                  "shard over all ranks)",
                                  requested_factor, world_size));
  }
  t.sharding_factor = factor;
  return t;
}

}  // namespace strata
