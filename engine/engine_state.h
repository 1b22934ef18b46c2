// The shapes a checkpoint sees of the engine's state: ranges, pieces, the callbacks that move them
// and the counters beside them (engine/zero_engine.h has the calls, checkpoint/checkpoint.h the format).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>

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
// The same during a step (Note [Checkpoint capture]): `done` must be the I/O callback of the handle.
using StateCaptureSink =
    std::function<offload::IoHandle(std::size_t index, std::span<const std::byte> padded, offload::IoCallback done)>;
// Fills `values` with elements [begin_elems, ...) of state array `array` of `group`'s state range.
using StateSource =
    std::function<void(std::size_t group, int array, std::size_t begin_elems, std::span<float> values)>;

}  // namespace strata
