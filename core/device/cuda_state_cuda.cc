// The cuda backend's shared state (see core/device/cuda_state_cuda.h): device memory from a
// stream-ordered pool of Strata's own (cudaMemPoolCreate + cudaMallocFromPoolAsync / cudaFreeAsync)
// under Strata's own capacity accounting, page-locking through cudaHostRegister, and the registry
// of the streams and events the Device handed out. Like the rest of the backend it is verified by
// compilation (warnings as errors) and by review (core/device/cuda_device_cuda.cc).
//
// Note [Cuda capacity]: the capacity is the memory limit (or, without one, the free memory when
// the device was opened). Allocations are rounded up to 256 bytes and counted against it before
// the pool is asked, so the cap holds even though the pool itself would grow to the whole GPU; a
// pool failure is reported the same way (OutOfMemoryError with format_memory_report). The pool
// keeps freed memory up to the capacity (release threshold) instead of returning it to the driver
// at every synchronization. Its internal fragmentation is not visible through the runtime API, so
// largest_free_block_bytes reports the free bytes. allocate() waits for alloc_stream_; the pool
// could let an allocation reuse memory whose free is still queued on another stream by making
// alloc_stream_ wait for that stream (cudaMemPoolReuseAllowInternalDependencies, on by default),
// and allocate() would then wait for whatever that stream still has queued (compute, a gather).
// No stream ever waits for the host (Note [Host-driven offload] in docs/DESIGN.md), so that wait
// would end, but it would stall the host's enqueueing for no gain: that reuse is off, the pool
// reuses only frees that have run, and grows (up to the GPU, under the capacity counted here)
// otherwise.
#include "core/device/cuda_state_cuda.h"

#include <cuda.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/units.h"

namespace strata::cuda_backend {
namespace {

constexpr std::size_t kAllocGranularityBytes = 256;

void log_if_failed(cudaError_t err, const char* what, const std::string& device_name) noexcept {
  if (err != cudaSuccess) spdlog::error("{}: {} failed: {}", device_name, what, cuda_text(err));
}

}  // namespace

std::string cuda_text(cudaError_t err) { return fmt::format("{} ({})", cudaGetErrorString(err), cudaGetErrorName(err)); }

void* driver_symbol(const char* name) noexcept {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}

std::string describe_pointer(const void* p, std::size_t bytes) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return fmt::format("{} (CUDA cannot say what it is)", p);
  }
  const auto* last = static_cast<const std::byte*>(p) + bytes - 1;
  cudaPointerAttributes b{};
  const bool last_known = cudaPointerGetAttributes(&b, last) == cudaSuccess;
  if (!last_known) (void)cudaGetLastError();
  auto kind = [](cudaMemoryType t) {
    switch (t) {
      case cudaMemoryTypeHost: return "page-locked host memory";
      case cudaMemoryTypeDevice: return "device memory";
      case cudaMemoryTypeManaged: return "managed memory";
      default: return "memory unknown to CUDA: pageable host memory, or device memory already freed";
    }
  };
  std::string s = fmt::format("{} ({}", p, kind(a.type));
  using Range = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);
  CUdeviceptr base = 0;
  std::size_t size = 0;
  if (a.type == cudaMemoryTypeDevice) {
    if (auto range = reinterpret_cast<Range>(driver_symbol("cuMemGetAddressRange"));
        range != nullptr && range(&base, &size, reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS) {
      const std::size_t offset = reinterpret_cast<CUdeviceptr>(p) - base;
      s += fmt::format(", {} B into an allocation of {} B", offset, size);
      if (offset + bytes > size) s += fmt::format(": the copy runs {} B past its end", offset + bytes - size);
    }
  }
  if (last_known && b.type != a.type) s += fmt::format("; its last byte is {}", kind(b.type));
  return s + ")";
}

CudaState::CudaState(int ordinal_in, std::string name_in, std::size_t capacity)
    : ordinal(ordinal_in), name(std::move(name_in)) {
  stats_.capacity_bytes = capacity;
  ScopedDevice on(ordinal);
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = ordinal;
  STRATA_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
  try {
    std::uint64_t keep_bytes = capacity;  // Note [Cuda capacity]
    STRATA_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_bytes));
    int no_internal_dependencies = 0;  // Note [Cuda capacity]
    STRATA_CUDA_CHECK(
        cudaMemPoolSetAttribute(pool_, cudaMemPoolReuseAllowInternalDependencies, &no_internal_dependencies));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&alloc_stream_, cudaStreamNonBlocking));
  } catch (...) {
    (void)cudaMemPoolDestroy(pool_);
    throw;
  }
}

