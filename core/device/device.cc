// Backend-independent parts of the Device abstraction (see core/device/device.h).
#include "core/device/device.h"

#include <utility>

#include <fmt/format.h>

#include "core/units.h"

namespace strata {

std::string_view device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::Sim: return "sim";
    case DeviceKind::Cuda: return "cuda";
  }
  return "?";
}

double MemoryStats::fragmentation() const {
  if (free_bytes == 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free_block_bytes) / static_cast<double>(free_bytes);
}

std::string format_memory_report(std::string_view device_name, const MemoryStats& s) {
  std::string out = fmt::format(
      "{} memory: capacity {}, allocated {} in {} allocations (peak {}), free {}, largest free block {} "
      "(fragmentation {:.1f}%), pinned host {}",
      device_name, format_bytes(s.capacity_bytes), format_bytes(s.allocated_bytes), s.live_allocations,
      format_bytes(s.peak_allocated_bytes), format_bytes(s.free_bytes), format_bytes(s.largest_free_block_bytes),
      100.0 * s.fragmentation(), format_bytes(s.pinned_host_bytes));
  if (!s.bytes_by_tag.empty()) {
    out += "\n  by tag (live / peak):";
    for (const auto& [tag, bytes] : s.bytes_by_tag) {
      auto peak = s.peak_bytes_by_tag.find(tag);
      out += fmt::format("\n    {:<24} {:>12} / {}", tag, format_bytes(bytes),
                         format_bytes(peak != s.peak_bytes_by_tag.end() ? peak->second : bytes));
    }
  }
  return out;
}

DeviceMemory::DeviceMemory(DeviceMemory&& other) noexcept { *this = std::move(other); }

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    owner_ = std::move(other.owner_);
    other.owner_.reset();
  }
  return *this;
}

void DeviceMemory::reset() noexcept {
  if (ptr_ != nullptr) {
    if (auto owner = owner_.lock()) owner->release(ptr_);
  }
  ptr_ = nullptr;
  bytes_ = 0;
  owner_.reset();
}

}  // namespace strata
