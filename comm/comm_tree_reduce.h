// CUDA launcher of the deterministic tree reduction (comm/comm_tree_reduce.cu), declared without
// CUDA headers. Rank r's contribution is the `count` elements at parts + r * count (device memory).
#pragma once

#include <cstddef>

#include "core/dtype.h"

namespace strata {

void launch_tree_reduce(const void* parts_device, int world, void* out, std::size_t count_elems, DType dtype,
                        int op, void* cuda_stream);

}  // namespace strata
