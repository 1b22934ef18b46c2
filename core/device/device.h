// The Device abstraction: memory, streams and events of one accelerator (docs/DESIGN.md, "The
// device abstraction"). Three things are kept apart, as in ggml's backend interface:
//   * allocation policy and the owned allocation: Device::allocate -> DeviceMemory (RAII);
//   * ordering: Stream (an ordered queue of kernels, copies and event record/wait) and Event;
//   * page-locking of host memory: Device is the HostMemoryPinner that core/host_buffer uses.
//
// Two backends implement it: `sim` (core/device/sim_device.cc and its sim_*.{h,cc}), device memory that is host memory
// behind a hard capacity cap, streams run by worker threads, copies throttled to a modeled link;
// and `cuda` (core/device/cuda_device_cuda.cc), the same contract over the CUDA runtime.
//
// Note [Host-driven offload] (docs/DESIGN.md): the host waits on the device, the device never
// waits on the host. A stream carries kernels (enqueued by the device front layers: CUDA
// launches, or sim kernels, core/device/sim_kernel.h), copies, frees and event record/wait; no
// stream runs host code of the engine. Host threads wait on events (Event::synchronize, query),
// do host work, and enqueue the next copies themselves; a stream waits only on an event whose
// record has already been enqueued.
//
// Contract shared by both backends (tests in tests/core hold the sim backend to it):
//  * Work on one stream runs in enqueue order. Work on different streams is unordered unless an
//    event joins them: a.record(e); b.wait(e) makes b's later work wait for a's earlier work.
//  * Stream::wait and Event::query/synchronize on an event that was never recorded throw
//    DeviceError (CUDA would silently treat it as complete; that hides ordering bugs).
//  * Copies and kernels are asynchronous; pointers must stay valid until the stream has
//    passed them (use an event, Stream::synchronize, or Stream::release_after for device memory).
//    Except: a copy to or from host memory that is not pinned (pin_host) blocks the caller until
//    it has run, as CUDA's may (Note [Pageable copies] in core/device/sim_stream.cc).
//  * An exception thrown by work on a stream is sticky: the next synchronize() on that stream
//    (or any later enqueue) rethrows it, as CUDA reports asynchronous errors.
//  * DeviceMemory, Stream and Event must not outlive their Device: using them afterwards throws
//    DeviceError; destroying them afterwards is a harmless no-op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/host_buffer.h"

namespace strata {

enum class DeviceKind { Sim, Cuda };
std::string_view device_kind_name(DeviceKind kind);

// What a device's memory holds, in total and per tag (tags name what an allocation is for:
// "param.full", "grad.shard", "activations", ...).
struct MemoryStats {
  std::size_t capacity_bytes = 0;
  std::size_t allocated_bytes = 0;       // sum of live allocations (after alignment rounding)
  std::size_t peak_allocated_bytes = 0;  // since creation or reset_peak()
  std::size_t free_bytes = 0;
  std::size_t largest_free_block_bytes = 0;
  std::size_t live_allocations = 0;
  std::uint64_t total_allocations = 0;
  std::uint64_t failed_allocations = 0;
  std::size_t pinned_host_bytes = 0;
  // Copies between the device and host memory that is not pinned, since creation: each may block
  // its caller until it has run, after its stream's earlier work (Note [Pageable copies] in
  // core/device/sim_stream.cc).
  std::uint64_t pageable_copies = 0;
  std::uint64_t pageable_copy_bytes = 0;
  // Successful pin_host calls since creation. On cuda page-locking may wait for every stream (Note
  // [Pinning while streams run] in core/device/sim_device.cc): a pin in the middle of a step can
  // stall the whole device.
  std::uint64_t host_pins = 0;
  std::map<std::string, std::size_t> bytes_by_tag;       // live bytes per tag
  std::map<std::string, std::size_t> peak_bytes_by_tag;  // peak live bytes per tag

  // 1 - largest_free_block / free: 0 when free space is one block, -> 1 when it is shattered.
  double fragmentation() const;
};

// Multi-line, human-readable: capacity, used, free, largest free block, fragmentation, per tag.
std::string format_memory_report(std::string_view device_name, const MemoryStats& stats);

namespace detail {
// Whether [ptr, ptr + bytes) lies inside one of `ranges` (start -> length, as the backends keep
// their pinned host memory).
template <typename Key>
bool inside_one_range(const std::map<Key, std::size_t>& ranges, const void* ptr, std::size_t bytes) {
  auto it = ranges.upper_bound(static_cast<Key>(const_cast<void*>(ptr)));
  if (it == ranges.begin()) return false;
  --it;
  const auto begin = reinterpret_cast<std::uintptr_t>(it->first);
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  return p >= begin && p - begin <= it->second && bytes <= it->second - (p - begin);
}

// Returns an allocation to its device. Held weakly by DeviceMemory so that memory freed after
// its device is gone is a no-op rather than a use-after-free.
class DeviceMemoryReleaser {
 public:
  virtual ~DeviceMemoryReleaser() = default;
  virtual void release(void* ptr) noexcept = 0;
};
}  // namespace detail

// One allocation in device memory. Move-only; frees on destruction.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(void* ptr, std::size_t bytes, std::weak_ptr<detail::DeviceMemoryReleaser> owner)
      : ptr_(ptr), bytes_(bytes), owner_(std::move(owner)) {}
  DeviceMemory(DeviceMemory&& other) noexcept;
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { reset(); }