CudaState::~CudaState() {
  ScopedDevice on(ordinal, std::nothrow);
  std::lock_guard lock(mutex_);
  // Work still queued may read or write the memory freed below.
  for (cudaStream_t s : streams_) log_if_failed(cudaStreamSynchronize(s), "cudaStreamSynchronize", name);
  for (const auto& [ptr, a] : allocations_) log_if_failed(cudaFreeAsync(ptr, alloc_stream_), "cudaFreeAsync", name);
  log_if_failed(cudaStreamSynchronize(alloc_stream_), "cudaStreamSynchronize", name);
  for (const auto& [ptr, bytes] : pinned_) {
    spdlog::warn("{}: host memory at {} ({}) was still pinned when the device was destroyed; unpinning it", name,
                 ptr, format_bytes(bytes));
    log_if_failed(cudaHostUnregister(ptr), "cudaHostUnregister", name);
  }
  for (cudaEvent_t e : events_) log_if_failed(cudaEventDestroy(e), "cudaEventDestroy", name);
  for (cudaStream_t s : streams_) log_if_failed(cudaStreamDestroy(s), "cudaStreamDestroy", name);
  log_if_failed(cudaStreamDestroy(alloc_stream_), "cudaStreamDestroy", name);
  log_if_failed(cudaMemPoolDestroy(pool_), "cudaMemPoolDestroy", name);
}

void* CudaState::allocate(std::size_t bytes, std::string_view tag) {
  const std::size_t rounded = (bytes + kAllocGranularityBytes - 1) / kAllocGranularityBytes * kAllocGranularityBytes;
  {
    std::lock_guard lock(mutex_);
    if (stats_.allocated_bytes + rounded > stats_.capacity_bytes) {
      ++stats_.failed_allocations;
      throw_out_of_memory_locked(bytes, tag, "over the device's capacity");
    }
    stats_.allocated_bytes += rounded;  // reserved now, so concurrent callers cannot overshoot
  }
  void* ptr = nullptr;
  cudaError_t err = cudaSuccess;
  {
    ScopedDevice on(ordinal);
    err = cudaMallocFromPoolAsync(&ptr, bytes, pool_, alloc_stream_);
    if (err == cudaSuccess) {
      err = cudaStreamSynchronize(alloc_stream_);
      if (err != cudaSuccess) (void)cudaFreeAsync(ptr, alloc_stream_);
    }
  }
  std::lock_guard lock(mutex_);
  if (err != cudaSuccess) {
    stats_.allocated_bytes -= rounded;
    ++stats_.failed_allocations;
    (void)cudaGetLastError();  // allocation failures are not sticky; clear the runtime's last error
    if (err == cudaErrorMemoryAllocation) throw_out_of_memory_locked(bytes, tag, "the CUDA memory pool is exhausted");
    STRATA_CUDA_CHECK(err);
  }
  const std::string tag_name(tag);
  allocations_.emplace(ptr, Allocation{rounded, tag_name, nullptr});
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  const std::size_t tag_bytes = stats_.bytes_by_tag[tag_name] += rounded;
  std::size_t& tag_peak = stats_.peak_bytes_by_tag[tag_name];
  tag_peak = std::max(tag_peak, tag_bytes);
  ++stats_.live_allocations;
  ++stats_.total_allocations;
  return ptr;
}

void CudaState::release(void* ptr) noexcept {
  cudaStream_t stream = nullptr;
  {
    std::lock_guard lock(mutex_);
    auto it = allocations_.find(ptr);
    if (it == allocations_.end()) {
      spdlog::error("{}: release of {} which is not a live allocation of this device", name, ptr);
      return;
    }
    const Allocation& a = it->second;
    stream = a.free_on != nullptr ? a.free_on : alloc_stream_;
    stats_.allocated_bytes -= a.bytes;
    auto tag = stats_.bytes_by_tag.find(a.tag);
    tag->second -= a.bytes;
    if (tag->second == 0) stats_.bytes_by_tag.erase(tag);
    --stats_.live_allocations;
    allocations_.erase(it);
  }
  ScopedDevice on(ordinal, std::nothrow);
  log_if_failed(cudaFreeAsync(ptr, stream), "cudaFreeAsync", name);
}

