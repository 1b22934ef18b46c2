// Host and NVMe tiers of the ZeRO engine: named byte arrays that live in host memory or in the
// NVMe swap store, and the chunk pipeline that streams them through a fixed pool of pinned buffers.
//
// The engine keeps each rank's optimizer state, offloaded gradients and offloaded parameter shards
// as *chunks*: a param group's state range split into pieces of at most `chunk_elems` elements
// (a multiple of the CPU optimizer's block, so chunks never split an optimizer or norm block). A
// chunk's arrays are keys of a TierStore; each key lives on the tier it was declared on.
//
// Note [Chunk pipeline]: work over many chunks (the optimizer step, a micro-batch's gradient
// combine) is a list of ChunkJobs. A job names the arrays it reads, writes or needs as scratch,
// and a function that runs over them. run() keeps up to `depth` jobs in flight: it issues the NVMe
// reads of jobs i+1..i+depth-1 while job i runs, and job i's writes go out behind it while later
// jobs run (write-behind); a job whose arrays are all host-resident runs in place with no copy.
// NVMe and scratch arrays of a job share one slot of the BufferPool, so host memory used for
// staging is slot_count * slot_bytes whatever the model size, and a slot goes back to the pool
// only when the writes from it have completed. Jobs run on the calling thread, in order.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/host_buffer.h"
#include "offload/buffer_pool.h"
#include "offload/io_engine.h"
#include "offload/swap_store.h"
#include "plan/home.h"

namespace strata {

// A tier store holds arrays whose home (plan/home.h) is the host or NVMe: `home` itself, or an
// InternalError for Device (an array the plan keeps on the device never reaches a tier store).
Home tier_home(Home home);

struct TierIoStats {
  std::uint64_t nvme_bytes_read = 0;
  std::uint64_t nvme_bytes_written = 0;
  std::uint64_t host_bytes = 0;       // resident host arrays now
  std::uint64_t peak_host_bytes = 0;
  std::uint64_t nvme_bytes = 0;       // stored in the swap store now
  std::uint64_t peak_nvme_bytes = 0;
};

class TierStore {
 public:
  // `swap` may be null when nothing is declared on NVMe; `pinner` page-locks the host arrays a
  // device stream copies from (see host()).
  TierStore(offload::SwapStore* swap, HostMemoryPinner* pinner);
  ~TierStore();
  TierStore(const TierStore&) = delete;
  TierStore& operator=(const TierStore&) = delete;

  // Host arrays: created zero-filled on first use, page-aligned, freed by remove(). `device_copies`:
  // a device stream copies to or from the array, so it is page-locked (through the pinner, if any)
  // when created, at set-up (Note [Pinning while streams run] in core/device/sim_device.cc). Arrays
  // only the CPU touches stay pageable.
  std::span<std::byte> host(const std::string& key, std::size_t bytes, bool device_copies = false);
  void remove(const std::string& key);

  offload::SwapStore& swap() const;
  bool has_swap() const { return swap_ != nullptr; }

  // Synchronous whole-key NVMe transfers for set-up and inspection (padded buffers, see SwapStore).
  void write_now(const std::string& key, std::span<const std::byte> padded, std::size_t bytes);
  void read_now(const std::string& key, std::span<std::byte> padded);

  void count_read(std::size_t bytes) { read_bytes_ += bytes; }
  void count_written(std::size_t bytes) { written_bytes_ += bytes; }
  TierIoStats stats() const;
  void note_nvme_usage();

 private:
  offload::SwapStore* swap_;
  HostMemoryPinner* pinner_;
  mutable std::mutex mutex_;
  std::map<std::string, HostBuffer> host_;
  std::uint64_t host_bytes_ = 0;
  std::uint64_t peak_host_bytes_ = 0;
  std::uint64_t peak_nvme_bytes_ = 0;
  std::atomic<std::uint64_t> read_bytes_{0};
  std::atomic<std::uint64_t> written_bytes_{0};
};

// One array a job touches.
struct ChunkField {
  enum Kind : std::uint8_t {
    Read,       // read before the job runs; not written back
    Update,     // read, then written back after the job
    Write,      // written after the job (contents undefined when the job starts)
    Scratch,    // neither: job-local memory (host arrays are never scratch)
  };
  std::string key;  // empty for Scratch
  Home tier = Home::Host;  // Host or Nvme (tier_home)
  std::size_t bytes = 0;
  Kind kind = Read;
};

struct ChunkJob {
  std::vector<ChunkField> fields;
  // Runs with one span per field, in order (each at least `bytes` long, 4 KiB-aligned).
  std::function<void(std::span<const std::span<std::byte>> fields)> work;
  std::vector<std::string> remove_after;  // keys to drop once the job ran (consumed partial sums)
  // (optional) Runs right after `work`, before the job's writes go out: another asynchronous use of
  // the fields' bytes (a checkpoint write). It must pass `done` as the I/O callback of the handle it
  // returns; the job's slot stays on loan until then, and run() waits for the handle.
  std::function<offload::IoHandle(std::span<const std::span<std::byte>> fields, offload::IoCallback done)> also;
};

class ChunkPipeline {
 public:
  ChunkPipeline(TierStore& store, offload::BufferPool& pool);
  // Bytes of one slot a job needs: its NVMe and scratch fields, each padded to 4 KiB.
  static std::size_t slot_bytes_needed(const ChunkJob& job);
  // Runs every job (see Note [Chunk pipeline]); returns when all their writes completed; rethrows the
  // first error (work or I/O) after everything in flight finished.
  void run(std::vector<ChunkJob>& jobs);

 private:
  TierStore& store_;
  offload::BufferPool& pool_;
};

}  // namespace strata
