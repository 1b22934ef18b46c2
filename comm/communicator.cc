// The local (single-rank) communicator, the deterministic tree reduction shared by all backends,
// and the choice of backend for the world communicator (see comm/communicator.h).
#include "comm/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "core/dtype_bulk.h"
#include "core/error.h"
#include "comm/reduce_math.h"

namespace strata {

std::unique_ptr<Communicator> make_mpi_world_communicator(const CommunicatorOptions& options);  // comm_mpi.cc
std::unique_ptr<Communicator> make_nccl_world_communicator(Device& device, const CommunicatorOptions& options);

namespace {

float combine(float a, float b, ReduceOp op) { return combine_partials(a, b, op == ReduceOp::Sum ? 0 : 1); }

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "local"; }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, Stream& stream) override {
    copy(send, recv, count * dtype_bytes(dtype), stream);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp, Stream& stream) override {
    copy(send, recv, count * dtype_bytes(dtype), stream);
  }
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp, Stream& stream) override {
    copy(send, recv, count * dtype_bytes(dtype), stream);
  }
  void broadcast(void*, std::size_t, DType, int root, Stream&) override {
    STRATA_CHECK(root == 0, "broadcast root {} on a single-rank communicator", root);
  }
  void exchange(std::span<const PeerOp> ops, Stream&) override {
    STRATA_CHECK(ops.empty(), "{} with rank {} on a single-rank communicator", ops[0].sends() ? "send" : "receive",
                 ops[0].peer);
  }
  void barrier() override {}
  double all_reduce_host(double value, ReduceOp) override { return value; }
  void broadcast_host_bytes(void*, std::size_t, int root) override {
    STRATA_CHECK(root == 0, "broadcast root {} on a single-rank communicator", root);
  }
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<LocalCommunicator>(); }

 private:
  static void copy(const void* src, void* dst, std::size_t bytes, Stream& stream) {
    if (src != dst && bytes > 0) stream.copy_d2d(dst, src, bytes);
  }
};

class CountingCommunicator final : public Communicator {
 public:
  CountingCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<CollectiveCounts> counts)
      : inner_(std::move(inner)), counts_(std::move(counts)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend(); }
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, Stream& stream) override {
    add(counts_->all_gather_calls, counts_->all_gather_bytes, count, dtype);
    inner_->all_gather(send, recv, count, dtype, stream);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                      Stream& stream) override {
    add(counts_->reduce_scatter_calls, counts_->reduce_scatter_bytes, count * static_cast<std::size_t>(world_size()),
        dtype);
    inner_->reduce_scatter(send, recv, count, dtype, op, stream);
  }
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    add(counts_->all_reduce_calls, counts_->all_reduce_bytes, count, dtype);
    inner_->all_reduce(send, recv, count, dtype, op, stream);
  }
  void broadcast(void* buffer, std::size_t count, DType dtype, int root, Stream& stream) override {
    add(counts_->broadcast_calls, counts_->broadcast_bytes, count, dtype);
    inner_->broadcast(buffer, count, dtype, root, stream);
  }
  void exchange(std::span<const PeerOp> ops, Stream& stream) override {
    for (const PeerOp& op : ops) {
      if (op.sends()) {
        add(counts_->send_calls, counts_->send_bytes, op.count_elems, op.dtype);
      } else {
        add(counts_->recv_calls, counts_->recv_bytes, op.count_elems, op.dtype);
      }
    }
    inner_->exchange(ops, stream);
  }
  void barrier() override { inner_->barrier(); }
  double all_reduce_host(double value, ReduceOp op) override { return inner_->all_reduce_host(value, op); }
  void broadcast_host_bytes(void* data, std::size_t bytes, int root) override {
    inner_->broadcast_host_bytes(data, bytes, root);
  }
  std::unique_ptr<Communicator> split(int color, int key) override { return inner_->split(color, key); }

 private:
  static void add(std::uint64_t& calls, std::uint64_t& bytes, std::size_t count, DType dtype) {
    ++calls;
    bytes += static_cast<std::uint64_t>(count) * dtype_bytes(dtype);
  }
  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<CollectiveCounts> counts_;
};

}  // namespace

void Communicator::send(const void* buffer, std::size_t count_elems, DType dtype, int peer, Stream& stream) {
  const PeerOp op = PeerOp::send(buffer, count_elems, dtype, peer);
  exchange({&op, 1}, stream);
}

void Communicator::recv(void* buffer, std::size_t count_elems, DType dtype, int peer, Stream& stream) {
  const PeerOp op = PeerOp::recv(buffer, count_elems, dtype, peer);
  exchange({&op, 1}, stream);
}

std::unique_ptr<Communicator> make_counting_communicator(std::unique_ptr<Communicator> inner,
                                                         std::shared_ptr<CollectiveCounts> counts) {
  return std::make_unique<CountingCommunicator>(std::move(inner), std::move(counts));
}

void tree_reduce_host(const void* const* contributions, int world, void* out, std::size_t count, DType dtype,
                      ReduceOp op) {
  STRATA_CHECK(world >= 1, "tree_reduce_host over {} ranks", world);
  constexpr std::size_t kBlock = 2048;
  std::vector<float> t(static_cast<std::size_t>(world) * kBlock);
  for (std::size_t base = 0; base < count; base += kBlock) {
    const std::size_t n = std::min(kBlock, count - base);
    const std::size_t offset_bytes = base * dtype_bytes(dtype);
    for (int r = 0; r < world; ++r) {
      convert(static_cast<const char*>(contributions[r]) + offset_bytes, dtype, t.data() + static_cast<std::size_t>(r) * kBlock,
              DType::F32, n);
    }
    // Bottom-up pairwise tree: at stride s, row i (a multiple of 2s) absorbs row i + s. For world 4
    // this is (r0 + r1) + (r2 + r3); for world 3, (r0 + r1) + r2.
    for (int stride = 1; stride < world; stride *= 2) {
      for (int i = 0; i + stride < world; i += 2 * stride) {
        float* a = t.data() + static_cast<std::size_t>(i) * kBlock;
        const float* b = t.data() + static_cast<std::size_t>(i + stride) * kBlock;
        for (std::size_t k = 0; k < n; ++k) a[k] = combine(a[k], b[k], op);
      }
    }
    convert(t.data(), DType::F32, static_cast<char*>(out) + offset_bytes, dtype, n);
  }
}

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

std::unique_ptr<Communicator> make_world_communicator(Device& device, const CommunicatorOptions& options) {
  if (!launched_by_mpi()) return make_local_communicator();
  if (device.kind() == DeviceKind::Cuda) {
    if (options.mpi_on_cuda) {
      return make_ordered_communicator(make_staged_communicator(make_mpi_world_communicator(options), device), device);
    }
    return make_nccl_world_communicator(device, options);
  }
  return make_ordered_communicator(make_mpi_world_communicator(options), device);
}

bool another_rank_failed(Communicator& world, const std::exception_ptr& error) {
  const double failed = world.all_reduce_host(error ? 1.0 : 0.0, ReduceOp::Max);
  if (error) std::rethrow_exception(error);
  return failed > 0;
}

}  // namespace strata
