// The sim device's counted capacity and best-fit arena (design in core/device/sim_allocator.h).
#include "core/device/sim_allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"

namespace strata {
namespace {

bool is_power_of_two(std::size_t x) { return x != 0 && (x & (x - 1)) == 0; }

std::size_t page_bytes() {
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

std::size_t checked_alignment(const SimAllocatorOptions& options) {
  if (!is_power_of_two(options.alignment_bytes)) {
    throw ConfigError(fmt::format("{}: alignment_bytes {} is not a power of two; use 256, 512, 4096, ...",
                                  options.device_name, options.alignment_bytes));
  }
  return std::max<std::size_t>(options.alignment_bytes, 256);
}

#if defined(STRATA_DEBUG_POISON)
// Fills [begin, begin + bytes) with kSimPoisonByte, skipping whole pages that are not resident:
// they were never written (or were given back), read as zeros, and hold no stale data; touching
// them would commit memory (a freed 32 GiB block of a large arena would commit 32 GiB).
void poison_resident(std::byte* begin, std::size_t bytes) {
  const std::size_t page = page_bytes();
  const auto addr = reinterpret_cast<std::uintptr_t>(begin);
  const std::uintptr_t first_page = (addr + page - 1) & ~(std::uintptr_t{page} - 1);
  const std::uintptr_t end_page = (addr + bytes) & ~(std::uintptr_t{page} - 1);
  if (bytes < 16 * page || end_page <= first_page) {
    std::memset(begin, kSimPoisonByte, bytes);
    return;
  }
  std::memset(begin, kSimPoisonByte, first_page - addr);  // partial head page
  std::memset(reinterpret_cast<void*>(end_page), kSimPoisonByte, addr + bytes - end_page);  // partial tail
  constexpr std::size_t kWindowPages = 4096;
  unsigned char resident[kWindowPages];
  for (std::uintptr_t window = first_page; window < end_page; window += kWindowPages * page) {
    const std::size_t pages = std::min<std::size_t>(kWindowPages, (end_page - window) / page);
    if (::mincore(reinterpret_cast<void*>(window), pages * page, resident) != 0) {
      std::memset(reinterpret_cast<void*>(window), kSimPoisonByte, pages * page);  // unknown: poison all
      continue;
    }
    for (std::size_t i = 0; i < pages; ++i) {
      if ((resident[i] & 1) != 0) std::memset(reinterpret_cast<void*>(window + i * page), kSimPoisonByte, page);
    }
  }
}
#endif

}  // namespace

SimAllocator::SimAllocator(const SimAllocatorOptions& options)
    : name_(options.device_name),
      alignment_bytes_(checked_alignment(options)),
      capacity_bytes_(options.capacity_bytes / alignment_bytes_ * alignment_bytes_),
      release_pages_min_bytes_(options.release_pages_min_bytes) {
  if (capacity_bytes_ == 0) {
    throw ConfigError(fmt::format("{}: capacity of {} bytes is below one aligned block of {} bytes; "
                                  "set a larger device memory size",
                                  name_, options.capacity_bytes, alignment_bytes_));
  }
  // Alignments above a page need slack to align the arena's start inside the mapping.
  const std::size_t slack = alignment_bytes_ > page_bytes() ? alignment_bytes_ : 0;
  if (capacity_bytes_ > (std::numeric_limits<std::size_t>::max() - alignment_bytes_) / kSimArenaHeadroom) {
    throw ConfigError(fmt::format("{}: a capacity of {} bytes is beyond this machine's address space; set a "
                                  "smaller device memory size ({})",
                                  name_, options.capacity_bytes, options.capacity_knob));
  }
  arena_bytes_ = capacity_bytes_ * kSimArenaHeadroom;  // Note [Sim arena] in core/device/sim_allocator.h
  map_bytes_ = arena_bytes_ + slack;
  void* p = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    throw DeviceError(fmt::format("{}: cannot reserve {} of address space for the sim device arena: {}; "
                                  "lower the device memory size ({})",
                                  name_, format_bytes(arena_bytes_), errno_text(err), options.capacity_knob));
  }
  map_base_ = p;
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t aligned = (addr + alignment_bytes_ - 1) & ~(std::uintptr_t{alignment_bytes_} - 1);
  base_ = reinterpret_cast<std::byte*>(aligned);
  blocks_.emplace(0, Block{arena_bytes_, true, {}});
  free_by_size_.emplace(arena_bytes_, 0);
}

SimAllocator::~SimAllocator() {
  if (map_base_ != nullptr) ::munmap(map_base_, map_bytes_);
}

void SimAllocator::insert_free(std::size_t offset, std::size_t bytes) { free_by_size_.emplace(bytes, offset); }

void SimAllocator::erase_free(std::size_t offset, std::size_t bytes) {
  const auto erased = free_by_size_.erase({bytes, offset});
  STRATA_CHECK(erased == 1, "{}: free block at offset {} ({} bytes) missing from the size index", name_, offset,
               bytes);
}

void* SimAllocator::allocate(std::size_t bytes, std::string_view tag) {
  if (bytes == 0) {
    throw DeviceError(fmt::format("{}: zero-byte allocation requested (tag '{}'); a caller computed an empty "
                                  "size, allocate only non-empty buffers",
                                  name_, tag));
  }
  std::lock_guard lock(mutex_);
  const bool fits_at_all = bytes <= capacity_bytes_ - allocated_bytes_;  // the counted cap
  const std::size_t rounded = fits_at_all ? (bytes + alignment_bytes_ - 1) / alignment_bytes_ * alignment_bytes_ : 0;
  const bool counted = fits_at_all && rounded <= capacity_bytes_ - allocated_bytes_;
  auto fit = counted ? free_by_size_.lower_bound({rounded, 0}) : free_by_size_.end();
  if (fit == free_by_size_.end()) {
    ++failed_allocations_;
    const MemoryStats s = stats_locked();
    const std::string why =
        counted ? fmt::format("the capacity would hold it but the sim arena ({}x the capacity) has no free block "
                              "that large (Note [Sim arena] in core/device/sim_allocator.h)",
                              kSimArenaHeadroom)
                : fmt::format("only {} of the capacity is free", format_bytes(s.free_bytes));
    throw OutOfMemoryError(fmt::format(
        "{}\n  failed request: {} ({} bytes) for tag '{}', but {}; free memory, offload more state, or raise the "
        "device memory size",
        format_memory_report(name_, s), format_bytes(bytes), bytes, tag, why));
  }
  const auto [block_bytes, offset] = *fit;
  free_by_size_.erase(fit);
  auto it = blocks_.find(offset);
  STRATA_CHECK(it != blocks_.end() && it->second.free && it->second.bytes == block_bytes,
               "{}: size index points at offset {} which is not a free block of {} bytes", name_, offset, block_bytes);
  if (block_bytes > rounded) {  // split: the tail stays free
    const std::size_t tail_offset = offset + rounded;
    const std::size_t tail_bytes = block_bytes - rounded;
    blocks_.emplace_hint(std::next(it), tail_offset, Block{tail_bytes, true, {}});
    insert_free(tail_offset, tail_bytes);
    it->second.bytes = rounded;
  }
  it->second.free = false;
  it->second.retired = false;
  it->second.tag.assign(tag);

  allocated_bytes_ += rounded;
  peak_allocated_bytes_ = std::max(peak_allocated_bytes_, allocated_bytes_);
  ++live_allocations_;
  ++total_allocations_;
  auto tag_it = bytes_by_tag_.find(tag);
  if (tag_it == bytes_by_tag_.end()) tag_it = bytes_by_tag_.emplace(std::string(tag), 0).first;
  tag_it->second += rounded;
  auto& tag_peak = peak_bytes_by_tag_[tag_it->first];
  tag_peak = std::max(tag_peak, tag_it->second);
  return base_ + offset;
}

void SimAllocator::release(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto* p = static_cast<std::byte*>(ptr);
  const bool in_arena = p >= base_ && p < base_ + arena_bytes_;
  auto it = in_arena ? blocks_.find(static_cast<std::size_t>(p - base_)) : blocks_.end();
  if (it == blocks_.end() || it->second.free) {
    std::fprintf(stderr, "strata: %s: release of %p which is not a live allocation (double free?); ignored\n",
                 name_.c_str(), ptr);
    return;
  }
  const std::size_t freed_offset = it->first;
  const std::size_t freed_bytes = it->second.bytes;
  allocated_bytes_ -= freed_bytes;
  --live_allocations_;
  auto tag_it = bytes_by_tag_.find(it->second.tag);
  if (tag_it != bytes_by_tag_.end()) tag_it->second -= freed_bytes;
  it->second.free = true;
  it->second.retired = false;
  it->second.tag.clear();
  it->second.tag.shrink_to_fit();

  // Merge with the free neighbours so freed space returns to one block.
  if (auto next = std::next(it); next != blocks_.end() && next->second.free) {
    erase_free(next->first, next->second.bytes);
    it->second.bytes += next->second.bytes;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free) {
      erase_free(prev->first, prev->second.bytes);
      prev->second.bytes += it->second.bytes;
      blocks_.erase(it);
      it = prev;
    }
  }
  insert_free(it->first, it->second.bytes);
  scrub_freed(freed_offset, freed_bytes, it->first, it->second.bytes);
}

