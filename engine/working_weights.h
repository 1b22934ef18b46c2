// The working weights W a rank keeps on the device, in the form the run plan says
// (plan/run_plan.h, WeightsForm): a resident full copy, this rank's shard (stage 3), or the fp32
// master itself. Stage-3 shards on the parameter tier are the state home's (engine/state_home.h);
// gathered copies are the fetcher's (engine/param_fetcher.h). Not part of the engine's interface.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "engine/engine_context.h"

namespace strata {

class WorkingWeights {
 public:
  explicit WorkingWeights(EngineContext& ctx);

  // Allocates group g's W and fills it from `w_source` (the whole group, host, working dtype);
  // `master` is the device-resident fp32 master where the form aliases it.
  void init_group(std::size_t g, const void* w_source, float* master);

  // Not sharded: the full W (the master itself for WeightsForm::FullIsMaster).
  void* full(std::size_t g) const;
  // Sharded, on the device: this rank's shard (the master itself for WeightsForm::ShardIsMaster);
  // null where the shard lives on the parameter tier.
  const void* shard(std::size_t g) const;
  // The separate device copy of W over g's state range, which the optimizer's low-precision output
  // and a checkpoint import write: null where W is the master or lives on a tier.
  void* state_range(std::size_t g) const;

  // New master values are in place (after an applied step, or an import): groups that keep a full
  // W gather every shard's new values into it on the communication stream (`from_master`: fp32
  // values still in a device-resident master; else in state_range), and later acquisitions wait
  // for that (wait_published).
  void publish(bool from_master);
  void wait_published(Stream& stream) const;

 private:
  struct Group {
    DeviceMemory full;   // empty: aliases the master, or sharded
    DeviceMemory shard;  // empty: aliases the master, on the tier, or not sharded
    void* master = nullptr;
  };
  EngineContext& ctx_;
  std::vector<Group> groups_;
  std::unique_ptr<Event> published_;
  bool published_recorded_ = false;
};

}  // namespace strata
