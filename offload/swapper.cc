// The async swapper (see offload/swapper.h).
#include "offload/swapper.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"

namespace strata::offload {

Swapper::Swapper(SwapStore& store, BufferPool& pool, const SwapperOptions& options)
    : store_(store), pool_(pool), options_(options) {
  if (options_.max_inflight_bytes == 0) throw ConfigError("swapper: max in-flight bytes is 0; give a bound");
}

Swapper::~Swapper() { drain(); }

bool Swapper::direct_ok(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % 4096 == 0 && bytes % 4096 == 0;
}

void Swapper::acquire_budget(std::size_t bytes) {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return inflight_ops_ == 0 || inflight_bytes_ + bytes <= options_.max_inflight_bytes; });
  inflight_bytes_ += bytes;
  ++inflight_ops_;
  peak_inflight_bytes_ = std::max(peak_inflight_bytes_, inflight_bytes_);
}

void Swapper::release_budget(std::size_t bytes) {
  {
    std::lock_guard lock(mutex_);
    inflight_bytes_ -= bytes;
    --inflight_ops_;
  }
  cv_.notify_all();
}

void Swapper::drain() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return inflight_ops_ == 0; });
}

std::size_t Swapper::inflight_bytes() const {
  std::lock_guard lock(mutex_);
  return inflight_bytes_;
}

std::size_t Swapper::peak_inflight_bytes() const {
  std::lock_guard lock(mutex_);
  return peak_inflight_bytes_;
}

IoHandle Swapper::swap_out(const std::string& key, std::span<const std::byte> src) {
  if (src.empty()) throw ConfigError(fmt::format("swap_out of '{}': the tensor is empty", key));
  const std::size_t padded = SwapStore::padded(src.size());
  const bool direct = direct_ok(src.data(), src.size());
  if (!direct && padded > pool_.slot_bytes()) {
    throw ConfigError(fmt::format("swap_out of '{}': {} does not fit a {} staging buffer; raise the buffer pool slot "
                                  "size or pass 4 KiB-aligned memory",
                                  key, format_bytes(src.size()), format_bytes(pool_.slot_bytes())));
  }
  acquire_budget(padded);
  auto lease = std::make_shared<BufferLease>();
  try {
    std::span<const std::byte> data = src;
    if (!direct) {
      *lease = pool_.acquire();
      std::memcpy(lease->data(), src.data(), src.size());
      std::memset(lease->data() + src.size(), 0, padded - src.size());  // deterministic padding on disk
      data = lease->span().first(padded);
    }
    // The slot and the budget go back before the handle completes, so a finished handle means
    // this swap holds nothing any more.
    return store_.write(key, data, src.size(), [this, lease, padded](std::exception_ptr&) {
      lease->reset();
      release_budget(padded);
    });
  } catch (...) {
    lease->reset();
    release_budget(padded);
    throw;
  }
}

IoHandle Swapper::swap_in(const std::string& key, std::span<std::byte> dst) {
  const std::size_t stored = store_.size_bytes(key);
  if (dst.size() != stored) {
    throw ConfigError(fmt::format("swap_in of '{}': the destination holds {} bytes but the tensor has {}", key,
                                  dst.size(), stored));
  }
  const std::size_t padded = SwapStore::padded(stored);
  const bool direct = direct_ok(dst.data(), dst.size());
  if (!direct && padded > pool_.slot_bytes()) {
    throw ConfigError(fmt::format("swap_in of '{}': {} does not fit a {} staging buffer; raise the buffer pool slot "
                                  "size or pass 4 KiB-aligned memory",
                                  key, format_bytes(stored), format_bytes(pool_.slot_bytes())));
  }
  acquire_budget(padded);
  auto lease = std::make_shared<BufferLease>();
  try {
    if (direct) {
      return store_.read(key, dst, [this, padded](std::exception_ptr&) { release_budget(padded); });
    }
    *lease = pool_.acquire();
    return store_.read(key, lease->span(), [this, lease, dst, padded](std::exception_ptr& error) {
      // Only verified bytes reach the caller's memory.
      if (!error) std::memcpy(dst.data(), lease->data(), dst.size());
      lease->reset();
      release_budget(padded);
    });
  } catch (...) {
    lease->reset();
    release_budget(padded);
    throw;
  }
}

void Swapper::stream_keys(std::span<const std::string> keys, WriteBack write_back,
                          const std::function<void(std::size_t, std::span<std::byte>)>& work) {
  if (keys.empty()) return;
  if (pool_.slot_count() < 3) {
    throw ConfigError(fmt::format("stream_keys needs 3 buffer pool slots (read-ahead, work, write-behind); the pool "
                                  "has {}",
                                  pool_.slot_count()));
  }
  std::vector<std::size_t> sizes(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    sizes[i] = store_.size_bytes(keys[i]);
    if (SwapStore::padded(sizes[i]) > pool_.slot_bytes()) {
      throw ConfigError(fmt::format("stream_keys: '{}' ({}) does not fit a {} buffer pool slot; raise the slot size",
                                    keys[i], format_bytes(sizes[i]), format_bytes(pool_.slot_bytes())));
    }
  }
  std::vector<IoHandle> writes;
  auto finish = [&] {
    // Every started transfer ends before the leases they use go away.
    for (const IoHandle& h : writes) h.wait_error();
  };
  BufferLease current = pool_.acquire();
  IoHandle current_read = store_.read(keys[0], current.span());
  try {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      BufferLease next;
      IoHandle next_read;
      if (i + 1 < keys.size()) {
        next = pool_.acquire();  // blocks while write-behind still holds the third slot
        next_read = store_.read(keys[i + 1], next.span());
      }
      try {
        current_read.wait();
      } catch (...) {
        if (next_read.valid()) next_read.wait_error();
        throw;
      }
      std::span<std::byte> bytes = current.span().first(sizes[i]);
      try {
        work(i, bytes);
      } catch (...) {
        if (next_read.valid()) next_read.wait_error();
        throw;
      }
      if (write_back == WriteBack::On) {
        auto held = std::make_shared<BufferLease>(std::move(current));
        const std::size_t padded = SwapStore::padded(sizes[i]);
        std::memset(held->data() + sizes[i], 0, padded - sizes[i]);
        writes.push_back(store_.write(keys[i], held->span().first(padded), sizes[i],
                                      [held](std::exception_ptr&) { held->reset(); }));
      } else {
        current.reset();
      }
      current = std::move(next);
      current_read = next_read;
    }
  } catch (...) {
    finish();
    throw;
  }
  finish();
  wait_all(writes);
}

}  // namespace strata::offload
