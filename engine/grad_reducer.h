// Gradient reduction of the ZeRO engine: each micro-batch's gradient buffers, handed to the model
// by acquire_grads, reduced across ranks as soon as a group's last grads_ready call arrives (the
// fixed tree of Note [Deterministic reduction] in comm/communicator.h in exact mode; a reduce-scatter at stages 2-3),
// and handed unit by unit to the state home, which sums the units (Note [Exact gradient sums] in
// engine/zero_engine.h). Not part of the engine's interface.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/engine_context.h"

namespace strata {

class ParamFetcher;
class GradientSink;

class GradReducer {
 public:
  // `memory` allocates the gradient buffers (it may give back gathered weights to make room).
  GradReducer(EngineContext& ctx, std::span<const ParamGroupSpec> specs, ParamFetcher& memory, GradientSink& sink);

  void begin_micro_batch();
  void end_micro_batch();
  // ParamProvider::acquire_grads / grads_ready.
  GroupViews acquire(std::size_t g, Stream* stream);
  void ready(std::size_t g, Stream* stream);

  bool in_micro_batch() const { return micro_index_ >= 0; }
  // Micro-batches of the current step group g has handed to the state home.
  int units(std::size_t g) const { return groups_[g].units; }
  // The next step starts counting.
  void end_step();
  // Times the host waited for a queued reduction before allocating a micro-batch buffer.
  std::uint64_t in_flight_waits() const { return in_flight_waits_; }

 private:
  struct Group {
    DeviceMemory micro_grad;  // this micro-batch's full gradients, working dtype
    void* in_place = nullptr;  // or, when the reduction is the identity, the home's target (in_place())
    std::unique_ptr<Event> grad_event;
    int ready_count = 0;
    bool reduced_this_micro = false;
    int units = 0;  // micro-batches handed to the state home this step
  };
  void reduce(std::size_t g);
  void* in_place_target(std::size_t g);
  // See Note [Reductions in flight] in engine/grad_reducer.cc.
  // Before a micro-batch buffer is allocated, waits until fewer than
  // kReductionsInFlight (plan/run_plan.h) reductions are still queued on the communication stream.
  void bound_in_flight();

  // Recorded on the communication stream at end_step, after the update: the compute stream waits
  // for it before it writes a gradient in place (the update may still read the last one).
  std::unique_ptr<Event> step_done_;
  bool step_done_recorded_ = false;
  // Recorded on the communication stream after each reduction's buffers were freed there, oldest
  // first (Note [Reductions in flight] in engine/grad_reducer.cc); spare ones are reused.
  std::deque<std::unique_ptr<Event>> in_flight_;
  std::vector<std::unique_ptr<Event>> spare_events_;
  std::uint64_t in_flight_waits_ = 0;
  EngineContext& ctx_;
  ParamFetcher& memory_;
  GradientSink& sink_;
  std::vector<Group> groups_;
  int micro_index_ = -1;
  bool first_micro_batch_ever_ = true;
  bool declared_ready_ = false;       // every group declared its grads_ready calls (ParamGroupSpec)
  std::vector<int> ready_per_micro_;  // grads_ready calls per group per micro-batch (from the first)
};

}  // namespace strata
