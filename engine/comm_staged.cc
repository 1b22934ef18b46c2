// The staged communicator (engine/communicator.h, Note [Staged MPI]): a host-memory communicator
// (mpi) made usable with a device whose memory the host cannot read, by copying through pinned
// host staging in stream order.
//
// Note [Staged MPI]: NCCL puts one rank of a communicator on one GPU, so on a machine with one GPU
// the multi-rank paths of the engine (ZeRO's gathers and reductions across ranks, every data x
// tensor x pipeline split) could not run on cuda at all. With `strata.parallel.communicator` =
// "mpi" on cuda, the ranks may share a GPU and talk over MPI in host memory: each stream-ordered
// call copies its device input into a pinned host buffer on the caller's stream, enqueues the MPI
// communicator's call on the same stream (its host function runs after the copy, in stream order,
// and MPI's results are host memory), and copies the result back up, still on that stream. Nothing
// blocks the caller, and the ordered wrapper around it (make_world_communicator) keeps NCCL's issue
// order (Note [Issue order]), so the ordering rules of the NCCL backend hold unchanged. The exact mode's tree
// order is the MPI communicator's, so the bits are those of the sim device's MPI runs. It is a way
// to check the multi-rank paths on one GPU, not a fast transport: every collective crosses PCIe
// twice and runs on the host. Staging buffers come from a pool kept by size (powers of two from 4
// KiB): a buffer goes back to the pool from a host function on the stream once the copy out of it
// has run, so a buffer is never reused while a stream still reads it.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/host_buffer.h"
#include "engine/communicator.h"

namespace strata {
namespace {

// Pinned host buffers by size class, shared with the host functions that give them back.
class StagingPool {
 public:
  explicit StagingPool(Device& device) : device_(device) {}

  std::shared_ptr<HostBuffer> take(std::size_t bytes) {
    const std::size_t size = std::bit_ceil(std::max<std::size_t>(bytes, 4096));
    {
      std::lock_guard lock(mutex_);
      std::vector<std::shared_ptr<HostBuffer>>& free = free_[size];
      if (!free.empty()) {
        std::shared_ptr<HostBuffer> b = std::move(free.back());
        free.pop_back();
        return b;
      }
    }
    HostBufferOptions o;
    o.pinner = &device_;
    return std::make_shared<HostBuffer>(HostBuffer::allocate(size, o));
  }

  void give_back(std::shared_ptr<HostBuffer> b) {
    std::lock_guard lock(mutex_);
    free_[b->size_bytes()].push_back(std::move(b));
  }

 private:
  Device& device_;
  std::mutex mutex_;
  std::map<std::size_t, std::vector<std::shared_ptr<HostBuffer>>> free_;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> inner, Device& device, std::shared_ptr<StagingPool> pool)
      : inner_(std::move(inner)), device_(device), pool_(std::move(pool)) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend() + "-staged"; }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, Stream& stream) override {
    const std::size_t bytes = count * dtype_bytes(dtype);
    auto in = pool_->take(bytes), out = pool_->take(bytes * world());
    stream.copy_d2h(in->data(), send, bytes);
    inner_->all_gather(in->data(), out->data(), count, dtype, stream);
    stream.copy_h2d(recv, out->data(), bytes * world());
    give_back_after(stream, {std::move(in), std::move(out)});
  }

  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                      Stream& stream) override {
    const std::size_t bytes = count * dtype_bytes(dtype);
    auto in = pool_->take(bytes * world()), out = pool_->take(bytes);
    stream.copy_d2h(in->data(), send, bytes * world());
    inner_->reduce_scatter(in->data(), out->data(), count, dtype, op, stream);
    stream.copy_h2d(recv, out->data(), bytes);
    give_back_after(stream, {std::move(in), std::move(out)});
  }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    const std::size_t bytes = count * dtype_bytes(dtype);
    auto buf = pool_->take(bytes);
    stream.copy_d2h(buf->data(), send, bytes);
    inner_->all_reduce(buf->data(), buf->data(), count, dtype, op, stream);
    stream.copy_h2d(recv, buf->data(), bytes);
    give_back_after(stream, {std::move(buf)});
  }

  void broadcast(void* buffer, std::size_t count, DType dtype, int root, Stream& stream) override {
    const std::size_t bytes = count * dtype_bytes(dtype);
    auto buf = pool_->take(bytes);
    if (rank() == root) stream.copy_d2h(buf->data(), buffer, bytes);
    inner_->broadcast(buf->data(), count, dtype, root, stream);
    if (rank() != root) stream.copy_h2d(buffer, buf->data(), bytes);
    give_back_after(stream, {std::move(buf)});
  }

  // Every send staged down, one exchange of host buffers, every receive copied up.
  void exchange(std::span<const PeerOp> ops, Stream& stream) override {
    std::vector<PeerOp> host(ops.begin(), ops.end());
    std::vector<std::shared_ptr<HostBuffer>> buffers;
    for (PeerOp& op : host) {
      auto& buf = buffers.emplace_back(pool_->take(op.bytes()));
      if (op.sends()) stream.copy_d2h(buf->data(), op.buffer, op.bytes());
      op.buffer = buf->data();
    }
    inner_->exchange(host, stream);
    for (std::size_t i = 0; i < host.size(); ++i) {
      if (!host[i].sends()) stream.copy_h2d(ops[i].buffer, host[i].buffer, host[i].bytes());
    }
    give_back_after(stream, std::move(buffers));
  }

  void barrier() override { inner_->barrier(); }
  double all_reduce_host(double value, ReduceOp op) override { return inner_->all_reduce_host(value, op); }
  void broadcast_host_bytes(void* data, std::size_t bytes, int root) override {
    inner_->broadcast_host_bytes(data, bytes, root);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return std::make_unique<StagedCommunicator>(inner_->split(color, key), device_, pool_);
  }

 private:
  std::size_t world() const { return static_cast<std::size_t>(world_size()); }

  // The buffers return to the pool once the stream has run everything queued so far (the copies
  // out of them included).
  void give_back_after(Stream& stream, std::vector<std::shared_ptr<HostBuffer>> buffers) {
    stream.launch_host([pool = pool_, buffers = std::move(buffers)]() mutable {
      for (auto& b : buffers) pool->give_back(std::move(b));
    });
  }

  std::unique_ptr<Communicator> inner_;
  Device& device_;
  std::shared_ptr<StagingPool> pool_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> inner, Device& device) {
  STRATA_CHECK(inner != nullptr, "a staged communicator needs the communicator it stages for");
  return std::make_unique<StagedCommunicator>(std::move(inner), device, std::make_shared<StagingPool>(device));
}

}  // namespace strata
