// The pipeline stages' entry points of the decoder (models/decoder.h, models/pipeline.h): a stage's
// forward into an activation set, its backward from it (or re-materialized), and the tied embedding
// across the first and last stage.
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "models/decoder.h"
#include "models/decoder_pass.h"

namespace strata::models {

using namespace decoder_detail;

namespace {

// Swaps activation set `set` (Note [Stage activations] in models/pipeline.h) into the workspace for one pipeline call
// and back on the way out, also when the call throws; nothing without sets.
class ActivationSet {
 public:
  ActivationSet(Decoder::Workspace& ws, int set) : ws_(ws), set_(static_cast<std::size_t>(set)) {
    if (ws_.set_x.empty()) return;
    STRATA_CHECK(set >= 0 && set_ < ws_.set_x.size(), "activation set {} of {}", set, ws_.set_x.size());
    swap();
  }
  ~ActivationSet() {
    if (!ws_.set_x.empty()) swap();
  }
  ActivationSet(const ActivationSet&) = delete;
  ActivationSet& operator=(const ActivationSet&) = delete;

 private:
  void swap() {
    std::swap(ws_.x, ws_.set_x[set_]);
    std::swap(ws_.acts, ws_.set_acts[set_]);
  }
  Decoder::Workspace& ws_;
  std::size_t set_;
};

// Points workspace buffers at the caller's for one pipeline call and puts them back on the way out,
// also when the call throws.
class BorrowedBuffers {
 public:
  void lend(void*& slot, const void* buffer) {
    saved_.emplace_back(&slot, slot);
    slot = const_cast<void*>(buffer);  // read only where the caller's buffer is const
  }
  ~BorrowedBuffers() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) *it->first = it->second;
  }

 private:
  std::vector<std::pair<void**, void*>> saved_;
};

}  // namespace

void Decoder::check_stage_call(const DecoderRuntime& rt, const char* what) const {
  const TensorParallel& tp = options_.tensor;
  STRATA_CHECK(options_.pipeline.split() && rt.ctx.stream != nullptr && (tp.size == 1 || tp.comm != nullptr),
               "{} needs a pipeline stage (strata.parallel.pipeline > 1) on a device stream", what);
}

void Decoder::stage_forward(const DecoderRuntime& rt, ParamProvider& provider, const std::int32_t* tokens,
                            std::int64_t batch, std::int64_t seq, const void* x_in, void* y_out, int set) {
  check_stage_call(rt, "stage_forward");
  const PipelineStage& ps = options_.pipeline;
  if (ps.last() && ps.activation_sets == 0) return;  // its forward runs in its backward
  const ModelConfig& c = config_;
  if (ps.first()) check_tokens(c, tokens, tokens, batch, seq);
  Workspace& ws = workspace(rt, batch, seq, /*training=*/true);
  Stream* stream = rt.ctx.stream;
  if (ps.first()) copy_tokens(stream, ws.tokens, tokens, batch * seq);
  STRATA_CHECK(ps.first() == (x_in == nullptr) && ps.last() == (y_out == nullptr), "stage {} forward: input {}, output {}",
               ps.rank, x_in, y_out);
  const ActivationSet in_set(ws, set);
  BorrowedBuffers borrowed;
  if (!ps.first()) borrowed.lend(ws.x.front(), x_in);
  if (!ps.last()) borrowed.lend(ws.x.back(), y_out);  // the last stage's stays in its set for the head
  const BlockPass pass{{c, rt.ctx, batch, seq, layout_.tiling.chunks, options_.tensor, ws.parts, ws.own_rows}};
  ProviderChain chain(provider, layout_, stage_local_, true, tensor_layout_.get());
  // See Note [Stage activations] in models/pipeline.h.
  // The set keeps what the backward reads; re-materialized, one set of
  // block activations suffices (the backward recomputes them).
  const bool keep_all = !ws.set_x.empty() && options_.checkpointing == Checkpointing::Off;
  const ModelPass m{c, layout_, rt.ctx, *chain.top, ws, pass, batch, seq, true, keep_all, ps};
  m.forward_blocks();
}

