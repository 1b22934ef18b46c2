// The `sim` backend of the Device abstraction (contract in core/device/device.h): device memory is
// host memory inside a capped arena (core/device/sim_allocator.h), each Stream is an ordered queue
// run by its own worker thread (core/device/sim_stream.cc), Events are generation counters
// (core/device/sim_event.h), and copies can be throttled to a modeled link
// (core/device/sim_link.h) so that overlap of copies with each other and with compute is real wall
// time. What they share with the device is core/device/sim_state.h. This file is the Device
// itself: allocation, memory statistics, the pinning rules, and the checked options.
//
// Note [Pinning while streams run]: CUDA's programming guide lists a page-locked host allocation
// among the calls that synchronize streams implicitly (two commands of different streams cannot
// overlap when one is issued between them), and cudaHostRegister may wait for the device. A pin in
// the middle of a step, while streams work, therefore stalls every stream on cuda (no stream waits
// for a host thread, Note [Host-driven offload] in docs/DESIGN.md, so it cannot deadlock, but it costs time). Both
// backends count pin_host calls (MemoryStats::host_pins); `strata train` reports them per step, and the engine
// pins its host buffers before the first step's work, so every step pins nothing
// (train_offload_test.sh checks it). Counting every pin, rather than only those that met a
// working stream, keeps the check deterministic: whether a stream is still busy at the moment of a
// pin is a matter of timing.
#include <cmath>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "core/device/device.h"
#include "core/device/sim_event.h"
#include "core/device/sim_state.h"
#include "core/device/sim_stream.h"
#include "core/error.h"

namespace strata {
namespace {

using sim_backend::refuse_inside_kernel;
using sim_backend::SimDeviceState;

class SimDevice final : public Device {
 public:
  explicit SimDevice(const SimDeviceOptions& options) : state_(std::make_shared<SimDeviceState>(options)) {
    state_->device.store(this);
  }
  ~SimDevice() override { state_->device.store(nullptr); }
  SimDevice(const SimDevice&) = delete;
  SimDevice& operator=(const SimDevice&) = delete;

  DeviceKind kind() const override { return DeviceKind::Sim; }
  std::string name() const override { return state_->name; }
  std::size_t capacity_bytes() const override { return state_->allocator.capacity_bytes(); }

  DeviceMemory allocate(std::size_t bytes, std::string_view tag) override {
    void* ptr = state_->allocator.allocate(bytes, tag);
    return DeviceMemory(ptr, bytes, std::weak_ptr<detail::DeviceMemoryReleaser>(state_));
  }

  MemoryStats memory_stats() const override {
    MemoryStats stats = state_->allocator.stats();
    std::lock_guard lock(state_->pinned_mutex);
    stats.pinned_host_bytes = state_->pinned_bytes;
    stats.pageable_copies = state_->pageable_copies;
    stats.pageable_copy_bytes = state_->pageable_copy_bytes;
    stats.host_pins = state_->host_pins;
    return stats;
  }

  void reset_peak_stats() override { state_->allocator.reset_peak(); }

  std::unique_ptr<Stream> create_stream(std::string_view name) override {
    return sim_backend::make_sim_stream(state_, std::string(name));
  }

  std::unique_ptr<Event> create_event() override {
    return std::make_unique<sim_backend::SimEvent>(state_, state_->name);
  }

  // Sim copies need no page-locking; the registry tells pinned from pageable copies (see
  // Note [Pageable copies] in core/device/sim_stream.cc), feeds the pinned_host_bytes statistic and
  // catches double registration, which cudaHostRegister also refuses. Page-locking may wait for the
  // device (Note [Pinning while streams run]), so inside a kernel it is refused (see
  // Note [Sim kernels] in core/device/sim_kernel.h).
  void pin_host(void* ptr, std::size_t bytes) override {
    refuse_inside_kernel(state_->name, "pin_host");
    if (ptr == nullptr || bytes == 0) {
      throw DeviceError(fmt::format("{}: pin_host({}, {} bytes): nothing to pin; pass a non-empty host buffer",
                                    state_->name, ptr, bytes));
    }
    std::lock_guard lock(state_->pinned_mutex);
    if (!state_->pinned.emplace(ptr, bytes).second) {
      throw DeviceError(fmt::format("{}: pin_host({}): this host memory is already pinned; unpin it first",
                                    state_->name, ptr));
    }
    state_->pinned_bytes += bytes;
    ++state_->host_pins;  // Note [Pinning while streams run]
  }

  void unpin_host(void* ptr) noexcept override {
    std::lock_guard lock(state_->pinned_mutex);
    auto it = state_->pinned.find(ptr);
    if (it == state_->pinned.end()) return;
    state_->pinned_bytes -= it->second;
    state_->pinned.erase(it);
  }

 private:
  std::shared_ptr<SimDeviceState> state_;
};

void check_option(bool ok, std::string_view what, double value, std::string_view fix) {
  if (!ok) throw ConfigError(fmt::format("sim device option {} = {} is invalid; {}", what, value, fix));
}

}  // namespace

std::unique_ptr<Device> make_sim_device(const SimDeviceOptions& options) {
  check_option(options.ordinal >= 0, "ordinal", options.ordinal, "use 0 or above");
  const auto rate_ok = [](double v) { return std::isfinite(v) && v >= 0; };
  check_option(rate_ok(options.h2d_gbps), "h2d_gbps", options.h2d_gbps, "use 0 (unthrottled) or a positive GB/s");
  check_option(rate_ok(options.d2h_gbps), "d2h_gbps", options.d2h_gbps, "use 0 (unthrottled) or a positive GB/s");
  check_option(rate_ok(options.d2d_gbps), "d2d_gbps", options.d2d_gbps, "use 0 (unthrottled) or a positive GB/s");
  check_option(rate_ok(options.latency_us), "latency_us", options.latency_us, "use 0 or a positive microsecond count");
  check_option(rate_ok(options.chaos_max_us) && options.chaos_max_us <= 100000, "chaos_max_us", options.chaos_max_us,
               "use 0 to 100000 microseconds");
  return std::make_unique<SimDevice>(options);
}

}  // namespace strata

