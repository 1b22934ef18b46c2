// Helpers shared by the CPU kernel files: dtype dispatch to a template, fp32 load/store of any
// element type, and the two deterministic parallel loop shapes the kernels use (independent rows;
// column blocks that walk all rows in a fixed order, for reductions across rows).
#pragma once

#include <cstdint>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "core/dtype.h"
#include "core/error.h"

namespace strata::models::cpu {

// Calls f(T{}) with T the element type of `dtype`.
template <typename F>
decltype(auto) dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32: return f(float{});
    case DType::BF16: return f(bf16{});
    case DType::F16: return f(fp16{});
  }
  STRATA_CHECK(false, "unknown dtype {}", static_cast<int>(dtype));
  return f(float{});
}

template <typename T>
inline float load(const void* p, std::int64_t i) {
  return to_f32(static_cast<const T*>(p)[i]);
}
template <typename T>
inline void store(void* p, std::int64_t i, float v) {
  static_cast<T*>(p)[i] = from_f32<T>(v);
}

// Runs body(begin, end) over [0, n) in parallel. Each index must be independent of the others, so
// the partition (and the thread count) cannot change the result.
template <typename Body>
void parallel_rows(std::int64_t n, std::int64_t grain, Body&& body) {
  if (n <= 0) return;
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, grain < 1 ? 1 : grain),
                    [&](const tbb::blocked_range<std::int64_t>& r) { body(r.begin(), r.end()); });
}

// For reductions across rows: each task owns a block of columns and walks every row in order, so
// each column's sum has one fixed order whatever the partition.
inline constexpr std::int64_t kColumnBlock = 64;
template <typename Body>
void parallel_column_blocks(std::int64_t cols, Body&& body) {
  const std::int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
  parallel_rows(blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      const std::int64_t c0 = b * kColumnBlock;
      const std::int64_t c1 = c0 + kColumnBlock < cols ? c0 + kColumnBlock : cols;
      body(c0, c1);
    }
  });
}

}  // namespace strata::models::cpu