  void* data() const { return ptr_; }
  std::size_t size_bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void reset() noexcept;

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  std::weak_ptr<detail::DeviceMemoryReleaser> owner_;
};

class Device;

class Event {
 public:
  virtual ~Event() = default;
  // True once all work captured by the latest record() has run. Throws DeviceError if never recorded.
  virtual bool query() = 0;
  // Blocks the calling thread until query() would be true. Throws DeviceError if never recorded.
  virtual void synchronize() = 0;
  // Milliseconds between two completed events (both recorded and synchronized).
  virtual double elapsed_ms_since(const Event& start) = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device& device() = 0;
  virtual const std::string& name() const = 0;

  virtual void copy_h2d(void* dst_device, const void* src_host, std::size_t bytes) = 0;
  virtual void copy_d2h(void* dst_host, const void* src_device, std::size_t bytes) = 0;
  virtual void copy_d2d(void* dst_device, const void* src_device, std::size_t bytes) = 0;
  virtual void memset(void* dst_device, int value, std::size_t bytes) = 0;

  // Frees `memory` once all work enqueued so far on this stream has run (cudaFreeAsync). Work
  // enqueued afterwards, on any stream, must not name it (Note [Released memory] in
  // core/device/sim_allocator.h).
  virtual void release_after(DeviceMemory memory) = 0;

  virtual void record(Event& event) = 0;
  virtual void wait(const Event& event) = 0;
  // Blocks until all enqueued work has run; rethrows the stream's sticky error if any.
  virtual void synchronize() = 0;

  // cudaStream_t on cuda; nullptr on sim.
  virtual void* native_handle() = 0;
};

// Synchronizes `stream` when it goes out of scope, errors swallowed: declared after the objects a
// stream's queued work reads (host arrays, buffers), it lets that work finish before they are
// destroyed when an exception unwinds the scope (a stream's work may run long after enqueue).
class StreamDrain {
 public:
  explicit StreamDrain(Stream& stream) : stream_(stream) {}
  ~StreamDrain() {
    try {
      stream_.synchronize();
    } catch (...) {  // the stream's own error; the exception unwinding the scope is the one to report
    }
  }
  StreamDrain(const StreamDrain&) = delete;
  StreamDrain& operator=(const StreamDrain&) = delete;

 private:
  Stream& stream_;
};

class Device : public HostMemoryPinner {
 public:
  ~Device() override = default;

  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // "sim:0", "cuda:0 (NVIDIA H100 80GB HBM3)"
  virtual std::size_t capacity_bytes() const = 0;

  // Capacity-bounded allocation, aligned to at least 256 bytes. Throws OutOfMemoryError whose
  // message is format_memory_report(...) of this device; the device stays usable. Zero bytes is
  // a DeviceError (it is always a caller bug here). `tag` says what the memory is for.
  virtual DeviceMemory allocate(std::size_t bytes, std::string_view tag) = 0;
  virtual MemoryStats memory_stats() const = 0;
  virtual void reset_peak_stats() = 0;

  virtual std::unique_ptr<Stream> create_stream(std::string_view name) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
};

// Options of the sim device. A bandwidth of 0 means "as fast as memcpy".
struct SimDeviceOptions {
  int ordinal = 0;
  std::size_t capacity_bytes = std::size_t{1} << 30;
  std::size_t alignment_bytes = 256;
  double h2d_gbps = 0;  // modeled link (PCIe) bandwidth host->device, 1e9 bytes/s
  double d2h_gbps = 0;  // device->host (full duplex: its own link)
  double d2d_gbps = 0;  // device memory bandwidth for d2d copies
  double latency_us = 0;  // fixed cost added to each copy
  // Note [Schedule chaos] (core/device/schedule_chaos.h): non-zero, every stream task starts after a
  // seeded random pause of up to chaos_max_us, so that rare orders are tried (tests, and
  // strata.device.chaos).
  std::uint64_t chaos_seed = 0;
  double chaos_max_us = 200;
  // What sets the capacity, named when it cannot be had: the config key, or the flags of a command
  // that sizes its device itself (strata eval: --batch-size and --seq-len).
  std::string capacity_knob = "strata.device.memory";
};
std::unique_ptr<Device> make_sim_device(const SimDeviceOptions& options);

// CUDA devices. Built only with STRATA_HAVE_CUDA; otherwise list_cuda_devices() returns an empty list with `why` set and
// make_cuda_device throws DeviceError saying the build has no CUDA backend.
struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;
  std::size_t total_memory_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
};
// Devices the driver reports; empty (with `why` filled) when there is no driver, no device, or
// the build has no CUDA backend.
std::vector<CudaDeviceInfo> list_cuda_devices(std::string* why = nullptr);
struct CudaDeviceOptions {
  int ordinal = 0;
  std::size_t memory_limit_bytes = 0;  // 0: all free memory; else a cap like sim's
};
std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& options);

}  // namespace strata
