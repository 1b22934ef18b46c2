// The `cuda` backend of the Device abstraction (contract in core/device/device.h) over the CUDA
// runtime: non-blocking cudaStreams, cudaEvents, cudaMemcpyAsync / cudaMemsetAsync, the Device
// itself and opening it. A stream carries kernels (launched by the front layers on
// native_handle()), copies, frees and event record/wait, and never a host function: the host waits
// on the device, the device never waits on the host (Note [Host-driven offload] in docs/DESIGN.md).
// Device memory (a stream-ordered pool of Strata's own under Strata's own capacity accounting)
// and page-locking through cudaHostRegister are the shared state's, in
// core/device/cuda_state_cuda.cc. CI has no GPU: the gpu-labelled tests run this file on one
// (README, "How the CUDA path is verified").
//
// Note [Cuda lifetimes]: as on sim, the Device owns a shared CudaState (pool, allocation table,
// pin registry, and every stream and event it handed out); DeviceMemory, Stream and Event hold it
// weakly. While the state is alive, destroying a Stream or Event destroys its CUDA handle; when
// the Device goes, the state's destructor waits for the device's streams, frees every live
// allocation, and destroys the pool, streams and events — so a Stream/Event/DeviceMemory that
// outlives its Device finds the state expired, throws DeviceError when used, and does nothing
// when destroyed.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "core/cuda_check.h"
#include "core/device/cuda_state_cuda.h"
#include "core/device/device.h"
#include "core/error.h"
#include "core/units.h"

namespace strata {
namespace {

using cuda_backend::CudaState;
using cuda_backend::cuda_text;
using cuda_backend::describe_pointer;
using cuda_backend::ScopedDevice;

[[noreturn]] void throw_destroyed(std::string_view device_name, std::string_view owner, std::string_view what) {
  throw DeviceError(fmt::format("device {} was destroyed; {} was used afterwards ({}). Streams, events and device "
                                "memory must not outlive their Device: destroy them first",
                                device_name, owner, what));
}

std::shared_ptr<CudaState> lock_alive(const std::weak_ptr<CudaState>& weak, std::string_view device_name,
                                      std::string_view owner, std::string_view what) {
  auto state = weak.lock();
  if (!state) throw_destroyed(device_name, owner, what);
  return state;
}

class CudaEvent final : public Event {
 public:
  CudaEvent(const std::shared_ptr<CudaState>& state, cudaEvent_t event)
      : state_(state), device_name_(state->name), event_(event) {}
  ~CudaEvent() override {
    if (auto state = state_.lock()) state->destroy_event(event_);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  bool query() override {
    auto state = usable("Event::query");
    ScopedDevice on(state->ordinal);
    const cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) return false;
    STRATA_CUDA_CHECK(err);
    return true;
  }

  void synchronize() override {
    auto state = usable("Event::synchronize");
    ScopedDevice on(state->ordinal);
    STRATA_CUDA_CHECK(cudaEventSynchronize(event_));
  }

  double elapsed_ms_since(const Event& start) override {
    const auto* begin = dynamic_cast<const CudaEvent*>(&start);
    if (begin == nullptr) {
      throw DeviceError(fmt::format("Event::elapsed_ms_since on {}: the start event belongs to another backend",
                                    device_name_));
    }
    auto state = usable("Event::elapsed_ms_since");
    auto begin_state = begin->usable("Event::elapsed_ms_since");  // held: keeps the start's device alive
    float ms = 0;
    ScopedDevice on(state->ordinal);
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, begin->event_, event_));
    return ms;
  }

  // Checks for the device's life and for a record; `what` names the caller for the message.
  std::shared_ptr<CudaState> usable(std::string_view what) const {
    auto state = lock_alive(state_, device_name_, "an event", what);
    if (!recorded_.load(std::memory_order_acquire)) {
      throw DeviceError(fmt::format("{} on an event of {} that was never recorded: record it on a stream first "
                                    "(CUDA would treat it as complete and hide an ordering bug)",
                                    what, device_name_));
    }
    return state;
  }
  std::shared_ptr<CudaState> alive(std::string_view what) const {
    return lock_alive(state_, device_name_, "an event", what);
  }
  void mark_recorded() { recorded_.store(true, std::memory_order_release); }
  cudaEvent_t handle() const { return event_; }

 private:
  std::weak_ptr<CudaState> state_;
  const std::string device_name_;
  const cudaEvent_t event_;
  std::atomic<bool> recorded_{false};
};