bool CudaState::free_on_stream(void* ptr, cudaStream_t stream) {
  std::lock_guard lock(mutex_);
  auto it = allocations_.find(ptr);
  if (it == allocations_.end()) return false;
  it->second.free_on = stream;
  return true;
}

MemoryStats CudaState::stats() const {
  std::lock_guard lock(mutex_);
  return stats_locked();
}

void CudaState::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_bytes_by_tag = stats_.bytes_by_tag;
}

void CudaState::pin(void* ptr, std::size_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    throw DeviceError(fmt::format("{}: pin_host({}, {} bytes): nothing to pin; pass a non-empty host buffer", name,
                                  ptr, bytes));
  }
  {
    std::lock_guard lock(mutex_);
    if (!pinned_.emplace(ptr, 0).second) {
      throw DeviceError(fmt::format("{}: pin_host({}): this host memory is already pinned; unpin it first", name, ptr));
    }
  }
  cudaError_t err = cudaSuccess;
  {
    ScopedDevice on(ordinal, std::nothrow);
    err = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
  }
  std::lock_guard lock(mutex_);
  if (err != cudaSuccess) {
    pinned_.erase(ptr);
    (void)cudaGetLastError();
    throw DeviceError(fmt::format(
        "{}: cannot page-lock {} of host memory at {}: cudaHostRegister: {}. Pinned memory is limited by "
        "`ulimit -l` (RLIMIT_MEMLOCK) and by the machine's RAM; raise the limit or use smaller pinned buffers",
        name, format_bytes(bytes), ptr, cuda_text(err)));
  }
  pinned_[ptr] = bytes;
  stats_.pinned_host_bytes += bytes;
  ++stats_.host_pins;  // Note [Pinning while streams run] (core/device/sim_device.cc)
}

void CudaState::unpin(void* ptr) noexcept {
  {
    std::lock_guard lock(mutex_);
    auto it = pinned_.find(ptr);
    if (it == pinned_.end()) {
      spdlog::error("{}: unpin_host({}) of memory this device did not pin", name, ptr);
      return;
    }
    stats_.pinned_host_bytes -= it->second;
    pinned_.erase(it);
  }
  ScopedDevice on(ordinal, std::nothrow);
  log_if_failed(cudaHostUnregister(ptr), "cudaHostUnregister", name);
}

bool CudaState::pinned_range(const void* ptr, std::size_t bytes) const {
  std::lock_guard lock(mutex_);
  return detail::inside_one_range(pinned_, ptr, bytes);
}

void CudaState::count_pageable(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  ++stats_.pageable_copies;
  stats_.pageable_copy_bytes += bytes;
}

void CudaState::add_stream(cudaStream_t s) {
  std::lock_guard lock(mutex_);
  streams_.insert(s);
}

void CudaState::destroy_stream(cudaStream_t s) noexcept {
  std::lock_guard lock(mutex_);
  if (streams_.erase(s) == 0) return;
  ScopedDevice on(ordinal, std::nothrow);
  // cudaStreamDestroy returns at once and lets queued work finish, as a Stream's destructor should.
  log_if_failed(cudaStreamDestroy(s), "cudaStreamDestroy", name);
}

void CudaState::add_event(cudaEvent_t e) {
  std::lock_guard lock(mutex_);
  events_.insert(e);
}

void CudaState::destroy_event(cudaEvent_t e) noexcept {
  std::lock_guard lock(mutex_);
  if (events_.erase(e) == 0) return;
  ScopedDevice on(ordinal, std::nothrow);
  log_if_failed(cudaEventDestroy(e), "cudaEventDestroy", name);
}

MemoryStats CudaState::stats_locked() const {
  MemoryStats s = stats_;
  s.free_bytes = s.capacity_bytes - std::min(s.capacity_bytes, s.allocated_bytes);
  s.largest_free_block_bytes = s.free_bytes;  // Note [Cuda capacity]
  return s;
}

void CudaState::throw_out_of_memory_locked(std::size_t bytes, std::string_view tag, std::string_view why) const {
  throw OutOfMemoryError(fmt::format("cannot allocate {} for '{}' on {}: {}\n{}", format_bytes(bytes), tag, name, why,
                                     format_memory_report(name, stats_locked())));
}

}  // namespace strata::cuda_backend
