// Free-space allocator of one swap file: 4 KiB-aligned ranges handed out best-fit, split on
// allocation and merged with their neighbours on release. A request that no single free range
// can hold is served by several ranges (largest first), so a fragmented file still fills up
// before it reports full. Not thread-safe; the swap store guards it.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace strata::offload {

struct ByteRange {
  std::uint64_t offset_bytes = 0;
  std::uint64_t length_bytes = 0;
};

class ExtentAllocator {
 public:
  static constexpr std::uint64_t kBlockBytes = 4096;

  explicit ExtentAllocator(std::uint64_t capacity_bytes);

  // Ranges totalling round_up(bytes, 4 KiB), in the order they should be filled; empty when the
  // free space is too small (nothing is taken then).
  std::vector<ByteRange> allocate(std::uint64_t bytes);
  // Returns a range from allocate() (or part of one split at 4 KiB boundaries).
  void release(const ByteRange& range);

  std::uint64_t capacity_bytes() const { return capacity_bytes_; }
  std::uint64_t free_bytes() const { return free_bytes_; }
  std::uint64_t largest_free_bytes() const;
  std::size_t fragments() const { return free_.size(); }

 private:
  std::uint64_t capacity_bytes_;
  std::uint64_t free_bytes_;
  std::map<std::uint64_t, std::uint64_t> free_;  // offset -> length, non-adjacent
};

}  // namespace strata::offload
