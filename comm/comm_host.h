// Collectives over host memory, run on the calling thread: what the MPI communicator does inside
// its sim kernels, and what the staged communicator calls from the host between its copies (Note
// [Staged MPI] in comm/comm_staged.cc). Internal to the communicators (comm/comm_*.cc).
#pragma once

#include <cstddef>
#include <span>

#include "comm/communicator.h"

namespace strata {

class HostCollectives {
 public:
  // As Communicator's stream-ordered calls, over host memory, returning when done.
  virtual void all_gather_now(const void* send, void* recv, std::size_t count_elems, DType dtype) = 0;
  virtual void reduce_scatter_now(const void* send, void* recv, std::size_t recv_count_elems, DType dtype,
                                  ReduceOp op) = 0;
  virtual void all_reduce_now(const void* send, void* recv, std::size_t count_elems, DType dtype, ReduceOp op) = 0;
  virtual void broadcast_now(void* buffer, std::size_t count_elems, DType dtype, int root) = 0;
  virtual void exchange_now(std::span<const PeerOp> ops) = 0;

 protected:
  ~HostCollectives() = default;
};

}  // namespace strata
