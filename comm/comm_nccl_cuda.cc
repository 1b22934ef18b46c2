// The NCCL communicator for the cuda device (see comm/communicator.h). The ncclUniqueId is made
// on rank 0 and broadcast over MPI; each collective is enqueued on the Stream's cudaStream_t.
// In deterministic order, reduce_scatter is an exchange (grouped ncclSend/ncclRecv) followed by
// the tree-reduction kernel, so the sum is taken in the same order as on the sim device.
// Run at world 1 on an H200 (tests/tools/train_cuda_test.sh under mpirun -np 1); not at world > 1,
// for want of a machine with two GPUs (README, "How the CUDA path is verified").
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <span>

#include <fmt/format.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "comm/comm_tree_reduce.h"
#include "comm/communicator.h"

namespace strata {

std::unique_ptr<Communicator> make_mpi_world_communicator(const CommunicatorOptions& options);  // comm_mpi.cc

namespace {

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }

cudaStream_t native(Stream& s) { return static_cast<cudaStream_t>(s.native_handle()); }

class NcclCommunicator final : public Communicator {
 public:
  // `host` carries the bootstrap and the host-side calls (barrier, scalar reductions).
  NcclCommunicator(Device& device, std::unique_ptr<Communicator> host, ReductionOrder order)
      : device_(device), host_(std::move(host)), order_(order) {
    ncclUniqueId id;
    if (host_->rank() == 0) STRATA_NCCL_CHECK(ncclGetUniqueId(&id));
    host_->broadcast_host_bytes(&id, sizeof(id), 0);
    STRATA_NCCL_CHECK(ncclCommInitRank(&comm_, host_->world_size(), id, host_->rank()));
  }
  ~NcclCommunicator() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  std::string backend() const override { return "nccl"; }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, Stream& stream) override {
    STRATA_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, native(stream)));
  }

  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    if (order_ == ReductionOrder::Fast) {
      STRATA_NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, native(stream)));
      return;
    }
    const std::size_t esize = dtype_bytes(dtype);
    const int world = world_size();
    DeviceMemory gathered = device_.allocate(std::max<std::size_t>(1, count * esize * static_cast<std::size_t>(world)),
                                             "comm.exchange");
    STRATA_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < world; ++r) {
      const auto offset = static_cast<std::size_t>(r) * count * esize;
      STRATA_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + offset, count, nccl_type(dtype), r, comm_, native(stream)));
      STRATA_NCCL_CHECK(ncclRecv(gathered.as<char>() + offset, count, nccl_type(dtype), r, comm_, native(stream)));
    }
    STRATA_NCCL_CHECK(ncclGroupEnd());
    launch_tree_reduce(gathered.data(), world, recv, count, dtype, op == ReduceOp::Sum ? 0 : 1, native(stream));
    stream.release_after(std::move(gathered));
  }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    if (order_ == ReductionOrder::Fast) {
      STRATA_NCCL_CHECK(ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, native(stream)));
      return;
    }
    const auto world = static_cast<std::size_t>(world_size());
    const std::size_t esize = dtype_bytes(dtype);
    const std::size_t chunk = (count + world - 1) / world;
    DeviceMemory padded = device_.allocate(std::max<std::size_t>(1, chunk * world * esize), "comm.allreduce");
    DeviceMemory mine = device_.allocate(std::max<std::size_t>(1, chunk * esize), "comm.allreduce");
    stream.memset(padded.data(), 0, chunk * world * esize);
    stream.copy_d2d(padded.data(), send, count * esize);
    reduce_scatter(padded.data(), mine.data(), chunk, dtype, op, stream);
    all_gather(mine.data(), padded.data(), chunk, dtype, stream);
    stream.copy_d2d(recv, padded.data(), count * esize);
    stream.release_after(std::move(padded));
    stream.release_after(std::move(mine));
  }

  void broadcast(void* buffer, std::size_t count, DType dtype, int root, Stream& stream) override {
    STRATA_NCCL_CHECK(ncclBroadcast(buffer, buffer, count, nccl_type(dtype), root, comm_, native(stream)));
  }

  // One NCCL group (Note [Issue order] in comm/communicator.h); the group is closed even when a call in it fails.
  void exchange(std::span<const PeerOp> ops, Stream& stream) override {
    const cudaStream_t s = native(stream);
    STRATA_NCCL_CHECK(ncclGroupStart());
    ncclResult_t first_error = ncclSuccess;
    const char* failed = nullptr;
    for (const PeerOp& op : ops) {
      const ncclResult_t rc = op.sends()
                                  ? ncclSend(op.buffer, op.count_elems, nccl_type(op.dtype), op.peer, comm_, s)
                                  : ncclRecv(op.buffer, op.count_elems, nccl_type(op.dtype), op.peer, comm_, s);
      if (rc != ncclSuccess && first_error == ncclSuccess) {
        first_error = rc;
        failed = op.sends() ? "ncclSend" : "ncclRecv";
      }
    }
    const ncclResult_t end = ncclGroupEnd();
    if (failed != nullptr) detail::nccl_check(first_error, __FILE__, __LINE__, failed);
    STRATA_NCCL_CHECK(end);
  }

  void barrier() override { host_->barrier(); }
  double all_reduce_host(double value, ReduceOp op) override { return host_->all_reduce_host(value, op); }
  void broadcast_host_bytes(void* data, std::size_t bytes, int root) override {
    host_->broadcast_host_bytes(data, bytes, root);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    return std::make_unique<NcclCommunicator>(device_, host_->split(color, key), order_);
  }

 private:
  Device& device_;
  std::unique_ptr<Communicator> host_;
  ReductionOrder order_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_world_communicator(Device& device, const CommunicatorOptions& options) {
  return std::make_unique<NcclCommunicator>(device, make_mpi_world_communicator(options), options.order);
}

}  // namespace strata
