// Free-space allocator of one swap file (see offload/extent_allocator.h).
#include "offload/extent_allocator.h"

#include <algorithm>
#include <iterator>

#include "core/error.h"

namespace strata::offload {

ExtentAllocator::ExtentAllocator(std::uint64_t capacity_bytes)
    : capacity_bytes_(capacity_bytes / kBlockBytes * kBlockBytes), free_bytes_(capacity_bytes_) {
  if (capacity_bytes_ > 0) free_.emplace(0, capacity_bytes_);
}

std::uint64_t ExtentAllocator::largest_free_bytes() const {
  std::uint64_t best = 0;
  for (const auto& [off, len] : free_) best = std::max(best, len);
  return best;
}

std::vector<ByteRange> ExtentAllocator::allocate(std::uint64_t bytes) {
  const std::uint64_t need = (bytes + kBlockBytes - 1) / kBlockBytes * kBlockBytes;
  if (need == 0 || need > free_bytes_) return {};
  // Best fit: the smallest free range that holds everything keeps large ranges for large tensors.
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= need && (best == free_.end() || it->second < best->second)) best = it;
  }
  std::vector<ByteRange> out;
  auto take = [&](std::map<std::uint64_t, std::uint64_t>::iterator it, std::uint64_t n) {
    const std::uint64_t off = it->first;
    const std::uint64_t len = it->second;
    free_.erase(it);
    if (len > n) free_.emplace(off + n, len - n);
    free_bytes_ -= n;
    out.push_back(ByteRange{off, n});
  };
  if (best != free_.end()) {
    take(best, need);
    return out;
  }
  // Fragmented: largest ranges first, so the tensor gets as few extents as possible.
  std::uint64_t left = need;
  while (left > 0) {
    auto largest = std::max_element(free_.begin(), free_.end(),
                                    [](const auto& a, const auto& b) { return a.second < b.second; });
    STRATA_CHECK(largest != free_.end(), "free space accounting is off by {} bytes", left);
    const std::uint64_t n = std::min(left, largest->second);
    take(largest, n);
    left -= n;
  }
  std::sort(out.begin(), out.end(), [](const ByteRange& a, const ByteRange& b) { return a.offset_bytes < b.offset_bytes; });
  return out;
}

void ExtentAllocator::release(const ByteRange& range) {
  STRATA_CHECK(range.offset_bytes % kBlockBytes == 0 && range.length_bytes % kBlockBytes == 0 && range.length_bytes > 0,
               "release of an unaligned range {}+{}", range.offset_bytes, range.length_bytes);
  STRATA_CHECK(range.offset_bytes + range.length_bytes <= capacity_bytes_, "release past the end: {}+{} > {}",
               range.offset_bytes, range.length_bytes, capacity_bytes_);
  std::uint64_t off = range.offset_bytes;
  std::uint64_t len = range.length_bytes;
  auto next = free_.lower_bound(off);
  STRATA_CHECK(next == free_.end() || next->first >= off + len, "double release of {}+{}", off, len);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    STRATA_CHECK(prev->first + prev->second <= off, "double release of {}+{}", off, len);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == off + len) {
    len += next->second;
    free_.erase(next);
  }
  free_.emplace(off, len);
  free_bytes_ += range.length_bytes;
}

}  // namespace strata::offload
