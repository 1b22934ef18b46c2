// A pipeline stage's step (see models/pipeline_runner.h).
#include "models/pipeline_runner.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "comm/communicator.h"

namespace strata::models {

// Two device buffers of one boundary's values, each with the event of its last send (Note [Grouped
// transfers]).
struct PipelineRunner::RingSlot {
  DeviceMemory memory;
  std::unique_ptr<Event> sent;
  bool in_flight = false;  // `sent` recorded since the slot was last reused
};

struct PipelineRunner::Ring {
  using Slot = RingSlot;
  std::vector<Slot> slots;
  std::size_t next = 0;

  Ring(Device& device, std::size_t bytes, std::string_view tag) {
    for (int i = 0; i < 2; ++i) {
      Slot s;
      s.memory = device.allocate(bytes, tag);
      s.sent = device.create_event();
      slots.push_back(std::move(s));
    }
  }
  // The next slot, once its previous send has left it (the compute stream waits).
  Slot& take(Stream& compute) {
    Slot& s = slots[next];
    next = (next + 1) % slots.size();
    if (s.in_flight) compute.wait(*s.sent);
    s.in_flight = false;
    return s;
  }
};

std::size_t PipelineRunner::buffer_bytes(const Decoder& decoder, const PipelineStage& stage,
                                         PipelineSchedule schedule, int micro_batches, std::int64_t batch,
                                         std::int64_t seq) {
  if (!stage.split()) return 0;
  const ModelConfig& model = decoder.config();
  const std::size_t e = dtype_bytes(model.dtype);
  const std::size_t b = decoder.boundary_elems(batch, seq) * e;
  const std::size_t head = static_cast<std::size_t>(batch * seq * model.d_model) * e;
  const std::size_t tied_elems = decoder.tied_across_stages() ? decoder.tied_embedding_elems() : 0;
  const auto stash = stage.first() ? 0
                                   : static_cast<std::size_t>(pipeline_in_flight(
                                         pipeline_schedule(schedule, stage.size, stage.rank, micro_batches)));
  const std::size_t buffers = (stage.last() ? 0 : 2) + 2;
  std::size_t tied = 0;  // the head's input (first stage), its output ring and the weights' copy (last)
  if (tied_elems > 0 && stage.first()) tied += head;
  if (tied_elems > 0 && stage.last()) tied += 2 * head + tied_elems * e;
  return (stash + buffers) * b + tied;
}

PipelineRunner::PipelineRunner(Decoder& decoder, const DecoderRuntime& rt, const PipelineStage& stage,
                               PipelineSchedule schedule, int micro_batches, std::int64_t batch, std::int64_t seq)
    : decoder_(decoder), rt_(rt), stage_(stage), batch_(batch), seq_(seq), dtype_(decoder.config().dtype) {
  STRATA_CHECK(stage_.split() && stage_.comm != nullptr && rt_.device != nullptr && rt_.ctx.stream != nullptr,
               "a pipeline runner needs a stage of P > 1 with its communicator and a device stream");
  STRATA_CHECK(stage_.comm->world_size() == stage_.size && stage_.comm->rank() == stage_.rank,
               "pipeline stage {} of {} on a communicator of rank {} of {}", stage_.rank, stage_.size,
               stage_.comm->rank(), stage_.comm->world_size());
  boundary_elems_ = decoder.boundary_elems(batch, seq);
  boundary_bytes_ = boundary_elems_ * dtype_bytes(dtype_);
  head_elems_ = static_cast<std::size_t>(batch * seq * decoder.config().d_model);
  head_bytes_ = head_elems_ * dtype_bytes(dtype_);
  ops_ = pipeline_schedule(schedule, stage_.size, stage_.rank, micro_batches);
  Device& device = *rt_.device;
  // A slot per micro-batch in flight: its input (the stash, after the first stage) and the
  // decoder's activation set of the same index (Note [Stage activations] in models/pipeline.h).
  slots_ = pipeline_in_flight(ops_);
  STRATA_CHECK(stage_.activation_sets == 0 || stage_.activation_sets == slots_,
               "pipeline stage {}: {} activation sets for {} micro-batches in flight", stage_.rank,
               stage_.activation_sets, slots_);
  if (!stage_.first()) {
    for (int i = 0; i < slots_; ++i) stash_.push_back(device.allocate(boundary_bytes_, "pipeline stash"));
  }
  if (!stage_.last()) out_ = std::make_unique<Ring>(device, boundary_bytes_, "pipeline stage output");
  grad_ = std::make_unique<Ring>(device, boundary_bytes_, "pipeline stage gradient");
  tied_ = decoder.tied_across_stages();
  if (tied_ && stage_.first()) norm_in_ = device.allocate(head_bytes_, "pipeline tied head input");
  if (tied_ && stage_.last()) {
    tied_wte_ = device.allocate(decoder.tied_embedding_elems() * dtype_bytes(dtype_), "pipeline tied embedding");
    norm_out_ = std::make_unique<Ring>(device, head_bytes_, "pipeline tied head output");
  }
  sends_ = device.create_stream(fmt::format("pipeline stage {} sends", stage_.rank));
  sends_ready_ = device.create_event();
  step_start_ = device.create_event();
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    op_start_.push_back(device.create_event());
    op_end_.push_back(device.create_event());
  }
  tokens_.assign(static_cast<std::size_t>(micro_batches), std::vector<std::int32_t>(static_cast<std::size_t>(batch * seq)));
  targets_ = tokens_;
}

