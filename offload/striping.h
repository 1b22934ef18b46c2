// How a tensor is spread over several swap files, one per drive: large tensors are split into
// one 4 KiB-aligned part per file so every drive streams its share at once; small ones (below
// stripe_min_bytes per file) stay whole in the file with the most free space, where one request
// costs less than several small ones.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace strata::offload {

// Bytes of a `padded_bytes` tensor (a multiple of 4 KiB) to place in each file; entries sum to
// padded_bytes and are multiples of 4 KiB. `free_bytes[i]` is file i's free space; a plan that
// does not fit returns a split anyway (the allocator then reports the store full).
std::vector<std::uint64_t> plan_stripes(std::uint64_t padded_bytes, std::span<const std::uint64_t> free_bytes,
                                        std::uint64_t stripe_min_bytes);

}  // namespace strata::offload
