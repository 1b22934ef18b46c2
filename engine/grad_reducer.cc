// Gradient reduction of the ZeRO engine (engine/grad_reducer.h).
#include "engine/grad_reducer.h"

#include <fmt/format.h>

#include "core/error.h"
#include "engine/param_fetcher.h"
#include "engine/state_home.h"
#include "plan/part_bytes.h"

namespace strata {

GradReducer::GradReducer(EngineContext& ctx, std::span<const ParamGroupSpec> specs, ParamFetcher& memory,
                         GradientSink& sink)
    : ctx_(ctx), memory_(memory), sink_(sink), groups_(ctx.group_count()) {
  for (Group& G : groups_) G.grad_event = ctx_.device.create_event();
  step_done_ = ctx_.device.create_event();
  ready_per_micro_.assign(specs.size(), 0);
  declared_ready_ = !specs.empty();
  for (std::size_t g = 0; g < specs.size(); ++g) {
    ready_per_micro_[g] = specs[g].grads_ready_calls;
    declared_ready_ = declared_ready_ && specs[g].grads_ready_calls > 0;
  }
}

void GradReducer::begin_micro_batch() {
  STRATA_CHECK(micro_index_ < 0, "begin_micro_batch twice without end_micro_batch");
  micro_index_ = groups_.empty() ? 0 : groups_.front().units;
  STRATA_CHECK(micro_index_ < ctx_.accumulation(), "micro-batch {} of a step of {} (call step())", micro_index_ + 1,
               ctx_.accumulation());
}

// Note [Reductions in flight]: without gradients in place, every group's micro-batch buffer is
// allocated when the host enqueues that group's backward, and freed on the communication stream
// once its reduction (and the state home's add) ran. The host runs ahead of the device, so without
// a bound every group's buffer of a micro-batch was alive at once where there was room (tiny at
// accumulation 4: a peak 0.75 MiB over the plan). So at most kReductionsInFlight (run_plan.h)
// reductions stay queued: before allocating the next buffer the host waits for the oldest. With 2,
// one group's reduction overlaps the next group's backward, as before. The plan's total counts one
// group's gradient buffers: on a device sized to it, the next allocation waits for the queued
// reduction's free (the allocator's retry, ParamFetcher::allocate), so two fit only where there is
// room; TierPlan::device_in_flight is the most the second can add (tier_plan.cc). The wait blocks
// the host only, while the compute stream still holds the backward enqueued before it; every rank
// enqueues the same reductions in the same order, so no rank waits for work another has not
// enqueued. The step simulator waits the same way (sim/step_sim.cc).

void GradReducer::bound_in_flight() {
  while (!in_flight_.empty() && in_flight_.front()->query()) {
    spare_events_.push_back(std::move(in_flight_.front()));
    in_flight_.pop_front();
  }
  while (in_flight_.size() >= kReductionsInFlight) {
    in_flight_.front()->synchronize();
    ++in_flight_waits_;
    spare_events_.push_back(std::move(in_flight_.front()));
    in_flight_.pop_front();
  }
}

// Note [Gradients in place]: with one micro-batch per step and a reduction that changes nothing (one
// rank holds the whole group), and the step's gradient on the device (RunPlan::gradients_in_place),
// the model's backward writes the group's gradient straight into the state home's buffer for the
// step's gradient (GradientSink::reduction_target; the device home keeps it across steps, Note
// [Gradient buffers kept across steps]) and the reduction is a no-op: no per-micro-batch buffer and
// no copy. Otherwise each group's backward gets a micro-batch buffer (Note [Reductions in flight]).
// Which case a group is in, and what each buffer takes, is the plan's (see Note [Part bytes] in
// plan/part_bytes.h): grads_in_place, micro_grad_bytes, reduction_in_home, reduced_grad_bytes.
void* GradReducer::in_place_target(std::size_t g) {
  if (!grads_in_place(ctx_.plan, g)) return nullptr;
  return sink_.reduction_target(g);
}

GroupViews GradReducer::acquire(std::size_t g, Stream* stream) {
  STRATA_CHECK(stream != nullptr, "the ZeRO engine needs a compute stream (group {})", g);
  STRATA_CHECK(micro_index_ >= 0, "acquire_grads outside begin_micro_batch/end_micro_batch");
  STRATA_CHECK(g < groups_.size(), "param group {} of {}", g, groups_.size());
  Group& G = groups_[g];
  const GroupLayout& L = ctx_.group(g).layout;
  STRATA_CHECK(!G.reduced_this_micro, "group {} ({}) gradients acquired after they were reduced", g, L.name());
  if (G.micro_grad.empty() && G.in_place == nullptr) {
    if (void* target = in_place_target(g)) {
      if (step_done_recorded_) stream->wait(*step_done_);
      G.in_place = target;
      stream->memset(target, 0, unit_grad_bytes(ctx_.plan, g));
    } else {
      bound_in_flight();
      G.micro_grad = memory_.allocate(micro_grad_bytes(ctx_.plan, g), "grad.micro", g);
      stream->memset(G.micro_grad.data(), 0, G.micro_grad.size_bytes());
    }
  }
  return views_of(L, G.in_place != nullptr ? G.in_place : G.micro_grad.data(), ctx_.working());
}

void GradReducer::ready(std::size_t g, Stream* stream) {
  STRATA_CHECK(g < groups_.size(), "param group {} of {}", g, groups_.size());
  Group& G = groups_[g];
  ++G.ready_count;
  stream->record(*G.grad_event);
  if ((declared_ready_ || !first_micro_batch_ever_) && G.ready_count == ready_per_micro_[g]) reduce(g);
}

void GradReducer::reduce(std::size_t g) {
  Group& G = groups_[g];
  const GroupPlan& P = ctx_.group(g);
  const GroupLayout& L = P.layout;
  const DType dtype = ctx_.working();
  Stream& comm = ctx_.comm;
  if (G.in_place != nullptr || (G.micro_grad.empty() && in_place_target(g) != nullptr)) {
    // See Note [Gradients in place] in engine/grad_reducer.cc.
    // Nothing to reduce.
    if (G.in_place != nullptr) {
      comm.wait(*G.grad_event);  // the backward's writes
    } else {
      // No gradient this micro-batch: the group's gradient is zero (the comm stream already runs
      // after the last step's update).
      comm.memset(in_place_target(g), 0, unit_grad_bytes(ctx_.plan, g));
    }
    G.in_place = nullptr;
    sink_.add_unit(g, DeviceMemory(), G.units);
    ++G.units;
    G.reduced_this_micro = true;
    return;
  }
  if (G.micro_grad.empty()) {
    // This group got no gradient this micro-batch: its unit gradient is zero, but it still takes
    // its place in the sum so every rank runs the same collectives in the same order.
    bound_in_flight();
    G.micro_grad = memory_.allocate(micro_grad_bytes(ctx_.plan, g), "grad.micro", g);
    comm.memset(G.micro_grad.data(), 0, G.micro_grad.size_bytes());
  } else {
    comm.wait(*G.grad_event);
  }
  DeviceMemory reduced;
  void* target = sink_.reduction_target(g);
  STRATA_CHECK((target != nullptr) == reduction_in_home(ctx_.plan),
               "group {}: the state home {} the reduction, the plan says it {}", L.name(),
               target != nullptr ? "takes" : "does not take", reduction_in_home(ctx_.plan) ? "does" : "does not");
  if (target == nullptr) {
    reduced = memory_.allocate(reduced_grad_bytes(ctx_.plan, g), "grad.reduced", g);
    target = reduced.data();
  }
  if (ctx_.plan.stage >= 2) {
    if (L.shard_count() == 1) {
      comm.copy_d2d(target, G.micro_grad.data(), reduced_unit_bytes(ctx_.plan, g));
    } else {
      ctx_.shard_comm.reduce_scatter(G.micro_grad.data(), target, P.grad_elems, dtype, ReduceOp::Sum, comm);
    }
    if (ctx_.plan.topo.replica_count() > 1) {
      ctx_.replica_comm.all_reduce(target, target, P.grad_elems, dtype, ReduceOp::Sum, comm);
    }
  } else {
    ctx_.world.all_reduce(G.micro_grad.data(), target, P.grad_elems, dtype, ReduceOp::Sum, comm);
  }
  comm.release_after(std::move(G.micro_grad));
  sink_.add_unit(g, std::move(reduced), G.units);
  std::unique_ptr<Event> done;
  if (spare_events_.empty()) {
    done = ctx_.device.create_event();
  } else {
    done = std::move(spare_events_.back());
    spare_events_.pop_back();
  }
  comm.record(*done);
  in_flight_.push_back(std::move(done));
  ++G.units;
  G.reduced_this_micro = true;
}

void GradReducer::end_micro_batch() {
  STRATA_CHECK(micro_index_ >= 0, "end_micro_batch without begin_micro_batch");
  // Groups not reduced yet (every group in the very first micro-batch, whose per-group counts are
  // being learned; groups without gradients) are reduced now, in group order on every rank.
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    Group& G = groups_[g];
    if (declared_ready_ && G.ready_count != ready_per_micro_[g] && G.ready_count != 0) {
      throw InternalError(fmt::format("param group {} declares {} grads_ready calls per backward but got {}",
                                      ctx_.group(g).layout.name(), ready_per_micro_[g], G.ready_count));
    }
    if (!G.reduced_this_micro) reduce(g);
    if (first_micro_batch_ever_ && !declared_ready_) ready_per_micro_[g] = G.ready_count;
    G.ready_count = 0;
    G.reduced_this_micro = false;
  }
  first_micro_batch_ever_ = false;
  micro_index_ = -1;
}

void GradReducer::end_step() {
  for (Group& G : groups_) G.units = 0;
  ctx_.comm.record(*step_done_);  // after the update (ZeroEngine::step)
  step_done_recorded_ = true;
}

}  // namespace strata
