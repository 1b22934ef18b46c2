// Per-element combine of two partial results, shared by the host tree reduction
// (comm/communicator.cc) and the CUDA one (comm/comm_tree_reduce.cu), so both give the same
// bits (Note [Deterministic reduction] in comm/communicator.h).
#pragma once

#include "core/hd.h"

namespace strata {

// op 0: sum; op 1: max where NaN wins, so an overflow on any rank is seen on every rank.
STRATA_HD float combine_partials(float a, float b, int op) {
  if (op == 0) return a + b;
  if (a != a || b != b) return a != a ? a : b;
  return a > b ? a : b;
}

}  // namespace strata