template <typename EventT>  // Event or const Event
auto& as_cuda_event(EventT& event, std::string_view what, std::string_view device_name) {
  auto* e = dynamic_cast<std::conditional_t<std::is_const_v<EventT>, const CudaEvent, CudaEvent>*>(&event);
  if (e == nullptr) {
    throw DeviceError(fmt::format("{} on {}: the event was not created by a cuda device; use Device::create_event of "
                                  "this device",
                                  what, device_name));
  }
  return *e;
}

class CudaStream final : public Stream {
 public:
  CudaStream(const std::shared_ptr<CudaState>& state, Device* device, std::string name, cudaStream_t stream)
      : state_(state), device_(device), device_name_(state->name), name_(std::move(name)), stream_(stream) {}
  ~CudaStream() override {
    if (auto state = state_.lock()) state->destroy_stream(stream_);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  Device& device() override {
    auto state = lock_alive(state_, device_name_, stream_label(), "Stream::device");
    return *device_;
  }
  const std::string& name() const override { return name_; }

  void copy_h2d(void* dst_device, const void* src_host, std::size_t bytes) override {
    copy(dst_device, src_host, bytes, cudaMemcpyHostToDevice, "copy_h2d");
  }
  void copy_d2h(void* dst_host, const void* src_device, std::size_t bytes) override {
    copy(dst_host, src_device, bytes, cudaMemcpyDeviceToHost, "copy_d2h");
  }
  void copy_d2d(void* dst_device, const void* src_device, std::size_t bytes) override {
    copy(dst_device, src_device, bytes, cudaMemcpyDeviceToDevice, "copy_d2d");
  }

  void memset(void* dst_device, int value, std::size_t bytes) override {
    auto state = enter("memset");
    if (bytes == 0) return;
    ScopedDevice on(state->ordinal);
    STRATA_CUDA_CHECK(cudaMemsetAsync(dst_device, value, bytes, stream_));
  }

  void release_after(DeviceMemory memory) override {
    if (memory.empty()) return;
    auto state = enter("release_after");
    if (!state->free_on_stream(memory.data(), stream_)) {
      throw DeviceError(fmt::format("{}: release_after got memory that was not allocated by {}; release memory on a "
                                    "stream of its own device",
                                    stream_label(), device_name_));
    }
    memory.reset();  // -> CudaState::release -> cudaFreeAsync on this stream (Note [Released memory] in core/device/sim_allocator.h)
  }

  void record(Event& event) override {
    auto state = enter("record");
    CudaEvent& e = as_cuda_event(event, "Stream::record", device_name_);
    auto event_state = e.alive("Stream::record");
    if (event_state->ordinal != state->ordinal) {
      throw DeviceError(fmt::format("{}: record of an event created by {}; CUDA records an event only on a stream of "
                                    "its own GPU (waiting on it from another GPU is fine)",
                                    stream_label(), event_state->name));
    }
    ScopedDevice on(state->ordinal);
    STRATA_CUDA_CHECK(cudaEventRecord(e.handle(), stream_));
    e.mark_recorded();
  }

  void wait(const Event& event) override {
    auto state = enter("wait");
    const CudaEvent& e = as_cuda_event(event, "Stream::wait", device_name_);
    auto event_state = e.usable("Stream::wait");  // never recorded -> DeviceError (device.h)
    ScopedDevice on(state->ordinal);
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream_, e.handle(), 0));
  }

  void synchronize() override {
    auto state = lock_alive(state_, device_name_, stream_label(), "Stream::synchronize");
    ScopedDevice on(state->ordinal);
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void* native_handle() override { return stream_; }

 private:
  std::string stream_label() const { return fmt::format("stream '{}' on {}", name_, device_name_); }

  // Every enqueue: the device must be alive. CUDA keeps a failed kernel's error sticky itself.
  std::shared_ptr<CudaState> enter(std::string_view what) {
    return lock_alive(state_, device_name_, stream_label(), what);
  }

  void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, std::string_view what) {
    auto state = enter(what);
    if (bytes == 0) return;
    const void* host = kind == cudaMemcpyHostToDevice ? src : kind == cudaMemcpyDeviceToHost ? dst : nullptr;
    const bool pageable = host != nullptr && !state->pinned_range(host, bytes);
    ScopedDevice on(state->ordinal);
    const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kind, stream_);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: the stream stays usable for the caller's recovery
      throw DeviceError(fmt::format("{}: {} of {} from {} to {} failed: cudaMemcpyAsync: {}", stream_label(), what,
                                    format_bytes(bytes), describe_pointer(src, bytes), describe_pointer(dst, bytes),
                                    cuda_text(err)));
    }
    if (pageable) state->count_pageable(bytes);  // counted once issued, as on sim
  }

  std::weak_ptr<CudaState> state_;
  Device* const device_;
  const std::string device_name_;
  const std::string name_;
  const cudaStream_t stream_;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(std::shared_ptr<CudaState> state) : state_(std::move(state)) {}

  DeviceKind kind() const override { return DeviceKind::Cuda; }
  std::string name() const override { return state_->name; }
  std::size_t capacity_bytes() const override { return state_->stats().capacity_bytes; }

  DeviceMemory allocate(std::size_t bytes, std::string_view tag) override {
    if (bytes == 0) {
      throw DeviceError(fmt::format("{}: allocate(0 bytes) for '{}': a zero-byte allocation is a caller bug",
                                    state_->name, tag));
    }
    void* ptr = state_->allocate(bytes, tag);
    return DeviceMemory(ptr, bytes, std::weak_ptr<detail::DeviceMemoryReleaser>(state_));
  }
  MemoryStats memory_stats() const override { return state_->stats(); }
  void reset_peak_stats() override { state_->reset_peak(); }

  std::unique_ptr<Stream> create_stream(std::string_view name) override {
    cudaStream_t s = nullptr;
    {
      ScopedDevice on(state_->ordinal);
      STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    }
    state_->add_stream(s);  // from here on the state destroys it, whatever happens below
    return std::make_unique<CudaStream>(state_, this, std::string(name), s);
  }

  std::unique_ptr<Event> create_event() override {
    cudaEvent_t e = nullptr;
    {
      ScopedDevice on(state_->ordinal);
      STRATA_CUDA_CHECK(cudaEventCreate(&e));  // timing enabled: elapsed_ms_since needs it
    }
    state_->add_event(e);
    return std::make_unique<CudaEvent>(state_, e);
  }

  void pin_host(void* ptr, std::size_t bytes) override { state_->pin(ptr, bytes); }
  void unpin_host(void* ptr) noexcept override { state_->unpin(ptr); }

 private:
  std::shared_ptr<CudaState> state_;
};

}  // namespace

