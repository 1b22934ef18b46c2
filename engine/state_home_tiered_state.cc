// Checkpoints of the optimizer state on host memory or NVMe (engine/state_home_tiered.h): pieces
// handed out from where they already are, the capture during a step, the import.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "engine/state_home_tiered.h"
#include "engine/working_weights.h"

namespace strata {

// Note [Checkpoint capture]: a checkpoint of NVMe-resident state would read every chunk back from
// the swap file (Note [Checkpoint copy] in engine/zero_engine_state.cc), but the step before it
// already holds each chunk in a pinned slot right after the optimizer updated it. When the trainer
// knows a checkpoint follows the step (an interval in steps, the last step), it arms the step with
// capture_next_step: each update job then hands its new state to the checkpoint's sink before the
// slot's write-behind goes out, and the slot returns to the pool only when both writes completed.
// The checkpoint costs one write of the state, overlapped with backward where the update is, and
// no read. Bits are the same as a copy after the step: the bytes are the ones written to the tier.
void TieredStateHome::add_capture(ChunkJob& job, std::size_t g, std::size_t k, std::size_t field, std::size_t bytes) {
  if (!capture_) return;
  const std::size_t index = capture_first_[g] + k;
  job.also = [this, index, field, bytes](std::span<const std::span<std::byte>> f, offload::IoCallback done) {
    const std::size_t padded = offload::SwapStore::padded(bytes);
    std::byte* data = f[field].data();
    std::memset(data + bytes, 0, padded - bytes);  // a slot's stale tail; host arrays' padding is zero already
    captured_.fetch_add(1);
    return capture_(index, std::span<const std::byte>(data, padded), std::move(done));
  };
}

bool TieredStateHome::arm_capture(StateCaptureSink sink) {
  if (!sink) {
    capture_ = nullptr;  // disarms; captured_pieces() keeps what the last step handed out
    return false;
  }
  capture_first_.assign(ctx_.group_count(), 0);
  std::size_t pieces = 0;
  for (std::size_t g = 0; g < ctx_.group_count(); ++g) {
    capture_first_[g] = pieces;
    pieces += ctx_.group(g).chunks.size();
  }
  captured_ = 0;
  capture_ = std::move(sink);
  return true;
}

std::vector<StateChunkInfo> TieredStateHome::pieces() const {
  std::vector<StateChunkInfo> out;
  for (std::size_t g = 0; g < ctx_.group_count(); ++g) {
    for (const StateChunk& c : ctx_.group(g).chunks) out.push_back({g, c.begin, c.elems});
  }
  return out;
}

std::size_t TieredStateHome::export_depth() const {
  return ctx_.plan.state_on_nvme() ? std::max<std::size_t>(pool_->slot_count(), 1) : 4;
}

// A host-tier chunk is handed out from its host array (padded, its padding never written: zero);
// an NVMe chunk is read into a pinned slot of the optimizer's pool.
StatePiece TieredStateHome::fetch_piece(std::size_t /*index*/, const StateChunkInfo& c,
                                        std::vector<HostBuffer>& /*spare*/) {
  const std::vector<StateChunk>& chunks = ctx_.group(c.group).chunks;
  const auto it = std::find_if(chunks.begin(), chunks.end(), [&](const StateChunk& s) { return s.begin == c.begin_elems; });
  STRATA_CHECK(it != chunks.end(), "no state chunk at element {} of group {}", c.begin_elems, c.group);
  const auto k = static_cast<std::size_t>(it - chunks.begin());
  const std::string key = state_key(c.group, k);
  StatePiece p;
  p.meaningful = state_bytes(c.elems);
  const std::size_t padded = offload::SwapStore::padded(p.meaningful);
  if (state_tier(c.group, k) == Home::Nvme) {
    p.lease = pool_->acquire();
    p.bytes = p.lease.span().first(padded);
    p.read = store_->swap().read(key, p.bytes);
    store_->count_read(p.meaningful);
  } else {
    p.bytes = store_->host(key, p.meaningful).first(padded);
  }
  return p;
}

std::vector<float> TieredStateHome::master_range(std::size_t g) {
  executor_->drain();
  const GroupPlan& P = ctx_.group(g);
  std::vector<float> out(P.state_elems);
  HostBuffer staging;
  if (swap_) staging = HostBuffer::allocate(offload::SwapStore::padded(state_bytes(chunk_elems_)));
  for (std::size_t k = 0; k < P.chunks.size(); ++k) {
    const StateChunk& c = P.chunks[k];
    const std::byte* src = nullptr;
    if (state_tier(g, k) == Home::Host) {
      src = store_->host(state_key(g, k), state_bytes(c.elems)).data();
    } else {
      store_->read_now(state_key(g, k), staging.as<std::byte>());
      src = static_cast<const std::byte*>(staging.data());
    }
    std::memcpy(out.data() + c.begin, src, 4 * c.elems);
  }
  return out;
}

// Chunk by chunk: the state arrays from `source` onto the optimizer tier, then W of the chunk from
// the new master onto the parameter tier or the device copy.
void TieredStateHome::import_state(const StateSource& source) {
  const auto nstate = static_cast<std::size_t>(nstate_);
  const std::size_t wbytes = ctx_.wbytes();
  HostBuffer staging;
  HostBuffer param_staging;
  if (swap_) {
    staging = HostBuffer::allocate(offload::SwapStore::padded(state_bytes(chunk_elems_)));
    param_staging = HostBuffer::allocate(offload::SwapStore::padded(wbytes * chunk_elems_));
  }
  WorkingCopy w;
  for (std::size_t g = 0; g < ctx_.group_count(); ++g) {
    const GroupPlan& P = ctx_.group(g);
    for (std::size_t k = 0; k < P.chunks.size(); ++k) {
      const StateChunk& c = P.chunks[k];
      const std::size_t bytes = state_bytes(c.elems);
      const std::string key = state_key(g, k);
      const Home tier = state_tier(g, k);
      float* chunk = tier == Home::Host ? reinterpret_cast<float*>(store_->host(key, bytes).data())
                                        : staging.as<float>().data();
      for (std::size_t a = 0; a < nstate; ++a) {
        for (std::size_t b = 0; b < c.elems; b += kStatePieceElems) {
          const std::size_t n = std::min(kStatePieceElems, c.elems - b);
          source(g, static_cast<int>(a), c.begin + b, std::span<float>(chunk + a * c.elems + b, n));
        }
      }
      if (tier == Home::Nvme) {
        store_->write_now(key, staging.as<std::byte>(), bytes);
        store_->count_written(bytes);
      }
      const void* wvalues = w.convert(chunk, ctx_.working(), c.elems);
      const std::size_t pbytes = wbytes * c.elems;
      if (params_ && P.sharded_params) {
        const std::string pkey = param_key(g, k);
        if (weights_tier(g, k) == Home::Host) {
          std::memcpy(store_->host(pkey, pbytes, /*device_copies=*/true).data(), wvalues, pbytes);
        } else {
          std::memcpy(param_staging.data(), wvalues, pbytes);
          store_->write_now(pkey, param_staging.as<std::byte>(), pbytes);
          store_->count_written(pbytes);
        }
      } else {
        auto* dev = static_cast<std::byte*>(weights_.state_range(g));
        ctx_.comm.copy_h2d(dev + c.begin * wbytes, wvalues, pbytes);
        ctx_.comm.synchronize();  // the staging is reused by the next chunk
      }
    }
  }
}

}  // namespace strata
