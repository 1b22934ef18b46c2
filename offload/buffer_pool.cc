// A fixed pool of pinned host staging buffers (see offload/buffer_pool.h).
#include "offload/buffer_pool.h"

#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "offload/io_engine.h"

namespace strata::offload {

BufferLease::BufferLease(BufferLease&& o) noexcept
    : pool_(std::exchange(o.pool_, nullptr)), slot_(o.slot_), span_(std::exchange(o.span_, {})) {}

BufferLease& BufferLease::operator=(BufferLease&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = std::exchange(o.pool_, nullptr);
    slot_ = o.slot_;
    span_ = std::exchange(o.span_, {});
  }
  return *this;
}

void BufferLease::reset() {
  if (pool_ != nullptr) std::exchange(pool_, nullptr)->give_back(slot_);
  span_ = {};
}

std::size_t BufferPool::rounded_slot_bytes(std::size_t requested) {
  constexpr std::size_t kHuge = 2 * MiB;
  return (requested + kHuge - 1) / kHuge * kHuge;
}

BufferPool::BufferPool(const BufferPoolOptions& options, IoEngine* engine) {
  if (options.slot_count == 0 || options.slot_bytes == 0) {
    throw ConfigError(fmt::format("buffer pool of {} slots of {} bytes is empty; give both a count and a size",
                                  options.slot_count, options.slot_bytes));
  }
  constexpr std::size_t kHuge = 2 * MiB;
  slot_bytes_ = rounded_slot_bytes(options.slot_bytes);
  slots_ = options.slot_count;
  HostBufferOptions ho;
  ho.alignment_bytes = kHuge;  // transparent huge pages need 2 MiB-aligned virtual ranges
  ho.huge_pages = options.huge_pages;
  ho.pinner = options.pinner;
  memory_ = HostBuffer::allocate(slot_bytes_ * slots_, ho);
  std::memset(memory_.data(), 0, memory_.size_bytes());  // fault the pages in now, not in the I/O path
  for (std::size_t i = 0; i < slots_; ++i) free_.push_back(slots_ - 1 - i);
  if (engine != nullptr) {
    const std::span<std::byte> all[] = {memory_.as<std::byte>()};
    engine->register_buffers(all);
  }
}

BufferPool::~BufferPool() {
  std::lock_guard lock(mutex_);
  STRATA_CHECK(free_.size() == slots_ || std::uncaught_exceptions() > 0,
               "buffer pool destroyed with {} of {} slots still on loan", slots_ - free_.size(), slots_);
}

BufferLease BufferPool::acquire() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !free_.empty(); });
  const std::size_t slot = free_.back();
  free_.pop_back();
  return BufferLease(this, slot, memory_.as<std::byte>().subspan(slot * slot_bytes_, slot_bytes_));
}

bool BufferPool::try_acquire(BufferLease* lease) {
  std::lock_guard lock(mutex_);
  if (free_.empty()) return false;
  const std::size_t slot = free_.back();
  free_.pop_back();
  *lease = BufferLease(this, slot, memory_.as<std::byte>().subspan(slot * slot_bytes_, slot_bytes_));
  return true;
}

std::size_t BufferPool::free_slots() const {
  std::lock_guard lock(mutex_);
  return free_.size();
}

void BufferPool::give_back(std::size_t slot) {
  {
    std::lock_guard lock(mutex_);
    free_.push_back(slot);
  }
  cv_.notify_one();
}

}  // namespace strata::offload
