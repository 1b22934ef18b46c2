// Partitioning: each param group is one flat buffer, padded so it splits evenly into shard_count
// aligned shards; rank r of a shard group owns shard r (docs/DESIGN.md, "Tiers").
//
// Tensor offsets inside the flat buffer are aligned to kTensorAlignElems (256 bytes of fp32, what
// vector loads and cuBLAS like); the flat size is padded to shard_count * kShardAlignElems, so
// every shard is a whole number of 4 KiB blocks in 16-bit and fp32 alike (what O_DIRECT NVMe I/O
// needs), and a whole number of the CPU optimizer's blocks (optim/cpu_exec.h, Note [Blocks] in optim/cpu_exec.h): the
// gradient norm is summed per block, and blocks that never straddle a shard boundary give the same
// partial sums whatever the world size (engine/zero_engine.h, Note [Exact gradient sums] in engine/zero_engine.h).
// Padding elements are zero and stay zero: their gradients are zero, so the optimizer leaves them at zero.
//
// Sharding factor F (hybrid sharding): ranks form world/F shard groups of F consecutive ranks;
// state is sharded within a group and replicated across groups. F = world is plain ZeRO.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "plan/param_provider.h"

namespace strata {

inline constexpr std::size_t kTensorAlignElems = 64;
inline constexpr std::size_t kShardAlignElems = 16384;

struct TensorSlot {
  std::size_t offset_elems = 0;
  std::size_t elems = 0;
};

class GroupLayout {
 public:
  GroupLayout(const ParamGroupSpec& spec, int shard_count);

  const std::string& name() const { return name_; }
  int shard_count() const { return shard_count_; }
  std::size_t payload_elems() const { return payload_elems_; }  // sum of the tensors' elements
  std::size_t total_elems() const { return total_elems_; }      // padded flat size
  std::size_t shard_elems() const { return total_elems_ / static_cast<std::size_t>(shard_count_); }
  std::size_t shard_begin(int shard) const { return static_cast<std::size_t>(shard) * shard_elems(); }
  const std::vector<TensorSlot>& slots() const { return slots_; }

 private:
  std::string name_;
  int shard_count_;
  std::size_t payload_elems_ = 0;
  std::size_t total_elems_ = 0;
  std::vector<TensorSlot> slots_;
};

// Where this rank sits for hybrid sharding.
struct ShardTopology {
  int world_size = 1;
  int rank = 0;
  int sharding_factor = 1;  // F: ranks per shard group
  int shard_index() const { return rank % sharding_factor; }     // which shard this rank owns
  int shard_group() const { return rank / sharding_factor; }     // which replica this rank is in
  int replica_count() const { return world_size / sharding_factor; }
};

// Validates F against the world (F divides world; 0 means world) and the stage (stage 0 keeps
// everything replicated: F = 1). Throws ConfigError naming zero_optimization.mics_shard_size.
ShardTopology make_shard_topology(int world_size, int rank, int stage, int requested_factor);

}  // namespace strata
