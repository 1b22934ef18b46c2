// The MPI communicator: collectives over host memory for the sim device (whose device memory is
// host memory), each enqueued as a sim kernel (core/device/sim_kernel.h) that runs the MPI calls in
// stream order, as an NCCL kernel runs on a GPU (see comm/communicator.h). The same collectives
// run on the calling thread for the staged communicator (comm/comm_host.h).
//
// MPI is initialised once per process with MPI_THREAD_MULTIPLE (stream workers and the host
// thread both call MPI) and finalised at exit. Each communicator owns two duplicated MPI
// communicators: one for stream-ordered collectives, one for host-side calls (barrier, scalar
// reductions), so the two never interleave on one MPI communicator.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "core/device/sim_kernel.h"
#include "core/error.h"
#include "comm/comm_host.h"
#include "comm/communicator.h"

namespace strata {
namespace {

void mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) [[unlikely]] {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw InternalError(fmt::format("{} failed: MPI error {}: {}", what, rc, std::string(text, static_cast<std::size_t>(len))));
  }
}
#define STRATA_MPI_CHECK(call) mpi_check((call), #call)

// Process-wide MPI lifetime: MPI can be initialised once per process and must be finalised once.
class MpiRuntime {
 public:
  static void ensure_initialized() {
    static MpiRuntime runtime;
    (void)runtime;
  }

 private:
  MpiRuntime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized != 0) return;
    int provided = 0;
    STRATA_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    owns_ = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      throw DeviceError(fmt::format("this MPI library provides thread level {} but Strata needs MPI_THREAD_MULTIPLE ({}); "
                                    "use an MPI built with thread support (Debian's OpenMPI has it)",
                                    provided, MPI_THREAD_MULTIPLE));
    }
  }
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && finalized == 0) MPI_Finalize();
  }
  bool owns_ = false;
};

MPI_Datatype mpi_type(DType dtype) { return dtype == DType::F32 ? MPI_FLOAT : MPI_UINT16_T; }

// Largest number of elements moved per MPI call, so int counts never overflow and temporary
// buffers stay bounded (16 Mi elements: 64 MiB of fp32 per rank chunk).
constexpr std::size_t kPieceElems = std::size_t{16} << 20;

