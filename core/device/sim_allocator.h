// The sim device's memory: one arena of host memory behind a hard capacity cap, carved up by a
// best-fit allocator with split and merge, and the statistics MemoryStats reports.
//
// Note [Sim arena]: the capacity is counted, as on cuda (Note [Cuda capacity] in
// core/device/cuda_state_cuda.cc): a request fails when the bytes allocated plus the request would pass
// the capacity, never because the free bytes are in pieces. Placement is best fit (the smallest free
// block that fits, the lowest address among equals) in an arena of kSimArenaHeadroom times the
// capacity, so fragmentation cannot decide an out-of-memory as the cuda pool's cannot (it grows past
// its own fragmentation). Why not a strict best-fit arena of the capacity itself: where a block lands
// depends on which queued frees (Stream::release_after, frees on host threads) had run when it was
// placed, i.e. on timing, so a fragmentation failure came and went with the machine's load
// (train_offload_cli's 1792 KiB device failed 1 run in 8 at load 3) and two ranks could decide an
// eviction differently and pair their collectives wrongly (Note [Deterministic prefetch] in
// engine/param_fetcher.cc needs the decision to depend on the bytes only). The arena is reserved
// once with mmap(MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE), so even a cap of many GiB costs address
// space only; pages become resident when first written. Every block's offset and size are multiples
// of the alignment, so every pointer handed out is aligned. Free blocks are kept twice: by offset (to
// merge with their neighbours on release) and by (size, offset) for the best fit. Should the arena
// itself have no block large enough (a pattern that shatters 4x the capacity), the request fails
// saying so.
//
// Note [Freed pages]: in release builds the page-aligned interior of a freed block of at least
// `release_pages_min_bytes` goes back to the OS (madvise MADV_DONTNEED), so the process's RSS
// tracks live allocations, not the peak. With STRATA_DEBUG_POISON (Debug builds) freed memory is
// instead filled with kSimPoisonByte, so a read through a dangling pointer shows up as 0xDB bytes
// rather than as plausible old data; whole pages that are not resident (never written: they read
// as zeros and hold no stale data) are skipped, so freeing a huge untouched block commits nothing.
// Both happen under the allocator's mutex: done outside it, a
// concurrent allocation could receive the block and have its fresh contents zapped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "core/device/device.h"

namespace strata {

inline constexpr unsigned char kSimPoisonByte = 0xDB;
inline constexpr std::size_t kSimArenaHeadroom = 4;  // Note [Sim arena]

struct SimAllocatorOptions {
  std::string device_name = "sim:0";   // used in error messages and the usage report
  std::size_t capacity_bytes = 0;      // rounded down to the alignment
  std::size_t alignment_bytes = 256;   // power of two; raised to at least 256
  std::size_t release_pages_min_bytes = std::size_t{1} << 20;  // Note [Freed pages]
  std::string capacity_knob = "strata.device.memory";  // what sets the capacity, named in errors
};

// Thread-safe: every public member may be called from any thread.
class SimAllocator {
 public:
  // Throws ConfigError for a bad alignment or a capacity below one aligned block, DeviceError if
  // the address space cannot be reserved.
  explicit SimAllocator(const SimAllocatorOptions& options);
  ~SimAllocator();
  SimAllocator(const SimAllocator&) = delete;
  SimAllocator& operator=(const SimAllocator&) = delete;

  // Returns `bytes` (rounded up to the alignment) of arena memory. Throws DeviceError for zero
  // bytes and OutOfMemoryError (usage report + request) when no free block is large enough; a
  // failed allocation changes nothing but the failure count.
  void* allocate(std::size_t bytes, std::string_view tag);
  // Frees a pointer returned by allocate. An unknown pointer (a double free) is reported on
  // stderr and ignored: it is a caller bug, but this runs in destructors and must not throw.
  void release(void* ptr) noexcept;

  MemoryStats stats() const;  // pinned_host_bytes is left 0: the device fills it in
  void reset_peak();

  // True when [ptr, ptr + bytes) lies inside the arena (bytes == 0: ptr inside or at its end); the arena
  // is kSimArenaHeadroom times the capacity (Note [Sim arena]).
  bool contains(const void* ptr, std::size_t bytes) const;
  // Size of the live allocation at `ptr` (after rounding), 0 if `ptr` is not one.
  std::size_t allocation_bytes(const void* ptr) const;

  // Note [Released memory]: CUDA forbids work issued after cudaFreeAsync returns from naming the
  // memory, even work that would run before the free in stream order (cudaMemcpyAsync then fails
  // with "invalid argument", as seen on a GPU: docs/MEASUREMENTS.md, "On the GPU"). retire(ptr)
  // marks the live allocation at ptr as freed from now on for that purpose, though its bytes stay
  // until release(); usable() is empty when [ptr, ptr + bytes) lies inside one live allocation that
  // is not retired, else it says why. Memory that a host thread still copies is freed by that
  // thread once its copies completed (Note [Host-driven offload] in docs/DESIGN.md), never released before them.
  void retire(const void* ptr) noexcept;
  std::string usable(const void* ptr, std::size_t bytes) const;

  std::byte* arena_base() const { return base_; }
  std::size_t capacity_bytes() const { return capacity_bytes_; }
  std::size_t arena_bytes() const { return arena_bytes_; }  // where blocks may lie (Note [Sim arena])
  std::size_t alignment_bytes() const { return alignment_bytes_; }
  const std::string& device_name() const { return name_; }

 private:
  struct Block {
    std::size_t bytes = 0;
    bool free = true;
    std::string tag;  // set while in use
    bool retired = false;  // release_after was called (Note [Released memory])
  };
  using BlockMap = std::map<std::size_t, Block>;  // offset -> block; blocks tile the arena

  void insert_free(std::size_t offset, std::size_t bytes);
  void erase_free(std::size_t offset, std::size_t bytes);
  void scrub_freed(std::size_t freed_offset, std::size_t freed_bytes, std::size_t merged_offset,
                   std::size_t merged_bytes);
  MemoryStats stats_locked() const;

  const std::string name_;
  const std::size_t alignment_bytes_;
  const std::size_t capacity_bytes_;
  std::size_t arena_bytes_ = 0;  // kSimArenaHeadroom * capacity_bytes_
  const std::size_t release_pages_min_bytes_;
  void* map_base_ = nullptr;
  std::size_t map_bytes_ = 0;
  std::byte* base_ = nullptr;  // aligned start of the arena inside the mapping

  mutable std::mutex mutex_;
  BlockMap blocks_;
  std::set<std::pair<std::size_t, std::size_t>> free_by_size_;  // (bytes, offset)
  std::size_t allocated_bytes_ = 0;
  std::size_t peak_allocated_bytes_ = 0;
  std::size_t live_allocations_ = 0;
  std::uint64_t total_allocations_ = 0;
  std::uint64_t failed_allocations_ = 0;
  std::map<std::string, std::size_t, std::less<>> bytes_by_tag_;
  std::map<std::string, std::size_t, std::less<>> peak_bytes_by_tag_;
};

}  // namespace strata
