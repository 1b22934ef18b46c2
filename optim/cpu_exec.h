// How the CPU optimizer kernels run: the SIMD level and the oneTBB arena (thread count), passed
// explicitly by the caller (no global state), and the one blocking scheme every pass shares.
//
// Note [Blocks]: every CPU pass (AdamW, SGD, Lion, the gradient norm, the Adam-shaped memory pass
// and the unfused baseline passes) cuts each shard into fixed blocks of kCpuBlockElems elements
// (64 KiB per fp32 stream, so the four Adam streams of a block sit in L2) and hands contiguous
// runs of blocks to the threads with tbb::static_partitioner (long sequential runs keep the
// hardware prefetchers streaming). Element-wise results cannot depend on the split; reductions
// produce one partial per block and combine the partials in block order, so they do not depend on
// the thread count either.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include "core/cpu_features.h"

namespace strata::optim {

inline constexpr std::size_t kCpuBlockElems = 16384;

struct CpuExec {
  SimdLevel simd = SimdLevel::Scalar;
  tbb::task_arena* arena = nullptr;  // nullptr: run in the calling thread's arena
};

// The best SIMD level of this CPU (lowered by STRATA_SIMD), in the caller's arena.
inline CpuExec default_cpu_exec() { return CpuExec{simd_level(), nullptr}; }

namespace detail {

// Runs fn(shard_index, begin_elem, end_elem, global_block_index) for every block of every shard,
// in parallel. elems_of(i) is the element count of shard i.
template <typename ElemsOf, typename Fn>
void parallel_blocks(const CpuExec& exec, std::size_t shard_count, ElemsOf elems_of, Fn fn) {
  std::vector<std::size_t> first_block(shard_count + 1, 0);
  for (std::size_t s = 0; s < shard_count; ++s) {
    const std::size_t elems = elems_of(s);
    first_block[s + 1] = first_block[s] + (elems + kCpuBlockElems - 1) / kCpuBlockElems;
  }
  const std::size_t total_blocks = first_block[shard_count];
  if (total_blocks == 0) return;
  auto body = [&](const tbb::blocked_range<std::size_t>& range) {
    // The shard holding the range's first block; later blocks walk forward from there.
    std::size_t s = static_cast<std::size_t>(
        std::upper_bound(first_block.begin(), first_block.end(), range.begin()) - first_block.begin() - 1);
    for (std::size_t b = range.begin(); b != range.end(); ++b) {
      while (b >= first_block[s + 1]) ++s;
      const std::size_t begin = (b - first_block[s]) * kCpuBlockElems;
      const std::size_t end = std::min(begin + kCpuBlockElems, elems_of(s));
      fn(s, begin, end, b);
    }
  };
  auto run = [&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, total_blocks), body, tbb::static_partitioner());
  };
  if (exec.arena != nullptr) {
    exec.arena->execute(run);
  } else {
    run();
  }
}

}  // namespace detail
}  // namespace strata::optim
