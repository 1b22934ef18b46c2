// The `cuda` backend of the Device abstraction (contract in core/device/device.h) over the CUDA
// runtime: non-blocking cudaStreams, cudaEvents, cudaMemcpyAsync / cudaMemsetAsync, host functions
// on a thread of each stream's own (Note [Host functions on cuda]), the Device itself and opening
// it. Device memory (a stream-ordered pool of Strata's own under Strata's own capacity accounting)
// and page-locking through cudaHostRegister are the shared state's, in
// core/device/cuda_state_cuda.cc. CI has no GPU: the gpu-labelled tests run this file on one
// (README, "How the CUDA path is verified"; the host-function thread ran there on 2026-11-26).
//
// Note [Cuda lifetimes]: as on sim, the Device owns a shared CudaState (pool, allocation table,
// pin registry, and every stream and event it handed out); DeviceMemory, Stream and Event hold it
// weakly. While the state is alive, destroying a Stream or Event destroys its CUDA handle; when
// the Device goes, the state's destructor waits for the device's streams, frees every live
// allocation, and destroys the pool, streams and events — so a Stream/Event/DeviceMemory that
// outlives its Device finds the state expired, throws DeviceError when used, and does nothing
// when destroyed.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
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
using cuda_backend::driver_symbol;
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

// The sticky error of one stream: the first exception thrown by one of its host functions.
class StreamFailure {
 public:
  void set(std::string what) {
    std::lock_guard lock(mutex_);
    if (!message_) message_ = std::move(what);
    failed_.store(true, std::memory_order_release);
  }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  void rethrow(std::string_view stream_name, std::string_view device_name) const {
    if (!failed()) return;
    std::lock_guard lock(mutex_);
    throw DeviceError(fmt::format("stream '{}' on {}: earlier work on this stream failed: {}", stream_name,
                                  device_name, *message_));
  }

 private:
  mutable std::mutex mutex_;
  std::atomic<bool> failed_{false};
  std::optional<std::string> message_;
};

// Note [Host functions on cuda]: a launch_host function may itself call CUDA (the engine's offload
// worker copies on its transfer stream and waits for it), which the callbacks of cudaLaunchHostFunc
// must never do. So each stream runs its host functions on a thread of its own (HostWorker,
// started by the first launch_host):
//  * launch_host queues (fn, ticket n) for the thread, enqueues a cudaLaunchHostFunc callback that
//    only counts and wakes the thread (no CUDA call; it never blocks), and then
//    cuStreamWaitValue32(done >= n), so the stream's later work waits for the function;
//  * the thread waits until the callbacks counted to n, runs fn (skipped once the stream has failed,
//    as on sim), and stores n into `done`, a word of mapped pinned host memory the GPU polls.
// Functions run one at a time in enqueue order, and CUDA's callback thread never blocks, so host
// functions of different streams cannot deadlock through it. While a function runs its stream is
// blocked, so a function must not wait for later work of its own stream (as on sim), nor call
// anything that waits for the whole device: cudaDeviceSynchronize, and the calls CUDA's programming
// guide lists as implicitly synchronizing, page-locked allocation among them. A host function that
// pinned host memory, copied on another stream, waited and unpinned hung in every variant tried on an
// H200 (2026-11-26). Page-locking inside a host function therefore throws, and unpinning there is
// deferred (CudaState::pin/unpin, on_host_function_thread). Two variants tried there are not used:
//  * the thread waiting with cudaEventSynchronize on an event recorded before the function hung as
//    soon as a copy to pageable memory was queued behind the function (the driver waits for the
//    stream inside that cudaMemcpyAsync, and the event wait could not proceed meanwhile);
//  * a callback that blocks until the thread ran the function (no stream wait) lets one stream's
//    function hold up every stream's callbacks.
// Memory released on a stream with host functions is freed by its host thread (release_after;
// Note [Released memory]): the offload worker's host function copies a reduced gradient released
// right after the function was queued, and with cudaFreeAsync called at once that copy failed on an
// H100 (2026-11-26) with "invalid argument", as CUDA documents: work issued after cudaFreeAsync
// returns must not name the memory, whatever the stream order. The version freeing through the host
// thread passed tests/core/cuda_stream_cuda_test.cc there, but the demo with it did not finish 20
// steps in the 40 s given (hung or slow: not known), so the engine refuses offload on cuda
// (engine/zero_engine.cc) unless STRATA_CUDA_OFFLOAD=1.
// CUDA_DEVICE_MAX_CONNECTIONS is raised to 32 before the first context (unless set), so that a
// blocked stream does not share a hardware queue with the streams its function waits for. Unlike
// sim, copies and kernels queued after a failed host function still run; the stream's error is
// raised by its next enqueue or synchronize. Needs CUDA 12.5 or later
// (cudaGetDriverEntryPointByVersion).
using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

