// ZeroEngine's checkpoint state: this rank's fp32 master weights and optimizer moments streamed out
// and back in piece by piece from whichever home holds them (engine/state_home.h), plus the step
// counter and the loss scaler (engine/zero_engine.h; the file format is checkpoint/checkpoint.h's
// business).
//
// Note [Checkpoint state]: everything else a step depends on is derived. The working weights are
// the optimizer's low-precision copy of the master (round to nearest even; in fp32 mode the same
// values), so import_state writes the master and rebuilds W from it with the same conversion,
// gathering the full copies where the stage keeps W whole. Gradient buffers, gathered copies and
// the prefetch trace hold nothing between steps. So export after step k and import into a fresh
// engine of the same config continues with the same bits as the run that never stopped. The state
// range of a rank is a range of the group's flat buffer, whose tensor offsets do not depend on the
// shard count (plan/partition.h): a loader may fill the range from data saved under another
// world size or sharding factor (padding elements are zero).
#include <cstring>
#include <deque>
#include <vector>

#include "core/error.h"
#include "engine/grad_reducer.h"
#include "engine/param_fetcher.h"
#include "engine/state_home.h"
#include "engine/working_weights.h"
#include "engine/zero_engine.h"

namespace strata {

int ZeroEngine::state_arrays() const { return plan_.state_arrays; }

StateRange ZeroEngine::state_range(std::size_t g) const {
  STRATA_CHECK(g < specs_.size(), "param group {} of {}", g, specs_.size());
  const GroupPlan& P = plan_.groups[g];
  return StateRange{P.state_offset, P.state_elems, P.layout.total_elems()};
}

EngineCounters ZeroEngine::counters() const {
  EngineCounters c;
  c.optimizer_steps = optimizer_.step_count();
  if (scaler_) c.loss_scaler = scaler_->state();
  return c;
}

void ZeroEngine::restore_counters(const EngineCounters& c) {
  STRATA_CHECK(c.optimizer_steps >= 0, "optimizer step count {}", c.optimizer_steps);
  STRATA_CHECK(c.loss_scaler.has_value() == (scaler_ != nullptr),
               "loss scaler state given: {}, engine has a loss scaler: {}", c.loss_scaler.has_value(),
               scaler_ != nullptr);
  optimizer_.set_step_count(c.optimizer_steps);
  if (scaler_) scaler_->restore(*c.loss_scaler);
}

void ZeroEngine::check_between_steps(const char* what) const {
  STRATA_CHECK(!reducer_->in_micro_batch(), "{} inside a micro-batch", what);
  for (std::size_t g = 0; g < specs_.size(); ++g) {
    STRATA_CHECK(reducer_->units(g) == 0 && fetcher_->live(g) == 0,
                 "{} while group {} is in a step ({} micro-batches, {} acquired)", what,
                 plan_.groups[g].layout.name(), reducer_->units(g), fetcher_->live(g));
  }
}

std::vector<StateChunkInfo> ZeroEngine::state_chunks() const { return home_->pieces(); }

bool ZeroEngine::capture_next_step(StateCaptureSink sink) {
  check_between_steps("capture_next_step");
  return home_->arm_capture(std::move(sink));
}

std::size_t ZeroEngine::captured_pieces() const { return home_->captured_pieces(); }

// Note [Checkpoint copy]: export_state moves the state at disk speed. A piece handed to the sink
// is written (O_DIRECT, checkpoint/checkpoint_writer.cc) straight from where it already is: a host-tier
// chunk from its host array, an NVMe chunk from the pinned slot its read landed in, device state
// from a staging buffer filled by one copy per array (StateCheckpoint::fetch_piece). Up to the home's
// export_depth pieces are in flight: while the sink hashes and writes piece i, the reads of pieces
// i+1.. are already queued (NVMe), so the disk reads and writes at once and no byte is copied on
// the host.
namespace {

// The pieces of `home`, in order, handed to `sink` (Note [Checkpoint copy]).
void export_pieces(StateCheckpoint& home, const StateSink& sink) {
  const std::vector<StateChunkInfo> chunks = home.pieces();
  struct Handed {
    StatePiece piece;
    offload::IoHandle use;
  };
  const std::size_t depth = home.export_depth();
  std::vector<HostBuffer> spare;  // device staging, reused
  std::deque<StatePiece> fetched;  // data on its way (reads in flight), not yet handed out
  std::deque<Handed> handed;       // handed to the sink, its handle pending
  std::exception_ptr error;
  const auto retire_front = [&] {
    Handed& h = handed.front();
    if (std::exception_ptr e = h.use.wait_error(); e && !error) error = e;
    if (h.piece.staging.size_bytes() > 0) spare.push_back(std::move(h.piece.staging));
    handed.pop_front();
  };
  try {
    std::size_t next = 0;
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      // Reads of the next pieces go out before piece i is handed over (fetched holds [i, next)).
      for (; next < chunks.size() && next < i + depth; ++next) {
        while (fetched.size() + handed.size() >= depth) retire_front();
        fetched.push_back(home.fetch_piece(next, chunks[next], spare));
      }
      Handed h{std::move(fetched.front()), {}};
      fetched.pop_front();
      if (h.piece.read.valid()) {
        h.piece.read.wait();
        // The slot's stale tail.
        std::memset(h.piece.bytes.data() + h.piece.meaningful, 0, h.piece.bytes.size() - h.piece.meaningful);
      }
      h.use = sink(i, h.piece.bytes);
      handed.push_back(std::move(h));
      while (!handed.empty() && handed.front().use.poll()) retire_front();
    }
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  // Nothing may be in flight when the slots and staging go away.
  for (StatePiece& p : fetched) {
    if (p.read.valid()) (void)p.read.wait_error();
  }
  fetched.clear();
  while (!handed.empty()) retire_front();
  if (error) std::rethrow_exception(error);
}

}  // namespace

void ZeroEngine::export_state(const StateSink& sink) {
  check_between_steps("export_state");
  // The last step's publishing and any overlapped update must have landed.
  comm_stream_->synchronize();
  home_->synchronize();
  export_pieces(*home_, sink);
}

void ZeroEngine::import_state(const StateSource& source) {
  check_between_steps("import_state");
  comm_stream_->synchronize();
  home_->synchronize();
  fetcher_->drop_gathered();  // gathered copies hold the old weights
  home_->import_state(source);
  // Groups whose W is a full resident copy gather every shard's new values into it, as step() does.
  weights_->publish(/*from_master=*/false);
  comm_stream_->synchronize();
}

}  // namespace strata
