// What the sim device shares with its DeviceMemory, Streams and Events: the arena, the modeled
// links, the pin registry and the counters MemoryStats reports, and the checks every call makes
// (the Device still alive; nothing that waits inside a sim kernel). Internal to the sim backend
// (core/device/sim_*.{h,cc}).
//
// Note [Sim lifetimes]: the Device owns a shared SimDeviceState (arena, links, pin registry).
// DeviceMemory, Stream and Event hold it weakly, so every call after the Device is gone finds the
// state expired (or marked destroyed) and throws DeviceError, and destroying them afterwards does
// nothing harmful. A stream's worker pins the state only while it runs one task, so an arena is
// never unmapped under a copy that is in flight; work still queued when the Device dies fails with
// the same "destroyed" error instead of touching freed memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "core/device/device.h"
#include "core/device/schedule_chaos.h"
#include "core/device/sim_allocator.h"
#include "core/device/sim_link.h"
#include "core/error.h"

namespace strata::sim_backend {

// What DeviceMemory, Stream and Event share with the Device (Note [Sim lifetimes]).
class SimDeviceState final : public detail::DeviceMemoryReleaser {
 public:
  explicit SimDeviceState(const SimDeviceOptions& o)
      : name(fmt::format("sim:{}", o.ordinal)),
        allocator(SimAllocatorOptions{.device_name = name, .capacity_bytes = o.capacity_bytes,
                                      .alignment_bytes = o.alignment_bytes, .capacity_knob = o.capacity_knob}),
        h2d(o.h2d_gbps, o.latency_us),
        d2h(o.d2h_gbps, o.latency_us),
        d2d(o.d2d_gbps, o.latency_us),
        chaos_seed(o.chaos_seed),
        chaos_max_us(o.chaos_max_us) {}

  void release(void* ptr) noexcept override { allocator.release(ptr); }

  // Each stream's own generator (Note [Schedule chaos] in core/device/schedule_chaos.h), seeded
  // from the device's seed and the stream's creation index.
  ScheduleChaos chaos_for_next_stream() {
    const std::uint64_t index = streams_created.fetch_add(1);
    return ScheduleChaos(chaos_seed == 0 ? 0 : chaos_seed * 0x9E3779B97F4A7C15ULL + index + 1, chaos_max_us);
  }

  const std::string name;
  SimAllocator allocator;
  ModeledLink h2d;
  ModeledLink d2h;
  ModeledLink d2d;
  std::atomic<Device*> device{nullptr};  // null once the Device is destroyed
  const std::uint64_t chaos_seed;
  const double chaos_max_us;
  std::atomic<std::uint64_t> streams_created{0};

  std::mutex pinned_mutex;
  std::map<const void*, std::size_t> pinned;  // ptr -> bytes
  std::size_t pinned_bytes = 0;

  std::uint64_t pageable_copies = 0;  // under pinned_mutex, as the registry they are judged by
  std::uint64_t pageable_copy_bytes = 0;
  std::uint64_t host_pins = 0;  // under pinned_mutex (Note [Pinning while streams run] in core/device/sim_device.cc)

  bool pinned_range(const void* ptr, std::size_t bytes) {
    std::lock_guard lock(pinned_mutex);
    return detail::inside_one_range(pinned, ptr, bytes);
  }
  void count_pageable(std::size_t bytes) {
    std::lock_guard lock(pinned_mutex);
    ++pageable_copies;
    pageable_copy_bytes += bytes;
  }
};

// True on a sim stream's worker thread, where kernels run (Note [Sim kernels] in
// core/device/sim_kernel.h). Defined in core/device/sim_stream.cc, whose workers set it.
bool& on_sim_stream_worker() noexcept;

// What a GPU kernel cannot do (see Note [Sim kernels] in core/device/sim_kernel.h), a sim kernel may not do
// either: throws DeviceError, naming `what`, on a sim stream's worker thread.
void refuse_inside_kernel(std::string_view device_name, std::string_view what);

[[noreturn]] inline void throw_destroyed(std::string_view device_name, std::string_view owner, std::string_view what) {
  throw DeviceError(fmt::format("device {} was destroyed; {} was used afterwards ({}). Streams, events and device "
                                "memory must not outlive their Device: destroy them first",
                                device_name, owner, what));
}

// `owner` and `what` only go into the message: nothing is formatted on the happy path.
inline std::shared_ptr<SimDeviceState> lock_alive(const std::weak_ptr<SimDeviceState>& weak,
                                                  std::string_view device_name, std::string_view owner,
                                                  std::string_view what) {
  auto state = weak.lock();
  if (!state || state->device.load() == nullptr) throw_destroyed(device_name, owner, what);
  return state;
}

}  // namespace strata::sim_backend
