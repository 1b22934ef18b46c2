// Spreading a tensor over several swap files (see offload/striping.h).
#include "offload/striping.h"

#include <algorithm>

#include "core/error.h"

namespace strata::offload {

std::vector<std::uint64_t> plan_stripes(std::uint64_t padded_bytes, std::span<const std::uint64_t> free_bytes,
                                        std::uint64_t stripe_min_bytes) {
  constexpr std::uint64_t kBlock = 4096;
  STRATA_CHECK(!free_bytes.empty(), "no swap files to stripe over");
  STRATA_CHECK(padded_bytes % kBlock == 0, "tensor size {} not padded to 4 KiB", padded_bytes);
  const std::size_t n = free_bytes.size();
  std::vector<std::uint64_t> plan(n, 0);
  const std::uint64_t blocks = padded_bytes / kBlock;
  if (n == 1 || padded_bytes < stripe_min_bytes * n) {
    const auto most = std::max_element(free_bytes.begin(), free_bytes.end()) - free_bytes.begin();
    plan[static_cast<std::size_t>(most)] = padded_bytes;
    return plan;
  }
  // Equal shares; the remainder blocks go to the files with the most free space.
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return free_bytes[a] > free_bytes[b]; });
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint64_t share = blocks / n + (k < blocks % n ? 1 : 0);
    plan[order[k]] = share * kBlock;
  }
  return plan;
}

}  // namespace strata::offload