std::vector<CudaDeviceInfo> list_cuda_devices(std::string* why) {
  std::vector<CudaDeviceInfo> out;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (why != nullptr) *why = fmt::format("the CUDA runtime found no usable device: {}", cuda_text(err));
    return out;
  }
  if (count == 0) {
    if (why != nullptr) *why = "the CUDA driver reports no devices";
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    const cudaError_t prop_err = cudaGetDeviceProperties(&prop, i);
    if (prop_err != cudaSuccess) {
      (void)cudaGetLastError();
      if (why != nullptr) *why += fmt::format("cuda:{} skipped: {}; ", i, cuda_text(prop_err));
      continue;
    }
    out.push_back(CudaDeviceInfo{i, prop.name, prop.totalGlobalMem, prop.major, prop.minor});
  }
  return out;
}

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& options) {
  std::string why;
  const std::vector<CudaDeviceInfo> devices = list_cuda_devices(&why);
  const auto info = std::find_if(devices.begin(), devices.end(),
                                 [&](const CudaDeviceInfo& d) { return d.ordinal == options.ordinal; });
  if (info == devices.end()) {
    std::string have;
    for (const CudaDeviceInfo& d : devices) have += fmt::format(" cuda:{} ({})", d.ordinal, d.name);
    throw DeviceError(fmt::format("cannot open cuda:{}: {}. Devices found:{}. Choose one of them, or use the sim device "
                                  "(strata.device.kind = \"sim\")",
                                  options.ordinal, why.empty() ? "no such device" : why, have.empty() ? " none" : have));
  }
  int pools_supported = 0;
  STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, info->ordinal));
  if (pools_supported == 0) {
    throw DeviceError(fmt::format("cuda:{} ({}) does not support stream-ordered memory pools (cudaMallocAsync), which "
                                  "Strata's cuda backend needs; update the NVIDIA driver",
                                  info->ordinal, info->name));
  }
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  {
    ScopedDevice on(info->ordinal);
    STRATA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  }
  if (options.memory_limit_bytes > total_bytes) {
    throw ConfigError(fmt::format("device memory limit {} for cuda:{} ({}) is more than its {} of memory; lower the "
                                  "limit (strata.device.memory) or use 0 for all free memory",
                                  format_bytes(options.memory_limit_bytes), info->ordinal, info->name,
                                  format_bytes(total_bytes)));
  }
  const std::size_t capacity = options.memory_limit_bytes != 0 ? options.memory_limit_bytes : free_bytes;
  auto state = std::make_shared<CudaState>(info->ordinal, fmt::format("cuda:{} ({})", info->ordinal, info->name), capacity);
  return std::make_unique<CudaDevice>(std::move(state));
}

}  // namespace strata
