// ZeroEngine's checkpoint state: this rank's fp32 master weights and optimizer moments streamed out
// and back in piece by piece from whichever tier holds them, plus the step counter and the loss
// scaler (engine/zero_engine.h; the file format is engine/checkpoint.h's business).
//
// Note [Checkpoint state]: everything else a step depends on is derived. The working weights are
// the optimizer's low-precision copy of the master (round to nearest even; in fp32 mode the same
// values), so import_state writes the master and rebuilds W from it with the same conversion,
// gathering the full copies where the stage keeps W whole. Gradient buffers, gathered copies and
// the prefetch trace hold nothing between steps. So export after step k and import into a fresh
// engine of the same config continues with the same bits as the run that never stopped. The state
// range of a rank is a range of the group's flat buffer, whose tensor offsets do not depend on the
// shard count (engine/partition.h): a loader may fill the range from data saved under another
// world size or sharding factor (padding elements are zero).
#include <algorithm>
#include <cstring>
#include <deque>
#include <vector>

#include <fmt/format.h>

#include "core/dtype_bulk.h"
#include "core/error.h"
#include "core/host_buffer.h"
#include "engine/zero_engine.h"
#include "engine/zero_engine_internal.h"

namespace strata {

int ZeroEngine::state_arrays() const { return plan_.state_arrays; }

double ZeroEngine::loss_scale() const { return impl_->scaler ? impl_->scaler->scale() : 1.0; }

StateRange ZeroEngine::state_range(std::size_t g) const {
  STRATA_CHECK(g < groups_.size(), "param group {} of {}", g, groups_.size());
  const Group& G = *groups_[g];
  return StateRange{G.plan.state_offset, G.plan.state_elems, G.layout.total_elems()};
}

EngineCounters ZeroEngine::counters() const {
  EngineCounters c;
  c.optimizer_steps = impl_->optimizer.step_count();
  if (impl_->scaler) c.loss_scaler = impl_->scaler->state();
  return c;
}

void ZeroEngine::restore_counters(const EngineCounters& c) {
  STRATA_CHECK(c.optimizer_steps >= 0, "optimizer step count {}", c.optimizer_steps);
  STRATA_CHECK(c.loss_scaler.has_value() == (impl_->scaler != nullptr),
               "loss scaler state given: {}, engine has a loss scaler: {}", c.loss_scaler.has_value(),
               impl_->scaler != nullptr);
  impl_->optimizer.set_step_count(c.optimizer_steps);
  if (impl_->scaler) impl_->scaler->restore(*c.loss_scaler);
}

void ZeroEngine::check_between_steps(const char* what) const {
  STRATA_CHECK(micro_index_ < 0, "{} inside a micro-batch", what);
  for (const auto& G : groups_) {
    STRATA_CHECK(G->units == 0 && G->live == 0, "{} while group {} is in a step ({} micro-batches, {} acquired)", what,
                 G->layout.name(), G->units, G->live);
  }
}

std::vector<ZeroEngine::StateChunkInfo> ZeroEngine::state_chunks() const {
  std::vector<StateChunkInfo> out;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const Group& G = *groups_[g];
    if (impl_->off.optimizer) {
      for (const StateChunk& c : G.plan.chunks) out.push_back({g, c.begin, c.elems});
    } else {
      for (std::size_t b = 0; b < G.plan.state_elems; b += kStatePieceElems) {
        out.push_back({g, b, std::min(kStatePieceElems, G.plan.state_elems - b)});
      }
    }
  }
  return out;
}