PipelineRunner::~PipelineRunner() {
  // Nothing may still read or write the buffers: drain the streams (errors were reported by run_step).
  for (Stream* s : {rt_.ctx.stream, sends_.get()}) {
    try {
      s->synchronize();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the step that failed has thrown already
    }
  }
}

std::size_t PipelineRunner::buffer_bytes() const {
  const std::size_t buffers = stash_.size() + (out_ ? out_->slots.size() : 0) + grad_->slots.size();
  const std::size_t heads = (norm_out_ ? norm_out_->slots.size() : 0) + (norm_in_.empty() ? 0 : 1);
  return buffers * boundary_bytes_ + heads * head_bytes_ + tied_wte_.size_bytes();
}

void PipelineRunner::post(std::size_t i) {
  Stream& compute = *rt_.ctx.stream;
  const PipelineOp& op = ops_[i];
  const auto a = static_cast<std::size_t>(op.micro);
  std::vector<PeerOp> receives;
  if (op.forward) {  // a stash slot for its input (the first stage's holds nothing)
    STRATA_CHECK(!free_slots_.empty(), "pipeline stage {}: no slot for micro-batch {}", stage_.rank, op.micro);
    const int slot = free_slots_.back();
    free_slots_.pop_back();
    stash_of_[a] = slot;
    if (!stage_.first()) {
      receives.push_back(PeerOp::recv(stash_[static_cast<std::size_t>(slot)].data(), boundary_elems_, dtype_,
                                      stage_.rank - 1));
      stats_.received_bytes += boundary_bytes_;
    }
  } else {  // a gradient buffer for its output's gradient (the last stage's is the loss's)
    RingSlot& g = grad_->take(compute);
    // The receive must not land in a buffer whose send is still held.
    STRATA_CHECK(std::find(held_slots_.begin(), held_slots_.end(), &g) == held_slots_.end(),
                 "pipeline stage {}: micro-batch {}'s gradient buffer still has a send held", stage_.rank, op.micro);
    grad_of_[a] = &g;
    if (!stage_.last()) {
      receives.push_back(PeerOp::recv(g.memory.data(), boundary_elems_, dtype_, stage_.rank + 1));
      stats_.received_bytes += boundary_bytes_;
    }
    if (tied_ && stage_.first()) {  // after the gradient from stage 1: the last stage sends in that order
      receives.push_back(PeerOp::recv(norm_in_.data(), head_elems_, dtype_, stage_.size - 1));
      stats_.received_bytes += head_bytes_;
    }
  }
  exchange(receives);
  posted_[i] = true;
}

void PipelineRunner::forward(ParamProvider& provider, int a) {
  Stream& compute = *rt_.ctx.stream;
  const int slot = stash_of_[static_cast<std::size_t>(a)];
  const void* x_in = stage_.first() ? nullptr : stash_[static_cast<std::size_t>(slot)].data();
  ++live_;
  stats_.peak_in_flight = std::max(stats_.peak_in_flight, live_);
  if (stage_.last()) {  // Note [Stage activations] in models/pipeline.h: its blocks' forward into the set (re-materialized: nothing)
    if (stage_.activation_sets == 0) return;
    compute.record(*op_start_[op_]);
    decoder_.stage_forward(rt_, provider, tokens_[static_cast<std::size_t>(a)].data(), batch_, seq_, x_in, nullptr,
                           slot);
    compute.record(*op_end_[op_]);
    timed_[op_] = true;
    return;
  }
  Ring::Slot& out = out_->take(compute);
  compute.record(*op_start_[op_]);
  decoder_.stage_forward(rt_, provider, tokens_[static_cast<std::size_t>(a)].data(), batch_, seq_, x_in,
                         out.memory.data(), slot);
  compute.record(*op_end_[op_]);
  timed_[op_] = true;
  hold_send(out, stage_.rank + 1, boundary_elems_);
}