WaitValue32Fn wait_value32() {
  static const WaitValue32Fn fn = [] {
    void* p = driver_symbol("cuStreamWaitValue32");
    if (p == nullptr) {
      throw DeviceError("the CUDA driver has no cuStreamWaitValue32, which Strata's cuda streams need to order host "
                        "functions; update the NVIDIA driver");
    }
    return reinterpret_cast<WaitValue32Fn>(p);
  }();
  return fn;
}

class HostWorker;

// The HostWorker whose thread this is (null elsewhere): a pageable copy on that worker's own stream
// is refused, as on sim (Note [Pageable copies] in core/device/sim_device.cc).
const HostWorker*& current_host_worker() noexcept {
  thread_local const HostWorker* worker = nullptr;
  return worker;
}

class HostWorker {
 public:
  HostWorker(int ordinal, std::string label, std::shared_ptr<StreamFailure> failure)
      : ordinal_(ordinal), label_(std::move(label)), failure_(std::move(failure)) {
    wait_ = wait_value32();
    ScopedDevice on(ordinal_);
    void* host = nullptr;
    STRATA_CUDA_CHECK(cudaHostAlloc(&host, sizeof(std::uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
    done_ = static_cast<std::uint32_t*>(host);
    __atomic_store_n(done_, 0u, __ATOMIC_RELEASE);
    try {
      void* dev = nullptr;
      STRATA_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host, 0));
      done_dev_ = reinterpret_cast<CUdeviceptr>(dev);
      thread_ = std::thread([this] { run(); });
    } catch (...) {
      (void)cudaFreeHost(done_);
      throw;
    }
  }
  // The stream must have run its work already (~CudaStream synchronizes it first): the GPU may not
  // poll the counter once it is freed.
  ~HostWorker() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();  // runs what is queued first: the stream waits for every ticket it was given
    ScopedDevice on(ordinal_, std::nothrow);
    if (cudaFreeHost(done_) != cudaSuccess) (void)cudaGetLastError();
  }
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  // Called with the stream's device current. The callback, the ticket and the wait go on the stream
  // as one unit (enqueue_mutex_), so callbacks and waits come in ticket order even when several
  // threads enqueue on one stream.
  void enqueue(cudaStream_t stream, std::function<void()> fn) {
    std::lock_guard order(enqueue_mutex_);
    std::uint32_t ticket = 0;
    {
      std::lock_guard lock(mutex_);
      ticket = next_ticket_ + 1;
      tasks_.push_back(Task{std::move(fn), ticket});
      next_ticket_ = ticket;
    }
    // From here the ticket is queued: whatever fails, the stream has failed (its order is lost).
    if (const cudaError_t err = cudaLaunchHostFunc(stream, &reached, this); err != cudaSuccess) {
      (void)cudaGetLastError();
      fail(fmt::format("{}: cudaLaunchHostFunc failed ({}); the stream cannot order its host function", label_,
                       cuda_text(err)));
    }
    const CUresult r = wait_(reinterpret_cast<CUstream>(stream), done_dev_, ticket, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) {
      fail(fmt::format("{}: cuStreamWaitValue32 failed (CUresult {}); the stream cannot wait for its host function",
                       label_, static_cast<int>(r)));
    }
  }

 private:
  struct Task {
    std::function<void()> fn;
    std::uint32_t ticket;
  };

  [[noreturn]] void fail(const std::string& what) {
    failure_->set(what);
    throw DeviceError(what);
  }

  // CUDA's callback thread: count and wake, nothing else (no CUDA call; the mutex is held briefly).
  static void CUDART_CB reached(void* self) {
    auto* w = static_cast<HostWorker*>(self);
    {
      std::lock_guard lock(w->mutex_);
      ++w->reached_;
    }
    w->cv_.notify_all();
  }

  void run() {
    (void)cudaSetDevice(ordinal_);
    cuda_backend::on_host_function_thread() = true;
    current_host_worker() = this;
    for (;;) {
      Task task;
      {
        std::unique_lock lock(mutex_);
        // Once stopping, the stream has been synchronized: every callback that will run has run.
        cv_.wait(lock, [this] { return !tasks_.empty() ? stop_ || reached_ >= tasks_.front().ticket : stop_; });
        if (tasks_.empty()) return;  // stop_ with nothing left
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      if (!failure_->failed()) {
        try {
          task.fn();
        } catch (const std::exception& e) {
          failure_->set(e.what());
        } catch (...) {
          failure_->set("a host function threw an exception that is not a std::exception");
        }
      }
      task.fn = nullptr;  // what it captured goes before the stream moves on
      __atomic_store_n(done_, task.ticket, __ATOMIC_RELEASE);
    }
  }

  const int ordinal_;
  const std::string label_;
  const std::shared_ptr<StreamFailure> failure_;
  WaitValue32Fn wait_ = nullptr;
  std::uint32_t* done_ = nullptr;  // the last ticket run; the stream's waits read it
  CUdeviceptr done_dev_ = 0;
  std::mutex enqueue_mutex_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  std::uint32_t next_ticket_ = 0;
  std::uint32_t reached_ = 0;  // callbacks run so far (one per ticket, in order)
  bool stop_ = false;
  std::thread thread_;
};

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
    auto state = state_.lock();
    if (host_worker_ && state) {
      // The stream's last waits read the worker's counter: let them pass before it is freed (the
      // worker keeps running the queued host functions meanwhile).
      ScopedDevice on(state->ordinal, std::nothrow);
      if (cudaStreamSynchronize(stream_) != cudaSuccess) (void)cudaGetLastError();
    }
    host_worker_.reset();
    if (state) state->destroy_stream(stream_);
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

