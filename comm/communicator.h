// Communicator: the collectives ZeRO needs, each enqueued on a device stream (docs/DESIGN.md,
// "Layers").
//
// Backends: `local` (one rank: collectives are copies), `mpi` (OpenMPI over host memory, used with
// the sim device, whose device memory is host memory), `nccl` (cuda device; the unique id is
// broadcast over MPI) and `mpi-staged` (MPI on cuda through pinned host copies, so that ranks may
// share one GPU: Note [Staged MPI] in comm/comm_staged.cc). Multi-rank runs start with
// `mpirun -np N strata train ...`.
//
// Note [Deterministic reduction]: in exact mode every sum across ranks is taken in one fixed order,
// a pairwise tree over rank indices ((r0 + r1) + (r2 + r3)), computed identically on every rank and
// independent of the transport's algorithm. reduce_scatter is done as an exchange (each rank
// receives every rank's copy of its chunk) followed by that tree sum; all_reduce is reduce_scatter
// followed by all_gather. The engine builds the whole gradient sum on the same tree (over
// micro-batch units), so world sizes 1, 2 and 4 give the same bits. In fast mode the transport's
// own reductions are used.
//
// Ordering rule (as NCCL's): collectives of one communicator must be issued in the same order on
// every rank; enqueue them on one stream, or order the streams with events.
//
// Note [Issue order]: a communicator runs its stream-ordered calls one at a time, in the order the
// host issued them, whichever streams they were issued on. NCCL does: it chains a communicator's
// kernels with events, because they share its buffers (NVIDIA/nccl#574). The MPI backends do the
// same (make_ordered_communicator), so that the sim device shows what NCCL would. A call that waits
// for a peer therefore holds every later call of its communicator too: a send issued before a
// receive holds the receive until the peer has received, so two ranks that each send to the other
// and then receive wait for each other for ever (NCCL's sends wait for their receive once a message
// outgrows its buffers; MPI's past its eager limit). Sends and receives that must progress together
// go in one exchange(): its transfers progress independently and it completes when all have (an
// NCCL group; MPI's nonblocking calls).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>

#include "core/device/device.h"
#include "core/dtype.h"

namespace strata {

class HostCollectives;

enum class ReduceOp { Sum, Max };
enum class ReductionOrder { Fast, Deterministic };

// One transfer of Communicator::exchange: `count_elems` of `dtype` to or from rank `peer`.
struct PeerOp {
  enum class Kind { Send, Recv };
  Kind kind = Kind::Send;
  void* buffer = nullptr;  // a send only reads it
  std::size_t count_elems = 0;
  DType dtype = DType::F32;
  int peer = 0;

  static PeerOp send(const void* buffer, std::size_t count_elems, DType dtype, int peer) {
    return {Kind::Send, const_cast<void*>(buffer), count_elems, dtype, peer};  // read only (above)
  }
  static PeerOp recv(void* buffer, std::size_t count_elems, DType dtype, int peer) {
    return {Kind::Recv, buffer, count_elems, dtype, peer};
  }
  bool sends() const { return kind == Kind::Send; }
  std::size_t bytes() const { return count_elems * dtype_bytes(dtype); }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;

  // recv holds world_size * count elements: rank r's `send` lands at recv + r * count.
  virtual void all_gather(const void* send, void* recv, std::size_t count_elems, DType dtype, Stream& stream) = 0;
  // send holds world_size * recv_count elements; rank r receives the reduction of chunk r.
  virtual void reduce_scatter(const void* send, void* recv, std::size_t recv_count_elems, DType dtype, ReduceOp op,
                              Stream& stream) = 0;
  virtual void all_reduce(const void* send, void* recv, std::size_t count_elems, DType dtype, ReduceOp op,
                          Stream& stream) = 0;
  virtual void broadcast(void* buffer, std::size_t count_elems, DType dtype, int root, Stream& stream) = 0;
  // Point to point (pipeline parallelism's activations and their gradients): the sends and
  // receives of `ops`, enqueued on `stream` as one call (Note [Issue order]): they progress
  // independently and the call completes when every one has. A send may wait until its receive is
  // posted (it does past the transport's buffers). Two transfers to one peer in one call pair with
  // the peer's in their order.
  virtual void exchange(std::span<const PeerOp> ops, Stream& stream) = 0;
  // exchange() of one transfer.
  void send(const void* buffer, std::size_t count_elems, DType dtype, int peer, Stream& stream);
  void recv(void* buffer, std::size_t count_elems, DType dtype, int peer, Stream& stream);
  // Blocks the host until every rank of this communicator has reached the barrier.
  virtual void barrier() = 0;
  // Host-side reductions of small scalars (loss, overflow flags, norms), always deterministic.
  virtual double all_reduce_host(double value, ReduceOp op) = 0;
  // Host-side broadcast of a small byte buffer (bootstrap ids, config checks).
  virtual void broadcast_host_bytes(void* data, std::size_t bytes, int root) = 0;

