// Aligned host memory: the buffers that O_DIRECT I/O, host<->device copies and CPU Adam work on.
//
// Every HostBuffer is an anonymous mmap, so it is page-aligned (4 KiB, what O_DIRECT needs) and
// returned to the OS on destruction. Options: a larger alignment; huge pages (explicit hugetlbfs
// pages when the kernel has them reserved, else transparent huge pages via madvise); placement
// on a NUMA node through hwloc; and page-locking through a HostMemoryPinner, the hook a Device
// fills in (cudaHostRegister on cuda, bookkeeping on sim) so copies can DMA from the buffer.
#pragma once

#include <cstddef>
#include <span>

namespace strata {

class Topology;

// Implemented by devices: makes host memory DMA-able for that device.
class HostMemoryPinner {
 public:
  virtual ~HostMemoryPinner() = default;
  virtual void pin_host(void* ptr, std::size_t bytes) = 0;  // throws DeviceError on failure
  virtual void unpin_host(void* ptr) noexcept = 0;
};

enum class HugePages {
  Off,          // plain 4 KiB pages
  Transparent,  // madvise(MADV_HUGEPAGE)
  Explicit,     // MAP_HUGETLB 2 MiB pages, falling back to Transparent when none are reserved
};

struct HostBufferOptions {
  std::size_t alignment_bytes = 4096;  // power of two; > 4096 over-allocates
  HugePages huge_pages = HugePages::Off;
  const Topology* topology = nullptr;  // with numa_node >= 0: bind pages to that node
  int numa_node = -1;
  HostMemoryPinner* pinner = nullptr;  // page-lock through this device hook
};

class HostBuffer {
 public:
  HostBuffer() = default;
  // Throws OutOfMemoryError (with the size) if the memory cannot be mapped, ConfigError for a bad
  // alignment, DeviceError if pinning fails.
  static HostBuffer allocate(std::size_t bytes, const HostBufferOptions& options = {});

  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  void* data() const { return data_; }
  std::size_t size_bytes() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }
  bool pinned() const { return pinner_ != nullptr; }
  bool explicit_huge_pages() const { return hugetlb_; }

  template <typename T>
  std::span<T> as() const {
    return std::span<T>(static_cast<T*>(data_), bytes_ / sizeof(T));
  }

 private:
  void release() noexcept;

  void* map_base_ = nullptr;
  std::size_t map_bytes_ = 0;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool hugetlb_ = false;
  HostMemoryPinner* pinner_ = nullptr;
};

}  // namespace strata
