// Aligned host memory (see core/host_buffer.h).
#include "core/host_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/topology.h"
#include "core/units.h"

namespace strata {
namespace {
constexpr std::size_t kHugePageBytes = 2 * MiB;

std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }
}  // namespace

HostBuffer HostBuffer::allocate(std::size_t bytes, const HostBufferOptions& options) {
  const std::size_t align = options.alignment_bytes;
  if (align == 0 || (align & (align - 1)) != 0) {
    throw ConfigError(fmt::format("host buffer alignment {} is not a power of two", align));
  }
  HostBuffer buf;
  if (bytes == 0) return buf;

  const std::size_t extra = align > 4096 ? align : 0;
  std::size_t map_bytes = round_up(bytes + extra, 4096);
  void* base = MAP_FAILED;
  if (options.huge_pages == HugePages::Explicit) {
    const std::size_t huge_bytes = round_up(bytes + extra, kHugePageBytes);
    base = mmap(nullptr, huge_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (base != MAP_FAILED) {
      map_bytes = huge_bytes;
      buf.hugetlb_ = true;
    } else {
      spdlog::debug("no explicit huge pages for a {} host buffer ({}); using transparent huge pages",
                    format_bytes(bytes), errno_text(errno));
    }
  }
  if (base == MAP_FAILED) {
    base = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
      throw OutOfMemoryError(fmt::format("cannot map a {} host buffer: {}", format_bytes(bytes), errno_text(errno)));
    }
    if (options.huge_pages != HugePages::Off) {
      madvise(base, map_bytes, MADV_HUGEPAGE);  // advisory; failure only costs TLB misses
    }
  }
  buf.map_base_ = base;
  buf.map_bytes_ = map_bytes;
  const auto addr = reinterpret_cast<std::uintptr_t>(base);
  buf.data_ = reinterpret_cast<void*>(round_up(addr, align > 4096 ? align : 4096));
  buf.bytes_ = bytes;

  if (options.topology != nullptr && options.numa_node >= 0) {
    if (!options.topology->bind_memory(buf.data_, bytes, options.numa_node)) {
      spdlog::debug("could not bind a {} host buffer to NUMA node {}", format_bytes(bytes), options.numa_node);
    }
  }
  if (options.pinner != nullptr) {
    options.pinner->pin_host(buf.data_, bytes);  // on throw, buf's destructor unmaps
    buf.pinner_ = options.pinner;
  }
  return buf;
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    release();
    map_base_ = std::exchange(other.map_base_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    hugetlb_ = std::exchange(other.hugetlb_, false);
    pinner_ = std::exchange(other.pinner_, nullptr);
  }
  return *this;
}

HostBuffer::~HostBuffer() { release(); }

void HostBuffer::release() noexcept {
  if (pinner_ != nullptr) {
    pinner_->unpin_host(data_);
    pinner_ = nullptr;
  }
  if (map_base_ != nullptr) {
    munmap(map_base_, map_bytes_);
    map_base_ = nullptr;
  }
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace strata
