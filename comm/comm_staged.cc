// The staged communicator (comm/communicator.h, Note [Staged MPI]): a host-memory communicator
// (mpi) made usable with a device whose memory the host cannot read, by copying through pinned
// host staging in stream order.
//
// Note [Staged MPI]: NCCL puts one rank of a communicator on one GPU, so on a machine with one GPU
// the multi-rank paths of the engine (ZeRO's gathers and reductions across ranks, every data x
// tensor x pipeline split) could not run on cuda at all. With `strata.parallel.communicator` =
// "mpi" on cuda, the ranks may share a GPU and talk over MPI in host memory. The host drives each
// call (Note [Host-driven offload] in docs/DESIGN.md): it copies the device input into a pinned
// host buffer on the caller's stream, waits on an event recorded after that copy, runs the MPI
// collective on the calling thread (comm/comm_host.h), and enqueues the copy of the result back
// up on the same stream; later work on the stream follows that copy in stream order, and no stream
// ever waits for a host thread. The caller is blocked for the collective, so a staged call costs
// its host the time of the collective, and of the stream's earlier work: it is a way to check the
// multi-rank paths on one GPU, not a fast transport (every collective crosses PCIe twice and runs
// on the host). The ordered wrapper around it (make_world_communicator) keeps NCCL's issue order
// (Note [Issue order] in comm/communicator.h); as every rank issues its calls in program order, blocking the caller
// adds no cycle between ranks that the issue order does not already have. The exact mode's tree order is
// the MPI communicator's, so the bits are those of the sim device's MPI runs. Staging buffers come
// from a pool kept by size (powers of two from 4 KiB); a buffer goes back with the event recorded
// after the last copy that reads it and is reused only once that event has completed (the host
// waits for it, never a stream), as PyTorch's CachingHostAllocator does.
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
#include "comm/comm_host.h"
#include "comm/communicator.h"

namespace strata {
namespace {

// Pinned host buffers by size class, each returned with the event after which no stream reads it.
class StagingPool {
 public:
  explicit StagingPool(Device& device) : device_(device) {}

  std::shared_ptr<HostBuffer> take(std::size_t bytes) {
    const std::size_t size = std::bit_ceil(std::max<std::size_t>(bytes, 4096));
    Returned reuse;
    {
      std::lock_guard lock(mutex_);
      std::vector<Returned>& free = free_[size];
      if (!free.empty()) {
        reuse = std::move(free.front());
        free.erase(free.begin());
      }
    }
    if (reuse.buffer) {
      if (reuse.after) reuse.after->synchronize();  // the host waits for the last copy out of it
      return std::move(reuse.buffer);
    }
    HostBufferOptions o;
    o.pinner = &device_;
    return std::make_shared<HostBuffer>(HostBuffer::allocate(size, o));
  }

  void give_back(std::vector<std::shared_ptr<HostBuffer>> buffers, const std::shared_ptr<Event>& after) {
    std::lock_guard lock(mutex_);
    for (auto& b : buffers) free_[b->size_bytes()].push_back(Returned{std::move(b), after});
  }

 private:
  struct Returned {
    std::shared_ptr<HostBuffer> buffer;
    std::shared_ptr<Event> after;  // null: no stream reads it
  };
  Device& device_;
  std::mutex mutex_;
  std::map<std::size_t, std::vector<Returned>> free_;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> inner, Device& device, std::shared_ptr<StagingPool> pool)
      : inner_(std::move(inner)), host_(inner_->host_collectives()), device_(device),
        pool_(std::move(pool)) {
    STRATA_CHECK(host_ != nullptr, "the staged communicator needs a host-memory communicator (mpi), got {}",
                 inner_->backend());
  }

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend() + "-staged"; }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, Stream& stream) override {
    const std::size_t bytes = count * dtype_bytes(dtype);
    auto in = pool_->take(bytes), out = pool_->take(bytes * world());
    stream.copy_d2h(in->data(), send, bytes);
    wait_for(stream);
    host_->all_gather_now(in->data(), out->data(), count, dtype);
    stream.copy_h2d(recv, out->data(), bytes * world());
    give_back_after(stream, {std::move(in), std::move(out)});
  }

  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                      Stream& stream) override {
    const std::size_t bytes = count * dtype_bytes(dtype);
    auto in = pool_->take(bytes * world()), out = pool_->take(bytes);
    stream.copy_d2h(in->data(), send, bytes * world());
    wait_for(stream);
    host_->reduce_scatter_now(in->data(), out->data(), count, dtype, op);
    stream.copy_h2d(recv, out->data(), bytes);
    give_back_after(stream, {std::move(in), std::move(out)});
  }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    const std::size_t bytes = count * dtype_bytes(dtype);
    auto buf = pool_->take(bytes);
    stream.copy_d2h(buf->data(), send, bytes);
    wait_for(stream);
    host_->all_reduce_now(buf->data(), buf->data(), count, dtype, op);
    stream.copy_h2d(recv, buf->data(), bytes);
    give_back_after(stream, {std::move(buf)});
  }

  void broadcast(void* buffer, std::size_t count, DType dtype, int root, Stream& stream) override {
    const std::size_t bytes = count * dtype_bytes(dtype);
    auto buf = pool_->take(bytes);
    if (rank() == root) stream.copy_d2h(buf->data(), buffer, bytes);
    wait_for(stream);
    host_->broadcast_now(buf->data(), count, dtype, root);
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
    wait_for(stream);
    host_->exchange_now(host);
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

  // The host waits for everything queued on `stream` so far (the copies down included).
  void wait_for(Stream& stream) {
    std::unique_ptr<Event> down = device_.create_event();
    stream.record(*down);
    down->synchronize();
  }

  // The buffers return to the pool with an event recorded after the copies out of them.
  void give_back_after(Stream& stream, std::vector<std::shared_ptr<HostBuffer>> buffers) {
    std::shared_ptr<Event> after = device_.create_event();
    stream.record(*after);
    pool_->give_back(std::move(buffers), after);
  }

  std::unique_ptr<Communicator> inner_;
  HostCollectives* host_;  // inner_'s host-side calls
  Device& device_;
  std::shared_ptr<StagingPool> pool_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> inner, Device& device) {
  STRATA_CHECK(inner != nullptr, "a staged communicator needs the communicator it stages for");
  return std::make_unique<StagedCommunicator>(std::move(inner), device, std::make_shared<StagingPool>(device));
}

}  // namespace strata