LossSum PipelineRunner::backward(ParamProvider& provider, int a, float grad_scale) {
  Stream& compute = *rt_.ctx.stream;
  const auto i = static_cast<std::size_t>(a);
  Ring::Slot& g = *grad_of_[i];
  const int slot = stash_of_[i];
  STRATA_CHECK(slot >= 0, "pipeline stage {}: backward of micro-batch {} before its forward", stage_.rank, a);
  const void* x_in = stage_.first() ? nullptr : stash_[static_cast<std::size_t>(slot)].data();
  StageTied tied;
  Ring::Slot* norm_out = nullptr;
  if (tied_ && stage_.first()) tied.head_norm_in = norm_in_.data();
  if (tied_ && stage_.last()) {
    norm_out = &norm_out_->take(compute);
    tied.wte = tied_wte_.data();
    tied.head_norm_out = norm_out->memory.data();
  }
  compute.record(*op_start_[op_]);
  const LossSum loss = decoder_.stage_backward(rt_, provider, tokens_[i].data(), targets_[i].data(), batch_, seq_,
                                               grad_scale, x_in, g.memory.data(), tied, slot);
  compute.record(*op_end_[op_]);
  timed_[op_] = true;
  if (!stage_.first()) hold_send(g, stage_.rank - 1, boundary_elems_);
  free_slots_.push_back(slot);  // reused by a later forward on the compute stream
  stash_of_[i] = -1;
  grad_of_[i] = nullptr;
  if (norm_out != nullptr) hold_send(*norm_out, 0, head_elems_);
  --live_;
  return loss;
}

void PipelineRunner::hold_send(RingSlot& slot, int peer, std::size_t elems) {
  held_.push_back(PeerOp::send(slot.memory.data(), elems, dtype_, peer));
  held_slots_.push_back(&slot);
  stats_.sent_bytes += elems * dtype_bytes(dtype_);
}

void PipelineRunner::exchange(const std::vector<PeerOp>& receives) {
  if (held_.empty() && receives.empty()) return;
  // See Note [Grouped transfers] in models/pipeline_runner.h.
  // With receives, on the compute stream (which needs them); alone, on
  // the send stream after the compute stream's work so far (which wrote the buffers).
  Stream& compute = *rt_.ctx.stream;
  Stream* stream = &compute;
  if (receives.empty()) {
    compute.record(*sends_ready_);
    sends_->wait(*sends_ready_);
    stream = sends_.get();
  }
  std::vector<PeerOp> ops = held_;
  ops.insert(ops.end(), receives.begin(), receives.end());
  stage_.comm->exchange(ops, *stream);
  for (RingSlot* slot : held_slots_) {
    stream->record(*slot->sent);
    slot->in_flight = true;
  }
  held_.clear();
  held_slots_.clear();
}

std::vector<LossSum> PipelineRunner::run_step(ParamProvider& provider, const FillFn& fill, float grad_scale,
                                              const MicroFn& begin, const MicroFn& end) {
  const auto m = tokens_.size();
  for (std::size_t a = 0; a < m; ++a) fill(static_cast<int>(a), tokens_[a].data(), targets_[a].data());
  stats_ = {};
  live_ = 0;
  held_.clear();  // a failed step's
  held_slots_.clear();
  stash_of_.assign(m, -1);
  free_slots_.clear();
  for (int s = slots_ - 1; s >= 0; --s) free_slots_.push_back(s);
  std::vector<LossSum> losses(m);
  rt_.ctx.stream->record(*step_start_);  // see Note [Measured bubble] in models/pipeline_runner.h: the span starts with the step
  if (tied_) {  // Note [Tied embedding across stages] in models/pipeline.h: this step's embedding weights to the last stage
    decoder_.share_tied_embedding(rt_, provider, stage_.first() ? sends_.get() : nullptr, tied_wte_.data());
    const std::uint64_t bytes = decoder_.tied_embedding_elems() * dtype_bytes(dtype_);
    if (stage_.first()) stats_.sent_bytes += bytes;
    if (stage_.last()) stats_.received_bytes += bytes;
  }
  timed_.assign(ops_.size(), false);
  posted_.assign(ops_.size(), false);
  grad_of_.assign(m, nullptr);
  for (op_ = 0; op_ < ops_.size(); ++op_) {
    const PipelineOp& op = ops_[op_];
    if (!posted_[op_]) post(op_);
    if (op.forward) {
      forward(provider, op.micro);
      continue;
    }
    begin(op.micro);
    losses[static_cast<std::size_t>(op.micro)] = backward(provider, op.micro, grad_scale);
    end(op.micro);
    // See Note [Grouped transfers] in models/pipeline_runner.h.
    // The next op's exchange, and with it this backward's sends, goes out
    // before the host waits.
    if (op_ + 1 < ops_.size()) post(op_ + 1);
    // As a whole-model micro-batch does: the host does not run ahead of the stage's compute.
    rt_.ctx.stream->synchronize();
  }
  exchange({});  // the last sends
  sends_->synchronize();
  // See Note [Measured bubble] in models/pipeline_runner.h.
  // The events have all completed (the compute stream synchronized last).
  Event* last = nullptr;
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    if (!timed_[i]) continue;
    stats_.busy_ms += op_end_[i]->elapsed_ms_since(*op_start_[i]);
    last = op_end_[i].get();
  }
  if (last != nullptr) stats_.span_ms = last->elapsed_ms_since(*step_start_);
  // The pipeline's span: the stage that ends last (the first, draining the backwards) ends the step.
  stats_.span_ms = stage_.comm->all_reduce_host(stats_.span_ms, ReduceOp::Max);
  return losses;
}

}  // namespace strata::models