LossSum Decoder::stage_backward(const DecoderRuntime& rt, ParamProvider& provider, const std::int32_t* tokens,
                                const std::int32_t* targets, std::int64_t batch, std::int64_t seq, float grad_scale,
                                const void* x_in, void* grad, const StageTied& tied, int set) {
  check_stage_call(rt, "stage_backward");
  const PipelineStage& ps = options_.pipeline;
  const ModelConfig& c = config_;
  check_tokens(c, tokens, targets, batch, seq);
  const std::int64_t n = batch * seq;
  Workspace& ws = workspace(rt, batch, seq, /*training=*/true);
  Stream* stream = rt.ctx.stream;
  const bool tied_split = tied_across_stages();
  if (ps.first()) copy_tokens(stream, ws.tokens, tokens, n);
  if (ps.last() || (tied_split && ps.first())) copy_tokens(stream, ws.targets, targets, n);
  STRATA_CHECK(ps.first() == (x_in == nullptr) && grad != nullptr, "stage {} backward: input {}, gradient {}", ps.rank,
               x_in, grad);
  STRATA_CHECK(!tied_split || (ps.first() ? tied.head_norm_in != nullptr
                                          : !ps.last() || (tied.head_norm_out != nullptr && tied.wte != nullptr)),
               "stage {} of a tied embedding across stages without its buffers", ps.rank);
  const ActivationSet in_set(ws, set);
  BorrowedBuffers borrowed;
  if (!ps.first()) borrowed.lend(ws.x.front(), x_in);
  borrowed.lend(ws.dres, grad);
  if (tied_split && ps.first()) borrowed.lend(ws.lnf_out, tied.head_norm_in);
  const BlockPass pass{{c, rt.ctx, batch, seq, layout_.tiling.chunks, options_.tensor, ws.parts, ws.own_rows}};
  ProviderChain chain(provider, layout_, stage_local_, true, tensor_layout_.get());
  const bool keep_all = options_.checkpointing == Checkpointing::Off;
  ModelPass m{c, layout_, rt.ctx, *chain.top, ws, pass, batch, seq, true, keep_all, ps};
  if (tied_split) {
    m.tied_wte = ps.last() ? tied.wte : nullptr;
    m.recompute_tied_head = ps.first();
    m.tied_grad_scale = grad_scale;
  }
  // See Note [Stage activations] in models/pipeline.h.
  // The micro-batch's forward kept its set (on the last stage also its
  // blocks' output, the head's input); re-materialized, the forward runs again from x_in (on the
  // last stage, for the first time).
  if (ws.set_x.empty()) m.forward_blocks();
  if (ps.last()) m.run_head(grad_scale);
  if (tied_split && ps.last()) {  // every row: the final norm's output is gathered (Note [Sequence parallelism] in models/tensor_parallel.h)
    stream->copy_d2d(tied.head_norm_out, ws.lnf_out, static_cast<std::size_t>(n * c.d_model) * dtype_bytes(c.dtype));
  }
  m.backward_blocks();
  return ps.last() ? sum_losses(stream, ws, targets, n) : LossSum{};
}

bool Decoder::tied_across_stages() const {
  return options_.pipeline.split() && config_.tied_embeddings;
}

std::size_t Decoder::boundary_elems(std::int64_t batch, std::int64_t seq) const {
  const TensorParallel& tp = options_.tensor;
  const std::int64_t rows = batch * seq;
  return static_cast<std::size_t>((tp.split_rows() ? rows / tp.size : rows) * config_.d_model);
}

std::size_t Decoder::tied_embedding_elems() const {
  const TensorParallel& tp = options_.tensor;
  return static_cast<std::size_t>(vocab_rows(config_, tp.size, tp.rank).rows() * config_.d_model);
}

void Decoder::share_tied_embedding(const DecoderRuntime& rt, ParamProvider& provider, Stream* send_stream, void* copy) {
  check_stage_call(rt, "share_tied_embedding");
  const PipelineStage& ps = options_.pipeline;
  STRATA_CHECK(tied_across_stages(), "share_tied_embedding without a tied embedding across stages");
  Stream& compute = *rt.ctx.stream;
  const std::size_t elems = tied_embedding_elems();
  if (ps.last()) {
    STRATA_CHECK(copy != nullptr, "the last stage needs a buffer for the tied embedding");
    ps.comm->recv(copy, elems, config_.dtype, 0, compute);
    return;
  }
  if (!ps.first()) return;
  STRATA_CHECK(send_stream != nullptr, "the first stage needs a stream to send the tied embedding on");
  ProviderChain chain(provider, layout_, stage_local_, true, tensor_layout_.get());
  const GroupViews w = chain.top->acquire_params(layout_.embedding, ParamPhase::Forward, &compute);
  auto ready = rt.device->create_event();
  compute.record(*ready);
  send_stream->wait(*ready);
  ps.comm->send(w[embedding_group::kWte], elems, config_.dtype, ps.size - 1, *send_stream);
  // The weights may stay gathered (stage 3) and be freed later after the compute stream only: the
  // compute stream waits for the send before they are released there.
  auto sent = rt.device->create_event();
  send_stream->record(*sent);
  compute.wait(*sent);
  chain.top->release_params(layout_.embedding, &compute);
}

}  // namespace strata::models
