// The local (single-rank) communicator, the deterministic tree reduction shared by all backends,
// and the choice of backend for the world communicator (see engine/communicator.h).
#include "engine/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/dtype_bulk.h"
#include "core/error.h"
#include "engine/reduce_math.h"

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

}  // namespace

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
  if (device.kind() == DeviceKind::Cuda) return make_nccl_world_communicator(device, options);
  return make_mpi_world_communicator(options);
}

bool another_rank_failed(Communicator& world, const std::exception_ptr& error) {
  const double failed = world.all_reduce_host(error ? 1.0 : 0.0, ReduceOp::Max);
  if (error) std::rethrow_exception(error);
  return failed > 0;
}

}  // namespace strata
