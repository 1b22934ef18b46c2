// Parameter fetching of the ZeRO engine: acquisitions of a group's working weights for compute,
// gathers of stage-3 shards (from the device or from the parameter tier), the prefetch trace, and
// the release or reuse of gathered copies (engine/zero_engine.h, "Prefetch"). It also owns the
// device allocations that may give back gathered copies when the device is full. Not part of the
// engine's interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/engine_context.h"

namespace strata {

class ParamTier;
class WorkingWeights;

class ParamFetcher {
 public:
  // `tier`: where the sharded W lives on the parameter tier (engine/state_home.h), else null.
  // `drain_host_work` waits for the state home's queued host work, which frees device memory as it
  // goes (allocate runs it before it gives up).
  ParamFetcher(EngineContext& ctx, WorkingWeights& weights, ParamTier* tier, std::function<void()> drain_host_work);

  // ParamProvider::acquire_params / release_params.
  GroupViews acquire(std::size_t g, ParamPhase phase, Stream* stream);
  void release(std::size_t g, Stream* stream);

  // Device memory for the engine's own buffers. When the device is full, a demand allocation first
  // gives back the gathered copies nobody holds (except `keep_group`'s), waits until every free
  // queued on a stream has run, and tries once more; a prefetch only waits for the queued frees
  // (Note [Deterministic prefetch], engine/param_fetcher.cc).
  DeviceMemory allocate(std::size_t bytes, std::string_view tag, std::size_t keep_group, bool prefetch = false);

  // Gathered copies hold old weights: free them (before an import).
  void drop_gathered();
  // End of a step: gathered copies freed, the trace kept or replaced, the next step's first
  // groups prefetched.
  void end_step();
  // Between steps, an evaluation's forward passes (validation): acquisitions are not recorded nor
  // matched against the trace, nothing is prefetched or kept past its release. end_evaluation
  // prefetches the next step's first groups again.
  void begin_evaluation();
  void end_evaluation();

  int live(std::size_t g) const { return groups_[g].live; }
  std::uint64_t gathers() const { return gathers_; }
  std::uint64_t prefetched() const { return prefetched_; }

 private:
  struct Group {
    DeviceMemory gathered;  // stage 3: the full W while gathered
    std::unique_ptr<Event> gathered_event;
    Stream* last_use_stream = nullptr;
    // Every stream that acquired the gathered copy since it was gathered: its free waits for each
    // (free_gathered), as PyTorch's record_stream.
    std::vector<Stream*> users;
    int live = 0;
  };
  struct TraceEntry {
    std::size_t group;
    ParamPhase phase;
  };

  void start_gather(std::size_t g, bool prefetch);
  void gather_from_tier(std::size_t g, DeviceMemory& gathered, bool prefetch);
  void prefetch_after(std::size_t position);
  void free_gathered(std::size_t g, Stream* stream);
  std::size_t total_elems(std::size_t g) const { return ctx_.group(g).layout.total_elems(); }

  EngineContext& ctx_;
  WorkingWeights& weights_;
  ParamTier* tier_;
  std::function<void()> drain_host_work_;
  std::vector<Group> groups_;

  std::vector<TraceEntry> trace_;
  std::vector<TraceEntry> recording_;
  bool trace_valid_ = false;
  bool evaluating_ = false;
  std::size_t trace_pos_ = 0;
  std::size_t live_elems_ = 0;
  std::uint64_t prefetched_ = 0;
  std::uint64_t gathers_ = 0;
};

}  // namespace strata