class MpiCommunicator final : public Communicator, public HostCollectives {
 public:
  MpiCommunicator(MPI_Comm parent, ReductionOrder order) : order_(order) {
    STRATA_MPI_CHECK(MPI_Comm_dup(parent, &stream_comm_));
    STRATA_MPI_CHECK(MPI_Comm_dup(parent, &host_comm_));
    STRATA_MPI_CHECK(MPI_Comm_rank(stream_comm_, &rank_));
    STRATA_MPI_CHECK(MPI_Comm_size(stream_comm_, &world_));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) {
      MPI_Comm_free(&stream_comm_);
      MPI_Comm_free(&host_comm_);
    }
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "mpi"; }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, Stream& stream) override {
    launch_sim_kernel(stream, [this, send, recv, count, dtype] { all_gather_now(send, recv, count, dtype); });
  }

  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                      Stream& stream) override {
    launch_sim_kernel(stream,
                      [this, send, recv, count, dtype, op] { reduce_scatter_now(send, recv, count, dtype, op); });
  }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    launch_sim_kernel(stream, [this, send, recv, count, dtype, op] { all_reduce_now(send, recv, count, dtype, op); });
  }

  void broadcast(void* buffer, std::size_t count, DType dtype, int root, Stream& stream) override {
    STRATA_CHECK(root >= 0 && root < world_, "broadcast root {} outside 0..{}", root, world_ - 1);
    launch_sim_kernel(stream, [this, buffer, count, dtype, root] { broadcast_now(buffer, count, dtype, root); });
  }

  void exchange(std::span<const PeerOp> ops, Stream& stream) override {
    for (const PeerOp& op : ops) check_peer(op.peer);
    launch_sim_kernel(stream, [this, ops = std::vector<PeerOp>(ops.begin(), ops.end())] { exchange_now(ops); });
  }

  // ---- HostCollectives: the calls themselves, on the calling thread

  void broadcast_now(void* buffer, std::size_t count, DType dtype, int root) override {
    STRATA_CHECK(root >= 0 && root < world_, "broadcast root {} outside 0..{}", root, world_ - 1);
    auto* bytes = static_cast<char*>(buffer);
    for (std::size_t off = 0; off < count; off += kPieceElems) {
      const std::size_t n = std::min(kPieceElems, count - off);
      STRATA_MPI_CHECK(
          MPI_Bcast(bytes + off * dtype_bytes(dtype), static_cast<int>(n), mpi_type(dtype), root, stream_comm_));
    }
  }

  // Nonblocking calls, one per piece, then one wait: the transfers progress independently (Note
  // [Issue order]); MPI matches each pair's messages in the order they were posted.
  void exchange_now(std::span<const PeerOp> ops) override {
    for (const PeerOp& op : ops) check_peer(op.peer);
    std::vector<MPI_Request> requests;
    for (const PeerOp& op : ops) {
      auto* bytes = static_cast<char*>(op.buffer);
      for (std::size_t off = 0; off < op.count_elems; off += kPieceElems) {
        const auto n = static_cast<int>(std::min(kPieceElems, op.count_elems - off));
        char* piece = bytes + off * dtype_bytes(op.dtype);
        MPI_Request& r = requests.emplace_back();
        if (op.sends()) {
          STRATA_MPI_CHECK(MPI_Isend(piece, n, mpi_type(op.dtype), op.peer, kPointToPointTag, stream_comm_, &r));
        } else {
          STRATA_MPI_CHECK(MPI_Irecv(piece, n, mpi_type(op.dtype), op.peer, kPointToPointTag, stream_comm_, &r));
        }
      }
    }
    STRATA_MPI_CHECK(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
  }

  void barrier() override { STRATA_MPI_CHECK(MPI_Barrier(host_comm_)); }

  double all_reduce_host(double value, ReduceOp op) override {
    // Gather every rank's value and combine in rank order: identical on all ranks.
    std::vector<double> all(static_cast<std::size_t>(world_));
    STRATA_MPI_CHECK(MPI_Allgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, host_comm_));
    double acc = all[0];
    for (int r = 1; r < world_; ++r) {
      const double v = all[static_cast<std::size_t>(r)];
      if (op == ReduceOp::Sum) {
        acc += v;
      } else if (v != v || acc != acc) {
        acc = v != v ? v : acc;
      } else {
        acc = std::max(acc, v);
      }
    }
    return acc;
  }

  void broadcast_host_bytes(void* data, std::size_t bytes, int root) override {
    // In pieces of 1 GiB: MPI counts are ints (a whole tensor gathered for --save-weights can be larger).
    constexpr std::size_t kPieceBytes = std::size_t{1} << 30;
    auto* p = static_cast<char*>(data);
    std::size_t off = 0;
    do {
      const std::size_t n = std::min(kPieceBytes, bytes - off);
      STRATA_MPI_CHECK(MPI_Bcast(p + off, static_cast<int>(n), MPI_BYTE, root, host_comm_));
      off += n;
    } while (off < bytes);
  }

  HostCollectives* host_collectives() override { return this; }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    STRATA_MPI_CHECK(MPI_Comm_split(host_comm_, color, key, &sub));
    auto result = std::make_unique<MpiCommunicator>(sub, order_);
    MPI_Comm_free(&sub);
    return result;
  }

  void all_gather_now(const void* send, void* recv, std::size_t count, DType dtype) override {
    const std::size_t esize = dtype_bytes(dtype);
    if (count <= kPieceElems) {
      // In place when this rank's block already sits in its slot of `recv` (MPI forbids aliasing).
      const bool in_place = send == static_cast<const char*>(recv) + static_cast<std::size_t>(rank_) * count * esize;
      STRATA_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(count), mpi_type(dtype), recv,
                                     static_cast<int>(count), mpi_type(dtype), stream_comm_));
      return;
    }
    std::vector<char> tmp(kPieceElems * esize * static_cast<std::size_t>(world_));
    for (std::size_t off = 0; off < count; off += kPieceElems) {
      const std::size_t n = std::min(kPieceElems, count - off);
      STRATA_MPI_CHECK(MPI_Allgather(static_cast<const char*>(send) + off * esize, static_cast<int>(n), mpi_type(dtype),
                                     tmp.data(), static_cast<int>(n), mpi_type(dtype), stream_comm_));
      for (int r = 0; r < world_; ++r) {
        std::memcpy(static_cast<char*>(recv) + (static_cast<std::size_t>(r) * count + off) * esize,
                    tmp.data() + static_cast<std::size_t>(r) * n * esize, n * esize);
      }
    }
  }

  void reduce_scatter_now(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    const std::size_t esize = dtype_bytes(dtype);
    const auto world = static_cast<std::size_t>(world_);
    if (order_ == ReductionOrder::Fast && dtype == DType::F32 && count <= kPieceElems) {
      STRATA_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), MPI_FLOAT,
                                                op == ReduceOp::Sum ? MPI_SUM : MPI_MAX, stream_comm_));
      return;
    }
    // Exchange: rank r receives every rank's copy of chunk r, then sums them on the fixed tree.
    std::vector<char> sendbuf(std::min(kPieceElems, count) * esize * world);
    std::vector<char> gathered(sendbuf.size());
    std::vector<const void*> parts(world);
    for (std::size_t off = 0; off < count; off += kPieceElems) {
      const std::size_t n = std::min(kPieceElems, count - off);
      for (std::size_t r = 0; r < world; ++r) {
        std::memcpy(sendbuf.data() + r * n * esize, static_cast<const char*>(send) + (r * count + off) * esize,
                    n * esize);
      }
      STRATA_MPI_CHECK(MPI_Alltoall(sendbuf.data(), static_cast<int>(n), mpi_type(dtype), gathered.data(),
                                    static_cast<int>(n), mpi_type(dtype), stream_comm_));
      for (std::size_t r = 0; r < world; ++r) parts[r] = gathered.data() + r * n * esize;
      tree_reduce_host(parts.data(), world_, static_cast<char*>(recv) + off * esize, n, dtype, op);
    }
  }

  void all_reduce_now(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    const std::size_t esize = dtype_bytes(dtype);
    const auto world = static_cast<std::size_t>(world_);
    if (order_ == ReductionOrder::Fast && dtype == DType::F32 && count <= kPieceElems) {
      STRATA_MPI_CHECK(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count), MPI_FLOAT,
                                     op == ReduceOp::Sum ? MPI_SUM : MPI_MAX, stream_comm_));
      return;
    }
    // reduce_scatter then all_gather, over a padded copy so every rank owns an equal chunk.
    const std::size_t chunk = (count + world - 1) / world;
    std::vector<char> padded(chunk * world * esize, 0);
    std::memcpy(padded.data(), send, count * esize);
    std::vector<char> mine(chunk * esize);
    reduce_scatter_now(padded.data(), mine.data(), chunk, dtype, op);
    all_gather_now(mine.data(), padded.data(), chunk, dtype);
    std::memcpy(recv, padded.data(), count * esize);
  }

 private:
  void check_peer(int peer) const {
    STRATA_CHECK(peer >= 0 && peer < world_ && peer != rank_, "point-to-point peer {} of rank {} in a world of {}",
                 peer, rank_, world_);
  }
  static constexpr int kPointToPointTag = 17;

  ReductionOrder order_;
  MPI_Comm stream_comm_ = MPI_COMM_NULL;
  MPI_Comm host_comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int world_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world_communicator(const CommunicatorOptions& options) {
  MpiRuntime::ensure_initialized();
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, options.order);
}

}  // namespace strata
