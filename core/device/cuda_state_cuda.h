// The state the `cuda` backend's Device shares with its DeviceMemory, Streams and Events (Note
// [Cuda lifetimes] in core/device/cuda_device_cuda.cc): the stream-ordered memory pool under
// Strata's capacity accounting (Note [Cuda capacity] in core/device/cuda_state_cuda.cc), the
// allocation table, the pin registry, and the streams and events handed out. Internal to the cuda
// backend (core/device/*_cuda.cc); built only with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/cuda_check.h"
#include "core/device/device.h"

namespace strata::cuda_backend {

std::string cuda_text(cudaError_t err);
// A CUDA driver function by name (cudaGetDriverEntryPointByVersion, CUDA 12.0's ABI), or null when
// the driver lacks it: the driver library is not linked, only the runtime.
void* driver_symbol(const char* name) noexcept;
// What CUDA knows of `bytes` of memory at `p`, for a failed copy's message: its kind, and for device
// memory the allocation it lies in, so an overrun or a stale page-locked range shows.
std::string describe_pointer(const void* p, std::size_t bytes);

// The runtime's current device is per host thread and callers come from any thread: every call
// that depends on it runs inside one of these, which restores the caller's device afterwards.
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal) {
    STRATA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != ordinal) STRATA_CUDA_CHECK(cudaSetDevice(ordinal));
    restore_ = previous_ != ordinal;
  }
  // For noexcept paths (release, destructors): failures are logged, not thrown.
  ScopedDevice(int ordinal, std::nothrow_t) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) return;
    restore_ = previous_ != ordinal && cudaSetDevice(ordinal) == cudaSuccess;
  }
  ~ScopedDevice() {
    if (restore_) (void)cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// What DeviceMemory, Stream and Event share with the Device (Note [Cuda lifetimes] in core/device/cuda_device_cuda.cc).
class CudaState final : public detail::DeviceMemoryReleaser {
 public:
  CudaState(int ordinal_in, std::string name_in, std::size_t capacity);
  ~CudaState() override;

  CudaState(const CudaState&) = delete;
  CudaState& operator=(const CudaState&) = delete;

  // The allocation is usable on every stream when this returns: Device::allocate is not stream
  // ordered, so the pool's stream-ordered allocation is synchronized once, on an internal stream
  // that carries nothing else (cheap when the pool already holds the memory).
  void* allocate(std::size_t bytes, std::string_view tag);

  // DeviceMemory's destructor: frees on the internal stream (the caller has ensured, per the
  // contract, that no stream still uses the memory), or on the stream release_after named.
  void release(void* ptr) noexcept override;

  // Stream::release_after: the next release of `ptr` frees it in `stream`'s order. False if `ptr`
  // is not an allocation of this device.
  bool free_on_stream(void* ptr, cudaStream_t stream);

  MemoryStats stats() const;
  void reset_peak();

  // cudaHostRegister of a large buffer takes a while, so it runs outside the lock; the registry
  // entry is claimed first so that two threads cannot pin the same memory.
  void pin(void* ptr, std::size_t bytes);
  void unpin(void* ptr) noexcept;
  // Whether [ptr, ptr + bytes) lies inside one host range this device pinned; a copy of host memory
  // that does not is counted (MemoryStats::pageable_copies; Note [Pageable copies] in
  // core/device/sim_stream.cc).
  bool pinned_range(const void* ptr, std::size_t bytes) const;
  void count_pageable(std::size_t bytes);

  // Streams and events are registered so that the state's destructor can destroy the ones that
  // outlive the Device (Note [Cuda lifetimes] in core/device/cuda_device_cuda.cc).
  void add_stream(cudaStream_t s);
  void destroy_stream(cudaStream_t s) noexcept;
  void add_event(cudaEvent_t e);
  void destroy_event(cudaEvent_t e) noexcept;

  const int ordinal;
  const std::string name;

 private:
  struct Allocation {
    std::size_t bytes;     // rounded, as counted
    std::string tag;
    cudaStream_t free_on;  // set by release_after; null: the internal stream
  };

  MemoryStats stats_locked() const;
  [[noreturn]] void throw_out_of_memory_locked(std::size_t bytes, std::string_view tag, std::string_view why) const;

  mutable std::mutex mutex_;
  cudaMemPool_t pool_ = nullptr;
  cudaStream_t alloc_stream_ = nullptr;
  MemoryStats stats_;
  std::unordered_map<void*, Allocation> allocations_;
  std::map<void*, std::size_t> pinned_;
  std::set<cudaStream_t> streams_;
  std::set<cudaEvent_t> events_;
};

}  // namespace strata::cuda_backend