// See Note [Freed pages] in core/device/sim_allocator.h.
void SimAllocator::scrub_freed(std::size_t freed_offset, std::size_t freed_bytes, std::size_t merged_offset,
                               std::size_t merged_bytes) {
#if defined(STRATA_DEBUG_POISON)
  (void)merged_offset;
  (void)merged_bytes;
  poison_resident(base_ + freed_offset, freed_bytes);
#else
  if (freed_bytes < release_pages_min_bytes_) return;
  // Extend by up to a page into the merged free block on each side: a page shared with a
  // neighbour that was already free is now entirely free and can go too.
  const std::size_t page = page_bytes();
  const std::size_t begin_offset = std::max(merged_offset, freed_offset - std::min(freed_offset, page));
  const auto addr_begin = reinterpret_cast<std::uintptr_t>(base_ + begin_offset);
  const auto addr_end = reinterpret_cast<std::uintptr_t>(
      base_ + std::min(merged_offset + merged_bytes, freed_offset + freed_bytes + page));
  const std::uintptr_t first_page = (addr_begin + page - 1) & ~(std::uintptr_t{page} - 1);
  const std::uintptr_t end_page = addr_end & ~(std::uintptr_t{page} - 1);
  if (end_page > first_page) {
    // Failure only means the pages stay resident; the memory is still correct to reuse.
    (void)::madvise(reinterpret_cast<void*>(first_page), end_page - first_page, MADV_DONTNEED);
  }
#endif
}