// Note [Checkpoint copy]: export_state moves the state at disk speed. A piece handed to the sink
// is written (O_DIRECT, engine/checkpoint_writer.cc) straight from where it already is: a host-tier
// chunk from its host array, an NVMe chunk from the pinned slot its read landed in, device state
// from a staging buffer filled by one copy per array. Up to `depth` pieces are in flight: while
// the sink hashes and writes piece i, the reads of pieces i+1.. are already queued (NVMe), so the
// disk reads and writes at once and no byte is copied on the host.
void ZeroEngine::export_state(const StateSink& sink) {
  check_between_steps("export_state");
  // The last step's publishing and any overlapped update must have landed.
  comm_stream_->synchronize();
  ZeroOffload& off = impl_->off;
  if (off.worker) off.worker->synchronize();
  const std::vector<StateChunkInfo> chunks = state_chunks();
  const auto nstate = static_cast<std::size_t>(state_arrays());
  const bool nvme = off.optimizer && off.opt_tier == Tier::Nvme;
  // (group, chunk index) of every piece, for the offload keys.
  std::vector<std::size_t> chunk_index(chunks.size());
  for (std::size_t i = 0; i < chunks.size(); ++i) chunk_index[i] = i > 0 && chunks[i - 1].group == chunks[i].group ? chunk_index[i - 1] + 1 : 0;

  struct Piece {
    std::size_t index = 0;
    std::span<std::byte> bytes;  // padded
    offload::BufferLease lease;  // NVMe: the pinned slot the read lands in
    HostBuffer staging;          // device state
    offload::IoHandle read;
    offload::IoHandle use;
  };
  const std::size_t depth = nvme ? std::max<std::size_t>(off.pool->slot_count(), 1) : 4;
  std::vector<HostBuffer> spare;  // device staging, reused
  std::deque<Piece> fetched;      // data on its way (NVMe reads in flight), not yet handed out
  std::deque<Piece> handed;       // handed to the sink, its handle pending
  std::exception_ptr error;
  const auto retire_front = [&] {
    Piece& p = handed.front();
    if (std::exception_ptr e = p.use.wait_error(); e && !error) error = e;
    if (p.staging.size_bytes() > 0) spare.push_back(std::move(p.staging));
    handed.pop_front();
  };
  const auto fetch = [&](std::size_t i) {
    const StateChunkInfo& c = chunks[i];
    Group& G = *groups_[c.group];
    const std::size_t bytes = nstate * 4 * c.elems;
    const std::size_t padded = offload::SwapStore::padded(bytes);
    Piece p;
    p.index = i;
    if (nvme) {
      p.lease = off.pool->acquire();
      p.bytes = p.lease.span().first(padded);
      p.read = off.store->swap().read(ZeroOffload::state_key(c.group, chunk_index[i]), p.bytes);
      off.store->count_read(bytes);
    } else if (off.optimizer) {
      // Host arrays are padded and their padding is never written (still zero).
      p.bytes = off.store->host(ZeroOffload::state_key(c.group, chunk_index[i]), bytes).first(padded);
    } else {
      if (!spare.empty() && spare.back().size_bytes() >= padded) {
        p.staging = std::move(spare.back());
        spare.pop_back();
      } else {
        p.staging = HostBuffer::allocate(offload::SwapStore::padded(nstate * 4 * std::min(kStatePieceElems, G.plan.state_elems)));
      }
      p.bytes = std::span<std::byte>(p.staging.as<std::byte>().data(), padded);
      const DeviceMemory* arrays[] = {&G.master, &G.moment1, &G.moment2};
      for (std::size_t a = 0; a < nstate; ++a) {
        comm_stream_->copy_d2h(p.bytes.data() + a * c.elems * 4, arrays[a]->as<float>() + c.begin_elems, c.elems * 4);
      }
      comm_stream_->synchronize();
      std::memset(p.bytes.data() + bytes, 0, padded - bytes);
    }
    fetched.push_back(std::move(p));
  };
  try {
    std::size_t next = 0;
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      // Reads of the next pieces go out before piece i is handed over (fetched holds [i, next)).
      for (; next < chunks.size() && next < i + depth; ++next) {
        while (fetched.size() + handed.size() >= depth) retire_front();
        fetch(next);
      }
      Piece p = std::move(fetched.front());
      fetched.pop_front();
      if (nvme) {
        p.read.wait();
        const std::size_t bytes = nstate * 4 * chunks[i].elems;
        std::memset(p.bytes.data() + bytes, 0, p.bytes.size() - bytes);  // the slot's stale tail
      }
      p.use = sink(i, p.bytes);
      handed.push_back(std::move(p));
      while (!handed.empty() && handed.front().use.poll()) retire_front();
    }
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  // Nothing may be in flight when the slots and staging go away.
  for (Piece& p : fetched) {
    if (p.read.valid()) (void)p.read.wait_error();
  }
  fetched.clear();
  while (!handed.empty()) retire_front();
  if (error) std::rethrow_exception(error);
}

// Working weights of elements [begin, begin + n) of group g's state range, from their new master
// values, into the device copy that holds them (nothing where W aliases the fp32 master, and the
// parameter tier is written by import_offloaded_state).
namespace {
struct WorkingCopy {
  std::vector<std::byte> narrow;
  const void* convert(const float* master, DType dtype, std::size_t n) {
    if (dtype == DType::F32) return master;
    narrow.resize(n * dtype_bytes(dtype));
    convert_parallel(master, DType::F32, narrow.data(), dtype, n);
    return narrow.data();
  }
};
}  // namespace

