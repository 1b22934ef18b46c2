// Parameter fetching of the ZeRO engine (engine/param_fetcher.h).
#include "engine/param_fetcher.h"

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "engine/state_home.h"
#include "engine/working_weights.h"
#include "plan/part_bytes.h"

namespace strata {

ParamFetcher::ParamFetcher(EngineContext& ctx, WorkingWeights& weights, ParamTier* tier,
                           std::function<void()> drain_host_work)
    : ctx_(ctx),
      weights_(weights),
      tier_(tier),
      drain_host_work_(std::move(drain_host_work)),
      groups_(ctx.group_count()) {
  for (Group& G : groups_) G.gathered_event = ctx_.device.create_event();
}

GroupViews ParamFetcher::acquire(std::size_t g, ParamPhase phase, Stream* stream) {
  STRATA_CHECK(stream != nullptr, "the ZeRO engine needs a compute stream (group {})", g);
  STRATA_CHECK(g < groups_.size(), "param group {} of {}", g, groups_.size());
  Group& G = groups_[g];
  const GroupPlan& P = ctx_.group(g);
  if (!evaluating_) recording_.push_back(TraceEntry{g, phase});
  if (trace_valid_ && !evaluating_) {
    if (trace_pos_ < trace_.size() && trace_[trace_pos_].group == g && trace_[trace_pos_].phase == phase) {
      ++trace_pos_;
    } else {
      spdlog::debug("prefetch trace: acquisition {} is group {} but the trace says otherwise; re-recording",
                    recording_.size() - 1, g);
      trace_valid_ = false;
    }
  }
  if (!P.sharded_params) {
    weights_.wait_published(*stream);
    ++G.live;
    return views_of(P.layout, weights_.full(g), ctx_.working());
  }
  if (G.gathered.empty()) start_gather(g, /*prefetch=*/false);
  stream->wait(*G.gathered_event);
  ++G.live;
  G.last_use_stream = stream;
  if (std::find(G.users.begin(), G.users.end(), stream) == G.users.end()) G.users.push_back(stream);
  if (trace_valid_ && !evaluating_) prefetch_after(trace_pos_);
  return views_of(P.layout, G.gathered.data(), ctx_.working());
}

void ParamFetcher::release(std::size_t g, Stream* stream) {
  STRATA_CHECK(g < groups_.size(), "param group {} of {}", g, groups_.size());
  Group& G = groups_[g];
  const GroupPlan& P = ctx_.group(g);
  STRATA_CHECK(G.live > 0, "release of group {} ({}) that is not acquired", g, P.layout.name());
  if (--G.live > 0 || !P.sharded_params) return;
  G.last_use_stream = stream;
  // Keep the gathered weights when the trace says the group is needed again inside the window.
  if (trace_valid_ && !evaluating_) {
    std::size_t window = 0;
    for (std::size_t i = trace_pos_; i < trace_.size(); ++i) {
      if (trace_[i].group == g) return;
      window += total_elems(trace_[i].group);
      if (window > ctx_.config.zero.prefetch_bucket_size_elems) break;
    }
  }
  free_gathered(g, stream);
}

// The free goes on `stream` after every other stream that used the copy has passed its last use:
// an event on each, which `stream` waits for (stream order only; no host wait).
void ParamFetcher::free_gathered(std::size_t g, Stream* stream) {
  Group& G = groups_[g];
  live_elems_ -= total_elems(g);
  for (Stream* user : G.users) {
    if (user == stream) continue;
    std::unique_ptr<Event> used = ctx_.device.create_event();
    user->record(*used);
    stream->wait(*used);
  }
  G.users.clear();
  stream->release_after(std::move(G.gathered));
}

// Note [Deterministic prefetch]: every rank must issue the same gathers (collectives) in the same
// order, so no decision may depend on timing: a pinned slot is waited for (the comm stream frees
// slots on its own), and an allocation that finds the device full first lets every queued free run
// (after which the memory state is the same on every rank) before a prefetch gives up or a demand
// fetch evicts gathered copies (ParamFetcher::allocate).
void ParamFetcher::start_gather(std::size_t g, bool prefetch) {
  Group& G = groups_[g];
  const GroupPlan& P = ctx_.group(g);
  const std::size_t total = P.layout.total_elems();
  DeviceMemory gathered;
  if (tier_ != nullptr) {
    gather_from_tier(g, gathered, prefetch);
  } else {
    gathered = allocate(gathered_bytes(ctx_.plan, g), "param.gathered", g, prefetch);
    if (P.layout.shard_count() == 1) {
      ctx_.comm.copy_d2d(gathered.data(), weights_.shard(g), gathered.size_bytes());
    } else {
      ctx_.shard_comm.all_gather(weights_.shard(g), gathered.data(), P.layout.shard_elems(), ctx_.working(), ctx_.comm);
    }
  }
  G.gathered = std::move(gathered);
  live_elems_ += total;
  ctx_.comm.record(*G.gathered_event);
  ++gathers_;
}

// The shard comes from the parameter tier (through a pinned slot where it is on NVMe, taken
// first), lands on the device (in the gathered copy itself where there is one shard) and is
// all-gathered from there. The sizes are the plan's (see Note [Part bytes] in plan/part_bytes.h).
void ParamFetcher::gather_from_tier(std::size_t g, DeviceMemory& gathered, bool prefetch) {
  const GroupPlan& P = ctx_.group(g);
  std::shared_ptr<offload::BufferLease> slot = tier_->reserve_param_slot(g);
  gathered = allocate(gathered_bytes(ctx_.plan, g), "param.gathered", g, prefetch);
  DeviceMemory shard;
  void* dst = gathered.data();
  if (const std::uint64_t shard_bytes = fetched_shard_bytes(ctx_.plan, g); shard_bytes > 0) {
    shard = allocate(shard_bytes, "param.shard", g, prefetch);
    dst = shard.data();
  }
  tier_->upload_params(g, dst, std::move(slot));
  if (!shard.empty()) {
    ctx_.shard_comm.all_gather(dst, gathered.data(), P.layout.shard_elems(), ctx_.working(), ctx_.comm);
    ctx_.comm.release_after(std::move(shard));
  }
}

DeviceMemory ParamFetcher::allocate(std::size_t bytes, std::string_view tag, std::size_t keep_group, bool prefetch) {
  try {
    return ctx_.device.allocate(bytes, tag);
  } catch (const OutOfMemoryError&) {
  }
  std::vector<Stream*> streams = {&ctx_.comm};
  for (const Group& H : groups_) {
    Stream* used = H.last_use_stream;
    if (used != nullptr && std::find(streams.begin(), streams.end(), used) == streams.end()) streams.push_back(used);
  }
  // See Note [Deterministic prefetch] in engine/param_fetcher.cc.
  // Whether the first try failed depends on which queued frees had
  // run; once they all ran the memory state is the same on every rank, so the decisions below (a
  // prefetch gives up, a demand fetch evicts gathered copies that must be gathered again later,
  // which is a collective) are the same on every rank. The home's host work frees reduced
  // gradients as it goes: it is drained first.
  drain_host_work_();
  for (Stream* s : streams) s->synchronize();
  if (prefetch) return ctx_.device.allocate(bytes, tag);  // evict nothing
  try {
    return ctx_.device.allocate(bytes, tag);
  } catch (const OutOfMemoryError&) {
  }
  for (std::size_t h = 0; h < groups_.size(); ++h) {
    Group& H = groups_[h];
    if (h == keep_group || H.live > 0 || H.gathered.empty()) continue;
    free_gathered(h, H.last_use_stream != nullptr ? H.last_use_stream : &ctx_.comm);
  }
  drain_host_work_();
  for (Stream* s : streams) s->synchronize();
  return ctx_.device.allocate(bytes, tag);
}

void ParamFetcher::prefetch_after(std::size_t position) {
  std::size_t ahead = 0;
  for (std::size_t i = position; i < trace_.size(); ++i) {
    const std::size_t g = trace_[i].group;
    if (!ctx_.group(g).sharded_params || !groups_[g].gathered.empty()) continue;
    const std::size_t total = total_elems(g);
    if (ahead + total > ctx_.config.zero.prefetch_bucket_size_elems ||
        live_elems_ + total > ctx_.config.zero.max_live_parameters_elems) {
      break;
    }
    try {
      start_gather(g, /*prefetch=*/true);
    } catch (const OutOfMemoryError&) {
      break;  // prefetch is an optimization: the demand fetch will try again when it is needed
    }
    ahead += total;
    ++prefetched_;
  }
}

void ParamFetcher::drop_gathered() {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (!groups_[g].gathered.empty()) free_gathered(g, &ctx_.comm);
  }
}