MemoryStats SimAllocator::stats_locked() const {
  MemoryStats s;
  s.capacity_bytes = capacity_bytes_;
  s.allocated_bytes = allocated_bytes_;
  s.peak_allocated_bytes = peak_allocated_bytes_;
  s.free_bytes = capacity_bytes_ - allocated_bytes_;
  // What one request can get is the counted free bytes, as on cuda, unless the arena itself has no
  // block that large (see Note [Sim arena] in core/device/sim_allocator.h).
  const std::size_t largest_block = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  s.largest_free_block_bytes = std::min(s.free_bytes, largest_block);
  s.live_allocations = live_allocations_;
  s.total_allocations = total_allocations_;
  s.failed_allocations = failed_allocations_;
  s.bytes_by_tag.insert(bytes_by_tag_.begin(), bytes_by_tag_.end());
  s.peak_bytes_by_tag.insert(peak_bytes_by_tag_.begin(), peak_bytes_by_tag_.end());
  return s;
}

MemoryStats SimAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_locked();
}

void SimAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  peak_allocated_bytes_ = allocated_bytes_;
  // Tags with nothing live are forgotten; the rest restart their peak at the live size.
  for (auto it = bytes_by_tag_.begin(); it != bytes_by_tag_.end();) {
    if (it->second == 0) {
      peak_bytes_by_tag_.erase(it->first);
      it = bytes_by_tag_.erase(it);
    } else {
      peak_bytes_by_tag_[it->first] = it->second;
      ++it;
    }
  }
}

bool SimAllocator::contains(const void* ptr, std::size_t bytes) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const auto begin = reinterpret_cast<std::uintptr_t>(base_);
  if (addr < begin) return false;
  const std::size_t offset = addr - begin;
  return offset <= arena_bytes_ && bytes <= arena_bytes_ - offset;
}

std::size_t SimAllocator::allocation_bytes(const void* ptr) const {
  if (!contains(ptr, 0)) return 0;
  std::lock_guard lock(mutex_);
  auto it = blocks_.find(static_cast<std::size_t>(static_cast<const std::byte*>(ptr) - base_));
  return (it == blocks_.end() || it->second.free) ? 0 : it->second.bytes;
}

void SimAllocator::retire(const void* ptr) noexcept {
  if (!contains(ptr, 0)) return;
  std::lock_guard lock(mutex_);
  auto it = blocks_.find(static_cast<std::size_t>(static_cast<const std::byte*>(ptr) - base_));
  if (it != blocks_.end() && !it->second.free) it->second.retired = true;
}

std::string SimAllocator::usable(const void* ptr, std::size_t bytes) const {
  if (!contains(ptr, bytes)) return "it is not inside the device's memory";
  const auto offset = static_cast<std::size_t>(static_cast<const std::byte*>(ptr) - base_);
  std::lock_guard lock(mutex_);
  auto it = blocks_.upper_bound(offset);  // the block holding offset is the one before
  if (it == blocks_.begin()) return "it is not inside an allocation";
  --it;
  const Block& b = it->second;
  if (b.free) return "it lies in memory that is not allocated (freed already, or never allocated)";
  if (b.retired) {
    return fmt::format("its allocation ('{}') was released with release_after before this was issued, and CUDA "
                       "forbids work issued after cudaFreeAsync from naming the memory (Note [Released memory] in core/device/sim_allocator.h)",
                       b.tag);
  }
  if (offset + bytes > it->first + b.bytes) {
    return fmt::format("it runs {} bytes past the end of its allocation ('{}', {} bytes)",
                       offset + bytes - (it->first + b.bytes), b.tag, b.bytes);
  }
  return {};
}

}  // namespace strata
