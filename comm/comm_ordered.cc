// The ordered communicator (comm/communicator.h, Note [Issue order] in comm/communicator.h): the MPI backends' calls
// run one at a time in the order the host issued them, as NCCL's do.
//
// Each stream-ordered call makes its stream wait for the event recorded after the previous call
// (on whichever stream that was), enqueues the inner call, and records the event again after it.
// A wait takes the event's latest record at the time it is enqueued, so re-recording one event is
// enough. Host-side calls are not stream work and pass through.
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>

#include "core/error.h"
#include "comm/communicator.h"

namespace strata {
namespace {

class OrderedCommunicator final : public Communicator {
 public:
  OrderedCommunicator(std::unique_ptr<Communicator> inner, Device& device)
      : inner_(std::move(inner)), device_(device), done_(device.create_event()) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend(); }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, Stream& stream) override {
    in_order(stream, [&] { inner_->all_gather(send, recv, count, dtype, stream); });
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                      Stream& stream) override {
    in_order(stream, [&] { inner_->reduce_scatter(send, recv, count, dtype, op, stream); });
  }
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    in_order(stream, [&] { inner_->all_reduce(send, recv, count, dtype, op, stream); });
  }
  void broadcast(void* buffer, std::size_t count, DType dtype, int root, Stream& stream) override {
    in_order(stream, [&] { inner_->broadcast(buffer, count, dtype, root, stream); });
  }
  void exchange(std::span<const PeerOp> ops, Stream& stream) override {
    in_order(stream, [&] { inner_->exchange(ops, stream); });
  }

  void barrier() override { inner_->barrier(); }
  double all_reduce_host(double value, ReduceOp op) override { return inner_->all_reduce_host(value, op); }
  void broadcast_host_bytes(void* data, std::size_t bytes, int root) override {
    inner_->broadcast_host_bytes(data, bytes, root);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return std::make_unique<OrderedCommunicator>(inner_->split(color, key), device_);
  }
  // Host-side calls run in the order their thread makes them: nothing to order.
  HostCollectives* host_collectives() override { return inner_->host_collectives(); }

 private:
  template <class Call>
  void in_order(Stream& stream, Call&& call) {
    std::lock_guard lock(mutex_);  // the issue order is the order the calls take the lock
    if (issued_) stream.wait(*done_);
    call();
    stream.record(*done_);
    issued_ = true;
  }

  std::unique_ptr<Communicator> inner_;
  Device& device_;
  std::mutex mutex_;
  std::unique_ptr<Event> done_;  // recorded after the latest call
  bool issued_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_ordered_communicator(std::unique_ptr<Communicator> inner, Device& device) {
  STRATA_CHECK(inner != nullptr, "an ordered communicator needs the communicator it orders");
  return std::make_unique<OrderedCommunicator>(std::move(inner), device);
}

}  // namespace strata