void ZeroEngine::import_state(const StateSource& source) {
  check_between_steps("import_state");
  comm_stream_->synchronize();
  if (impl_->off.worker) impl_->off.worker->synchronize();
  // Gathered copies hold the old weights.
  for (auto& G : groups_) {
    if (G->gathered.empty()) continue;
    live_elems_ -= G->layout.total_elems();
    comm_stream_->release_after(std::move(G->gathered));
  }
  if (impl_->off.optimizer) {
    import_offloaded_state(source);
    publish_imported_weights();
    return;
  }
  const std::size_t wbytes = dtype_bytes(working_dtype_);
  std::vector<float> piece;
  WorkingCopy w;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    Group& G = *groups_[g];
    DeviceMemory* arrays[] = {&G.master, &G.moment1, &G.moment2};
    piece.resize(std::min(kStatePieceElems, G.plan.state_elems));
    std::byte* wdst = nullptr;
    if (G.plan.sharded_params && !G.w_shard.empty()) wdst = G.w_shard.as<std::byte>();
    if (!G.plan.sharded_params && !G.w_full.empty()) wdst = G.w_full.as<std::byte>() + G.plan.state_offset * wbytes;
    for (int a = 0; a < state_arrays(); ++a) {
      auto* dst = arrays[a]->as<float>();
      for (std::size_t b = 0; b < G.plan.state_elems; b += kStatePieceElems) {
        const std::size_t n = std::min(kStatePieceElems, G.plan.state_elems - b);
        source(g, a, b, std::span<float>(piece.data(), n));
        comm_stream_->copy_h2d(dst + b, piece.data(), n * sizeof(float));
        if (a == 0 && wdst != nullptr) {
          comm_stream_->copy_h2d(wdst + b * wbytes, w.convert(piece.data(), working_dtype_, n), n * wbytes);
        }
        comm_stream_->synchronize();  // the staging is refilled by the next piece
      }
    }
  }
  publish_imported_weights();
}

void ZeroEngine::import_offloaded_state(const StateSource& source) {
  ZeroOffload& off = impl_->off;
  const auto nstate = static_cast<std::size_t>(off.nstate);
  const std::size_t wbytes = dtype_bytes(working_dtype_);
  HostBuffer staging;
  if (off.opt_tier == Tier::Nvme) {
    staging = HostBuffer::allocate(offload::SwapStore::padded(nstate * 4 * off.chunk_elems));
  }
  HostBuffer param_staging;
  if (off.params && off.param_tier == Tier::Nvme) {
    param_staging = HostBuffer::allocate(offload::SwapStore::padded(wbytes * off.chunk_elems));
  }
  WorkingCopy w;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    Group& G = *groups_[g];
    for (std::size_t k = 0; k < G.plan.chunks.size(); ++k) {
      const StateChunk& c = G.plan.chunks[k];
      const std::size_t bytes = nstate * 4 * c.elems;
      const std::string key = ZeroOffload::state_key(g, k);
      float* chunk = off.opt_tier == Tier::Host ? reinterpret_cast<float*>(off.store->host(key, bytes).data())
                                                : staging.as<float>().data();
      for (std::size_t a = 0; a < nstate; ++a) {
        for (std::size_t b = 0; b < c.elems; b += kStatePieceElems) {
          const std::size_t n = std::min(kStatePieceElems, c.elems - b);
          source(g, static_cast<int>(a), c.begin + b, std::span<float>(chunk + a * c.elems + b, n));
        }
      }
      if (off.opt_tier == Tier::Nvme) {
        off.store->write_now(key, staging.as<std::byte>(), bytes);
        off.store->count_written(bytes);
      }
      const void* wvalues = w.convert(chunk, working_dtype_, c.elems);
      const std::size_t pbytes = wbytes * c.elems;
      if (off.params && G.plan.sharded_params) {
        const std::string pkey = ZeroOffload::param_key(g, k);
        if (off.param_tier == Tier::Host) {
          std::memcpy(off.store->host(pkey, pbytes).data(), wvalues, pbytes);
        } else {
          std::memcpy(param_staging.data(), wvalues, pbytes);
          off.store->write_now(pkey, param_staging.as<std::byte>(), pbytes);
          off.store->count_written(pbytes);
        }
      } else {
        std::byte* dev = G.plan.sharded_params ? G.w_shard.as<std::byte>() + c.begin * wbytes
                                          : G.w_full.as<std::byte>() + (G.plan.state_offset + c.begin) * wbytes;
        comm_stream_->copy_h2d(dev, wvalues, pbytes);
        comm_stream_->synchronize();  // the staging is reused by the next chunk
      }
    }
  }
}

// Groups whose W is a full resident copy gather every shard's new values into it, as step() does.
void ZeroEngine::publish_imported_weights() {
  const std::size_t wbytes = dtype_bytes(working_dtype_);
  for (auto& G : groups_) {
    if (G->plan.sharded_params || plan_.stage == 0 || G->layout.shard_count() == 1 || G->w_full.empty()) continue;
    shard_comm_->all_gather(G->w_full.as<char>() + G->plan.state_offset * wbytes, G->w_full.data(), G->layout.shard_elems(),
                            working_dtype_, *comm_stream_);
  }
  comm_stream_->record(*impl_->weights_event);
  impl_->weights_event_recorded = true;
  comm_stream_->synchronize();
}

}  // namespace strata
