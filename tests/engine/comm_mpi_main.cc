// Multi-rank test of the MPI communicator, run by ctest under `mpirun -np 2` and `-np 4`: every
// collective against values computed locally from the same formula, with the deterministic tree
// order checked bit for bit, and hybrid-sharding splits. Prints "N passed, N failed" per rank and
// exits non-zero on any failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/dtype.h"
#include "engine/communicator.h"
#include "tests/engine/rank_checks.h"

namespace {

// The value rank r contributes at element i: chosen so sums depend on order.
float contribution(int r, std::size_t i) {
  const float big = (r % 2 == 0 ? 1.0e8f : -1.0e8f);
  return (r < 2 ? big : 0.0f) + static_cast<float>((i * 7 + static_cast<std::size_t>(r) * 13) % 17) * 0.37f;
}

}  // namespace

int main() {
  using namespace strata;
  if (!launched_by_mpi()) {
    std::fprintf(stderr, "comm_mpi_test must run under mpirun (ctest does this)\n");
    return 1;
  }
  SimDeviceOptions options;
  options.capacity_bytes = 64 << 20;
  auto device = make_sim_device(options);
  auto comm = make_world_communicator(*device, CommunicatorOptions{});
  const int rank = comm->rank();
  testing_mpi::RankChecks checks(rank);
  const int world = comm->world_size();
  auto stream = device->create_stream("comm");
  checks.expect(comm->backend() == "mpi", "backend is mpi");

  const std::size_t count = 1000;  // per-rank chunk
  const std::size_t total = count * static_cast<std::size_t>(world);
  DeviceMemory send = device->allocate(total * sizeof(float), "test");
  DeviceMemory recv = device->allocate(total * sizeof(float), "test");
  std::vector<float> host(total);

  // reduce_scatter: rank r gets the tree sum over ranks of element block r.
  for (std::size_t i = 0; i < total; ++i) host[i] = contribution(rank, i);
  stream->copy_h2d(send.data(), host.data(), total * sizeof(float));
  comm->reduce_scatter(send.data(), recv.data(), count, DType::F32, ReduceOp::Sum, *stream);
  std::vector<float> mine(count);
  stream->copy_d2h(mine.data(), recv.data(), count * sizeof(float));
  stream->synchronize();
  int bad = 0;
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t i = static_cast<std::size_t>(rank) * count + k;
    std::vector<float> parts(static_cast<std::size_t>(world));
    std::vector<const void*> ptrs;
    for (int r = 0; r < world; ++r) {
      parts[static_cast<std::size_t>(r)] = contribution(r, i);
    }
    for (auto& p : parts) ptrs.push_back(&p);
    float expected = 0;
    tree_reduce_host(ptrs.data(), world, &expected, 1, DType::F32, ReduceOp::Sum);
    if (std::memcmp(&expected, &mine[k], sizeof(float)) != 0) ++bad;
  }
  checks.expect(bad == 0, "reduce_scatter bit-identical to the tree sum (" + std::to_string(bad) + " wrong)");

  // all_gather: everyone gets every rank's block.
  for (std::size_t k = 0; k < count; ++k) mine[k] = static_cast<float>(rank * 100000 + static_cast<int>(k));
  stream->copy_h2d(send.data(), mine.data(), count * sizeof(float));
  comm->all_gather(send.data(), recv.data(), count, DType::F32, *stream);
  stream->copy_d2h(host.data(), recv.data(), total * sizeof(float));
  stream->synchronize();
  bad = 0;
  for (int r = 0; r < world; ++r) {
    for (std::size_t k = 0; k < count; ++k) {
      if (host[static_cast<std::size_t>(r) * count + k] != static_cast<float>(r * 100000 + static_cast<int>(k))) ++bad;
    }
  }
  checks.expect(bad == 0, "all_gather (" + std::to_string(bad) + " wrong)");

  // all_reduce of an odd count in bf16: identical on every rank, equal to the tree sum rounded once.
  const std::size_t odd = 777;
  std::vector<bf16> hb(odd), out(odd);
  for (std::size_t i = 0; i < odd; ++i) hb[i] = f32_to_bf16(contribution(rank, i) * 1e-6f);
  stream->copy_h2d(send.data(), hb.data(), odd * sizeof(bf16));
  comm->all_reduce(send.data(), recv.data(), odd, DType::BF16, ReduceOp::Sum, *stream);
  stream->copy_d2h(out.data(), recv.data(), odd * sizeof(bf16));
  stream->synchronize();
  bad = 0;
  for (std::size_t i = 0; i < odd; ++i) {
    std::vector<bf16> parts(static_cast<std::size_t>(world));
    std::vector<const void*> ptrs;
    for (int r = 0; r < world; ++r) parts[static_cast<std::size_t>(r)] = f32_to_bf16(contribution(r, i) * 1e-6f);
    for (auto& p : parts) ptrs.push_back(&p);
    bf16 expected{};
    tree_reduce_host(ptrs.data(), world, &expected, 1, DType::BF16, ReduceOp::Sum);
    if (expected.bits != out[i].bits) ++bad;
  }
  checks.expect(bad == 0, "all_reduce bf16 (" + std::to_string(bad) + " wrong)");

  // broadcast from the last rank.
  for (std::size_t k = 0; k < count; ++k) mine[k] = rank == world - 1 ? static_cast<float>(k) : -1.0f;
  stream->copy_h2d(send.data(), mine.data(), count * sizeof(float));
  comm->broadcast(send.data(), count, DType::F32, world - 1, *stream);
  stream->copy_d2h(mine.data(), send.data(), count * sizeof(float));
  stream->synchronize();
  bad = 0;
  for (std::size_t k = 0; k < count; ++k) bad += mine[k] != static_cast<float>(k);
  checks.expect(bad == 0, "broadcast");

  // Host scalars: sum and NaN-propagating max.
  checks.expect(comm->all_reduce_host(rank + 1.0, ReduceOp::Sum) == world * (world + 1) / 2.0, "all_reduce_host sum");
  const double mx = comm->all_reduce_host(rank == 0 ? NAN : 1.0, ReduceOp::Max);
  checks.expect(std::isnan(mx), "all_reduce_host max sees a NaN from rank 0");

  // Hybrid sharding: groups of 2 consecutive ranks.
  if (world % 2 == 0) {
    auto group = comm->split(rank / 2, rank);
    checks.expect(group->world_size() == 2 && group->rank() == rank % 2, "split into groups of 2");
    checks.expect(group->all_reduce_host(1.0, ReduceOp::Sum) == 2.0, "collective inside a group");
  }
  comm->barrier();
  return checks.finish();
}
