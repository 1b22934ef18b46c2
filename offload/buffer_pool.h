// A fixed pool of pinned, 4 KiB-aligned host buffers for NVMe staging.
//
// The pool is sized once (slot count x slot size), independent of the model, so host memory
// stays bounded however many tensors are swapped. It is one HostBuffer backed by 2 MiB huge
// pages where the kernel has them (see Note [Request size and merging] in offload/uring_engine.cc:
// contiguous pages let one kernel request carry 4 MiB), page-locked through the device's pinner
// when one is given, and registered with the I/O engine as fixed buffers. acquire() blocks until
// a slot is free; the returned lease gives the slot back when destroyed.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <span>
#include <vector>

#include "core/host_buffer.h"

namespace strata::offload {

class IoEngine;
class BufferPool;

// One slot on loan; move-only; returns the slot to the pool on destruction.
class BufferLease {
 public:
  BufferLease() = default;
  BufferLease(BufferLease&& o) noexcept;
  BufferLease& operator=(BufferLease&& o) noexcept;
  BufferLease(const BufferLease&) = delete;
  BufferLease& operator=(const BufferLease&) = delete;
  ~BufferLease() { reset(); }

  std::span<std::byte> span() const { return span_; }
  std::byte* data() const { return span_.data(); }
  std::size_t size_bytes() const { return span_.size(); }
  bool valid() const { return pool_ != nullptr; }
  void reset();

 private:
  friend class BufferPool;
  BufferLease(BufferPool* pool, std::size_t slot, std::span<std::byte> span) : pool_(pool), slot_(slot), span_(span) {}
  BufferPool* pool_ = nullptr;
  std::size_t slot_ = 0;
  std::span<std::byte> span_;
};

struct BufferPoolOptions {
  std::size_t slot_count = 4;
  std::size_t slot_bytes = 64 * 1024 * 1024;  // rounded up to 2 MiB
  HugePages huge_pages = HugePages::Transparent;
  HostMemoryPinner* pinner = nullptr;
};

class BufferPool {
 public:
  // Allocates and faults in the whole pool; registers it with `engine` (optional) as fixed buffers.
  explicit BufferPool(const BufferPoolOptions& options, IoEngine* engine = nullptr);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  BufferLease acquire();                 // blocks until a slot is free
  bool try_acquire(BufferLease* lease);  // false when all slots are on loan
  std::size_t slot_bytes() const { return slot_bytes_; }
  std::size_t slot_count() const { return slots_; }
  // The size a slot asked for as `requested` bytes really has (whole 2 MiB huge pages).
  static std::size_t rounded_slot_bytes(std::size_t requested);
  std::size_t free_slots() const;

 private:
  friend class BufferLease;
  void give_back(std::size_t slot);

  HostBuffer memory_;
  std::size_t slot_bytes_ = 0;
  std::size_t slots_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::size_t> free_;
};

}  // namespace strata::offload
