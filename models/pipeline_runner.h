// One pipeline stage's share of an optimizer step (models/pipeline.h): the stage's schedule of
// forwards and backwards, the point-to-point sends and receives at its boundaries, and its stash.
//
// Note [Measured bubble]: events on the compute stream around each forward and backward (after the
// receive it waits on, and after its last kernel) time the stage's work; whatever else the
// pipeline's span holds is the stage's idle time: the pipeline's fill and drain, and the host's work
// between micro-batches. The span is the longest of the stages' (each from an event at its step's
// start, when every stage leaves the previous step's host collectives together, to its last
// kernel): a stage that finishes early waits for the others at the step's end. It is reported per
// stage beside the ideal (P - 1) / (A + P - 1), which assumes equal stages.
//
// Note [Grouped transfers]: a communicator runs its calls one at a time in issue order (Note [Issue
// order], comm/communicator.h), so a stage must not send to a neighbour and then receive from it
// while the neighbour does the same the other way round: in 1F1B's steady state stage s sends
// micro-batch k's output to stage s + 1 and then waits for micro-batch j's gradient from it, while
// s + 1 sends that gradient and then waits for k's output, and each send waits for its receive.
// The runner therefore holds its sends back and issues them with its next receives as one
// exchange (Megatron's send_forward_recv_backward and send_backward_recv_forward), on the compute
// stream, right before the work that needs the received values. Sends with no receive to go with
// them (the first stage's tied embedding and its forwards, the last stage's backwards under GPipe,
// the step's last sends) go alone on the stage's send stream, so the compute stream does not wait
// for them until its next exchange, which the issue order puts after them. A stage's sends are
// issued before its next compute, which is what lets its output and gradient buffers be rings of
// two: a buffer is reused after the event of its previous send. After a backward the runner posts
// the next op's exchange before the host waits for the compute stream, so the backward's sends
// leave as soon as its kernels end rather than once the host has woken from that wait.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/device/device.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "models/decoder.h"
#include "models/pipeline.h"

namespace strata::models {

struct PipelineStepStats {
  int peak_in_flight = 0;           // micro-batches whose forward ran and backward had not
  std::uint64_t sent_bytes = 0;     // to the neighbouring stages, this step
  std::uint64_t received_bytes = 0;
  // From events on the compute stream (Note [Measured bubble]): the time its forwards and
  // backwards ran (each from its input's arrival to its last kernel), and the pipeline's span (the
  // longest stage's, from the step's start to its last op's end). 1 - busy / span is the stage's
  // idle share of the step.
  double busy_ms = 0, span_ms = 0;
};

class PipelineRunner {
 public:
  // `stage` must be the decoder's (DecoderOptions::pipeline), with its communicator.
  PipelineRunner(Decoder& decoder, const DecoderRuntime& rt, const PipelineStage& stage, PipelineSchedule schedule,
                 int micro_batches, std::int64_t batch, std::int64_t seq);
  ~PipelineRunner();
  PipelineRunner(const PipelineRunner&) = delete;
  PipelineRunner& operator=(const PipelineRunner&) = delete;

  // Fills micro-batch a's tokens and targets (batch * seq each).
  using FillFn = std::function<void(int micro, std::int32_t* tokens, std::int32_t* targets)>;
  using MicroFn = std::function<void(int micro)>;
  // Runs the step's schedule: `fill` for every micro-batch first, then the forwards and backwards,
  // each backward between begin(a) and end(a) (the engine's micro-batch brackets; the backwards come
  // in ascending order). The loss gradient is `grad_scale` per token, as in forward_backward.
  // Returns each micro-batch's loss on the last stage (zeros elsewhere) once every send completed.
  std::vector<LossSum> run_step(ParamProvider& provider, const FillFn& fill, float grad_scale, const MicroFn& begin,
                                const MicroFn& end);

  const std::vector<PipelineOp>& schedule() const { return ops_; }
  // Stash slots (one micro-batch's stage input each) and the bytes of the stage's buffers.
  int stash_slots() const { return static_cast<int>(stash_.size()); }
  // A stage boundary's bytes (Decoder::boundary_elems), and the final norm's output the last stage
  // sends the first with a tied embedding (every row of the micro-batch x d_model).
  std::size_t boundary_bytes() const { return boundary_bytes_; }
  std::size_t head_bytes() const { return head_bytes_; }
  std::size_t buffer_bytes() const;
  const PipelineStepStats& last_step() const { return stats_; }
  // Device bytes the runner of this shape allocates for `decoder`'s stage (for the plan, before
  // building it).
  static std::size_t buffer_bytes(const Decoder& decoder, const PipelineStage& stage, PipelineSchedule schedule,
                                  int micro_batches, std::int64_t batch, std::int64_t seq);

 private:
  struct Ring;
  struct RingSlot;
  // See Note [Grouped transfers] in models/pipeline_runner.h.
  // Op i's receive buffers taken (a stash slot, a gradient buffer) and
  // its receives issued with the held sends; once per op, possibly ahead of the op.
  void post(std::size_t i);
  void forward(ParamProvider& provider, int a);
  LossSum backward(ParamProvider& provider, int a, float grad_scale);

  // See Note [Grouped transfers] in models/pipeline_runner.h.
  // `receives` with the held-back sends as one exchange (on the compute
  // stream, or alone on the send stream); each sent slot's `sent` is recorded after it.
  void exchange(const std::vector<PeerOp>& receives);
  void hold_send(RingSlot& slot, int peer, std::size_t elems);

  Decoder& decoder_;
  DecoderRuntime rt_;
  PipelineStage stage_;
  std::int64_t batch_, seq_;
  DType dtype_;
  std::size_t boundary_elems_ = 0, boundary_bytes_ = 0, head_elems_ = 0, head_bytes_ = 0;
  std::vector<PipelineOp> ops_;
  int slots_ = 0;  // micro-batches in flight at most
  std::vector<DeviceMemory> stash_;
  std::vector<int> stash_of_;   // micro-batch -> slot (-1: none)
  std::vector<int> free_slots_;
  std::unique_ptr<Ring> out_, grad_;
  std::unique_ptr<Stream> sends_;  // exchanges without receives
  std::unique_ptr<Event> sends_ready_;  // the compute stream's work before such an exchange
  std::vector<PeerOp> held_;       // sends waiting for the next exchange, and their slots
  std::vector<RingSlot*> held_slots_;
  // A tied embedding across stages: the last stage's copy of the weights and its final norm's
  // outputs (sent to the first stage), the first stage's receive buffer for them.
  bool tied_ = false;
  DeviceMemory tied_wte_, norm_in_;
  std::unique_ptr<Ring> norm_out_;
  std::vector<std::vector<std::int32_t>> tokens_, targets_;
  // Each op's start and end on the compute stream (ops_ order; ops without compute have none).
  std::vector<std::unique_ptr<Event>> op_start_, op_end_;
  std::unique_ptr<Event> step_start_;
  PipelineStepStats stats_;
  int live_ = 0;
  std::size_t op_ = 0;       // the op run_step is at
  std::vector<bool> timed_;  // whether op i recorded its events this step
  std::vector<bool> posted_;  // whether op i's exchange has been issued this step
  std::vector<RingSlot*> grad_of_;  // micro-batch -> its gradient buffer, from post to backward
};

}  // namespace strata::models