void ParamFetcher::end_step() {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    Group& G = groups_[g];
    if (G.gathered.empty()) continue;
    STRATA_CHECK(G.live == 0, "step() while group {} is still acquired", ctx_.group(g).layout.name());
    free_gathered(g, G.last_use_stream != nullptr ? G.last_use_stream : &ctx_.comm);
  }
  if (!trace_valid_ || trace_pos_ != trace_.size() || recording_.size() != trace_.size()) {
    if (!trace_.empty()) spdlog::debug("prefetch trace replaced: {} acquisitions", recording_.size());
    trace_ = recording_;
  }
  recording_.clear();
  trace_valid_ = true;
  trace_pos_ = 0;
  // Start fetching the next step's first groups now (their weights are final): with parameters on
  // NVMe this hides the first reads behind the caller's work between steps.
  prefetch_after(0);
}

void ParamFetcher::begin_evaluation() {
  STRATA_CHECK(recording_.empty() && !evaluating_, "an evaluation begins between steps ({} acquisitions recorded)",
               recording_.size());
  evaluating_ = true;
}

void ParamFetcher::end_evaluation() {
  STRATA_CHECK(evaluating_, "end_evaluation() without begin_evaluation()");
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    STRATA_CHECK(groups_[g].live == 0, "end_evaluation() while group {} is still acquired", ctx_.group(g).layout.name());
  }
  evaluating_ = false;
  trace_pos_ = 0;
  if (trace_valid_) prefetch_after(0);
}

}  // namespace strata