  // A communicator over the ranks with the same `color`, ordered by `key` (MPI_Comm_split); used
  // for hybrid sharding (shard groups of F ranks and replica groups across them).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // The same collectives run on the calling thread over host memory (comm/comm_host.h), where
  // this backend has them (mpi, and the ordered wrapper over it); null otherwise. For the staged
  // communicator (Note [Staged MPI] in comm/comm_staged.cc).
  virtual HostCollectives* host_collectives() { return nullptr; }
};

struct CommunicatorOptions {
  ReductionOrder order = ReductionOrder::Deterministic;
  bool mpi_on_cuda = false;  // the cuda device talks over staged MPI instead of NCCL (Note [Staged MPI] in comm/comm_staged.cc)
};

// The world communicator for this process: `local` when not started by mpirun (no MPI
// initialisation at all), else `mpi` for the sim device, and `nccl` for the cuda device (or with
// mpi_on_cuda, `mpi-staged`); the MPI backends in issue order (Note [Issue order]).
// Throws DeviceError if the cuda device is asked for in a build without NCCL.
std::unique_ptr<Communicator> make_world_communicator(Device& device, const CommunicatorOptions& options);

// True when this process was started by an MPI launcher (OMPI_COMM_WORLD_SIZE or PMI_SIZE set).
bool launched_by_mpi();

// `inner` (a host-memory communicator: mpi) for buffers in `device`'s memory: every stream-ordered
// call copies through pinned host staging on its stream (Note [Staged MPI] in comm/comm_staged.cc); host-side calls
// pass through. `device` must outlive it.
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> inner, Device& device);

// `inner` with its stream-ordered calls run one at a time in issue order (Note [Issue order]):
// each waits, on its stream, for the previous call's completion event. For the MPI backends;
// `device` makes the events and must outlive it. split() orders the new communicator too.
std::unique_ptr<Communicator> make_ordered_communicator(std::unique_ptr<Communicator> inner, Device& device);

// The single-rank communicator (no MPI).
std::unique_ptr<Communicator> make_local_communicator();

// Sums `world` arrays of `count` elements each (contributions[r] is rank r's) into `out` in the
// fixed pairwise-tree order of Note [Deterministic reduction]. fp32 accumulation; bf16/fp16
// inputs are converted, summed in fp32 and rounded once. `out` may alias contributions[0].
void tree_reduce_host(const void* const* contributions, int world, void* out, std::size_t count_elems, DType dtype,
                      ReduceOp op);

// Calls and payload bytes (count x element size, what one rank passes in) of the collectives issued
// through a communicator, counted when they are enqueued.
struct CollectiveCounts {
  std::uint64_t all_reduce_calls = 0, all_reduce_bytes = 0;
  std::uint64_t all_gather_calls = 0, all_gather_bytes = 0;
  std::uint64_t reduce_scatter_calls = 0, reduce_scatter_bytes = 0;
  std::uint64_t broadcast_calls = 0, broadcast_bytes = 0;
  std::uint64_t send_calls = 0, send_bytes = 0, recv_calls = 0, recv_bytes = 0;
};
// `inner` with every collective counted into `counts` (what `strata train` reports for the tensor
// group beside the analytic count). Host-side calls and split() pass through uncounted.
std::unique_ptr<Communicator> make_counting_communicator(std::unique_ptr<Communicator> inner,
                                                         std::shared_ptr<CollectiveCounts> counts);

// Collective: every rank learns whether any rank failed (one host all-reduce). A rank holding
// `error` rethrows it; the others return true when another rank failed (the caller throws what
// suits it, saying the other rank's message says why) and false when none did.
bool another_rank_failed(Communicator& world, const std::exception_ptr& error);

}  // namespace strata
