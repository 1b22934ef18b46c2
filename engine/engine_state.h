// The shapes a checkpoint sees of the engine's state: ranges, pieces, the callbacks that move them
// and the counters beside them (engine/zero_engine.h has the calls, checkpoint/checkpoint.h the format).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "offload/io_engine.h"
#include "optim/loss_scaler.h"

namespace strata {

// What a checkpoint needs beside the state arrays (engine/zero_engine_state.cc).
struct EngineCounters {
  std::int64_t optimizer_steps = 0;                        // applied steps (the optimizer's counter)
  std::optional<optim::LossScaler::State> loss_scaler;    // fp16 only
};

// This rank's optimizer state range of one param group: elements [offset_elems, offset_elems +
// elems) of the group's flat padded buffer of total_elems (plan/partition.h).
struct StateRange {
  std::size_t offset_elems = 0;
  std::size_t elems = 0;
  std::size_t total_elems = 0;
};

// One piece of a rank's state as a checkpoint copies it: elements [begin_elems, begin_elems +
// elems) of the rank's state range of `group`, its state arrays back to back (master | moment1
// [| moment2], fp32) as the offload tiers keep a chunk (engine/offload_tier.h).
struct StateChunkInfo {
  std::size_t group = 0;
  std::size_t begin_elems = 0;
  std::size_t elems = 0;
};

// Pieces of device-resident state are at most this many elements.
inline constexpr std::size_t kStatePieceElems = std::size_t{1} << 20;

// Takes piece `index` as padded bytes and returns the handle of what it started with them.
using StateSink = std::function<offload::IoHandle(std::size_t index, std::span<const std::byte> padded)>;
// The same during a step (Note [Checkpoint capture] in engine/state_home_tiered_state.cc): `done` must be the I/O
// callback of the handle.
using StateCaptureSink =
    std::function<offload::IoHandle(std::size_t index, std::span<const std::byte> padded, offload::IoCallback done)>;
// Fills `values` with elements [begin_elems, ...) of state array `array` of `group`'s state range.
using StateSource =
    std::function<void(std::size_t group, int array, std::size_t begin_elems, std::span<float> values)>;

// What a checkpoint reads and writes of an engine's state (checkpoint/checkpoint.h; ZeroEngine::checkpoint
// hands it out, engine/zero_engine_state.cc implements it, Note [Checkpoint state] in engine/zero_engine_state.cc).
// Between steps only.
class EngineCheckpoint {
 public:
  // fp32 arrays per element: master, moment1 and (Adam/AdamW) moment2.
  virtual int state_arrays() const = 0;
  virtual StateRange state_range(std::size_t group) const = 0;
  // Whether this rank's state is the first copy of its shard (replica 0 of hybrid sharding; rank 0
  // at stage 0): the ranks a checkpoint needs data from.
  virtual bool holds_primary_state() const = 0;
  // The pieces export_state hands out, in order: the offload chunks where the optimizer is
  // offloaded, else pieces of at most kStatePieceElems; every group's state range is covered.
  virtual std::vector<StateChunkInfo> state_chunks() const = 0;
  // Hands piece i of state_chunks() to `sink` as bytes: 4 KiB-aligned, state_arrays() * 4 * elems
  // meaningful bytes padded with zeros to a multiple of 4 KiB. The sink starts whatever it does
  // with them (an O_DIRECT write) and returns its handle; the bytes stay valid and unchanged until
  // the handle completes. NVMe-resident chunks are read ahead through the optimizer's pinned pool
  // while earlier ones are handed out (Note [Checkpoint copy] in engine/zero_engine_state.cc).
  // Returns when every handle completed; rethrows the first error (a read, the sink, a handle)
  // after everything in flight finished.
  virtual void export_state(const StateSink& sink) = 0;
  // Arms the next step to hand each chunk's new state to `sink` the moment the optimizer wrote it
  // (Note [Checkpoint capture] in engine/state_home_tiered_state.cc): piece `index` of state_chunks(),
  // the bytes export_state would give after the step, and `done`, which the sink must pass as the
  // I/O callback of the handle it returns (the chunk's pinned slot is held until then). The sink
  // must not throw. Only where the optimizer is offloaded; returns false (nothing armed) otherwise
  // and for an empty sink, which disarms.
  // The step disarms it; captured_pieces() then says how many pieces were handed out: all of them,
  // or none when the step was skipped (non-finite gradients).
  virtual bool capture_next_step(StateCaptureSink sink) = 0;
  virtual std::size_t captured_pieces() const = 0;
  // The reverse: `source` fills each piece; then the working weights are derived from the new
  // master (the optimizer's rounding) on whichever tier they live. Every rank must call it.
  virtual void import_state(const StateSource& source) = 0;
  virtual EngineCounters counters() const = 0;
  virtual void restore_counters(const EngineCounters& counters) = 0;

 protected:
  ~EngineCheckpoint() = default;
};

}  // namespace strata
