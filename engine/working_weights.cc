// The resident working weights of the ZeRO engine (engine/working_weights.h).
#include "engine/working_weights.h"

#include "core/error.h"
#include "plan/part_bytes.h"

namespace strata {

WorkingWeights::WorkingWeights(EngineContext& ctx)
    : ctx_(ctx), groups_(ctx.group_count()), published_(ctx.device.create_event()) {}

void WorkingWeights::init_group(std::size_t g, const void* w_source, float* master) {
  const GroupPlan& P = ctx_.group(g);
  const GroupLayout& L = P.layout;
  const std::size_t wbytes = ctx_.wbytes();
  Group& G = groups_[g];
  G.master = master;
  // The bytes are the plan's: see Note [Part bytes] in plan/part_bytes.h.
  const std::uint64_t resident = resident_weight_bytes(ctx_.plan, g);
  switch (P.weights) {
    case WeightsForm::Shard:
      G.shard = ctx_.device.allocate(resident, "param.w");
      ctx_.comm.copy_h2d(G.shard.data(),
                         static_cast<const char*>(w_source) + L.shard_begin(ctx_.plan.shard_index) * wbytes,
                         resident);
      break;
    case WeightsForm::Full:
      G.full = ctx_.device.allocate(resident, "param.w");
      ctx_.comm.copy_h2d(G.full.data(), w_source, resident);
      break;
    case WeightsForm::FullIsMaster:
    case WeightsForm::ShardIsMaster:
      STRATA_CHECK(master != nullptr, "group {}: W aliases a master that is not on the device", L.name());
      break;
    case WeightsForm::ShardOnTier:  // the state home put it on the parameter tier
      break;
  }
}

void* WorkingWeights::full(std::size_t g) const {
  const Group& G = groups_[g];
  return ctx_.group(g).weights == WeightsForm::FullIsMaster ? G.master : G.full.data();
}

const void* WorkingWeights::shard(std::size_t g) const {
  const Group& G = groups_[g];
  return ctx_.group(g).weights == WeightsForm::ShardIsMaster ? G.master : G.shard.data();
}

void* WorkingWeights::state_range(std::size_t g) const {
  const Group& G = groups_[g];
  const GroupPlan& P = ctx_.group(g);
  if (P.sharded_params) return G.shard.data();
  if (G.full.empty()) return nullptr;
  return G.full.as<char>() + P.state_offset * ctx_.wbytes();
}

void WorkingWeights::publish(bool from_master) {
  const std::size_t wbytes = ctx_.wbytes();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const GroupPlan& P = ctx_.group(g);
    Group& G = groups_[g];
    if (P.sharded_params || ctx_.plan.stage == 0 || G.full.empty()) continue;
    const void* mine = from_master && ctx_.working() == DType::F32 && G.master != nullptr
                           ? static_cast<const void*>(G.master)
                           : state_range(g);
    if (P.layout.shard_count() == 1) {
      if (mine != G.full.data()) ctx_.comm.copy_d2d(G.full.data(), mine, P.state_elems * wbytes);
    } else {
      ctx_.shard_comm.all_gather(mine, G.full.data(), P.layout.shard_elems(), ctx_.working(), ctx_.comm);
    }
  }
  ctx_.comm.record(*published_);
  published_recorded_ = true;
}

void WorkingWeights::wait_published(Stream& stream) const {
  if (published_recorded_) stream.wait(*published_);
}

}  // namespace strata