  void launch_host(std::function<void()> fn) override {
    auto state = enter("launch_host");
    if (!fn) throw DeviceError(fmt::format("{}: launch_host got an empty function", stream_label()));
    ScopedDevice on(state->ordinal);
    HostWorker* worker = nullptr;
    {
      std::lock_guard lock(host_worker_mutex_);
      if (!host_worker_) host_worker_ = std::make_unique<HostWorker>(state->ordinal, stream_label(), failure_);
      worker = host_worker_.get();
    }
    worker->enqueue(stream_, std::move(fn));  // Note [Host functions on cuda]
  }

  void release_after(DeviceMemory memory) override {
    if (memory.empty()) return;
    auto state = enter("release_after");
    if (!state->free_on_stream(memory.data(), stream_)) {
      throw DeviceError(fmt::format("{}: release_after got memory that was not allocated by {}; release memory on a "
                                    "stream of its own device",
                                    stream_label(), device_name_));
    }
    HostWorker* worker = nullptr;
    {
      std::lock_guard lock(host_worker_mutex_);
      worker = host_worker_.get();
    }
    if (worker != nullptr) {
      // Note [Released memory] (core/device/sim_allocator.h): a host function queued before this
      // may still issue copies of the memory, which CUDA refuses once cudaFreeAsync has returned,
      // so the free is one more host function: its thread calls cudaFreeAsync when the stream
      // reaches it, after the functions before it ran.
      auto held = std::make_shared<DeviceMemory>(std::move(memory));
      ScopedDevice on(state->ordinal);
      worker->enqueue(stream_, [held] { held->reset(); });
      return;
    }
    memory.reset();  // -> CudaState::release -> cudaFreeAsync on this stream
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
    {
      ScopedDevice on(state->ordinal);
      STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    failure_->rethrow(name_, device_name_);
  }

  void* native_handle() override { return stream_; }

 private:
  std::string stream_label() const { return fmt::format("stream '{}' on {}", name_, device_name_); }

  // Every enqueue: the device must be alive and the stream must not have failed (device.h: a
  // sticky error is rethrown by any later enqueue).
  std::shared_ptr<CudaState> enter(std::string_view what) {
    auto state = lock_alive(state_, device_name_, stream_label(), what);
    failure_->rethrow(name_, device_name_);
    return state;
  }

  void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, std::string_view what) {
    auto state = enter(what);
    if (bytes == 0) return;
    const void* host = kind == cudaMemcpyHostToDevice ? src : kind == cudaMemcpyDeviceToHost ? dst : nullptr;
    const bool pageable = host != nullptr && !state->pinned_range(host, bytes);
    if (pageable && current_host_worker() != nullptr && current_host_worker() == own_host_worker()) {
      // The driver would wait inside cudaMemcpyAsync for this stream, which waits for this function.
      throw DeviceError(fmt::format(
          "{}: {} from a host function of the same stream with pageable host memory at {}: the copy may be "
          "synchronous (Note [Pageable copies]) and would wait for the function that issues it, which hangs; pin "
          "the host memory (HostBuffer) or copy on another stream",
          stream_label(), what, host));
    }
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

  const HostWorker* own_host_worker() {
    std::lock_guard lock(host_worker_mutex_);
    return host_worker_.get();
  }

  std::weak_ptr<CudaState> state_;
  Device* const device_;
  const std::string device_name_;
  const std::string name_;
  const cudaStream_t stream_;
  const std::shared_ptr<StreamFailure> failure_ = std::make_shared<StreamFailure>();
  std::mutex host_worker_mutex_;
  std::unique_ptr<HostWorker> host_worker_;  // the first launch_host starts it
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

namespace {
// Note [Host functions on cuda]: more hardware queues than CUDA's default 8, so that a stream
// blocked on its host function does not hold up other streams queued behind it. Read when a
// context is created: set before the first CUDA call, unless the user set it.
void raise_device_connections() { ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0); }
}  // namespace

std::vector<CudaDeviceInfo> list_cuda_devices(std::string* why) {
  raise_device_connections();
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
  raise_device_connections();
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
