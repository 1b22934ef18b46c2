// Multi-rank test of the MPI communicator, run by ctest under `mpirun -np 2` and `-np 4`: every
// collective against values computed locally from the same formula, with the deterministic tree
// order checked bit for bit, hybrid-sharding splits, and point to point (single transfers and
// exchanges); with the argument `staged`
// the same checks through the staged communicator (Note [Staged MPI] in comm/comm_staged.cc). Prints "N passed, N
// failed" per rank and exits non-zero on any failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/dtype.h"
#include "comm/communicator.h"
#include "tests/engine/rank_checks.h"

namespace {

using namespace strata;

// The value rank r contributes at element i: chosen so sums depend on order.
float contribution(int r, std::size_t i) {
  const float big = (r % 2 == 0 ? 1.0e8f : -1.0e8f);
  return (r < 2 ? big : 0.0f) + static_cast<float>((i * 7 + static_cast<std::size_t>(r) * 13) % 17) * 0.37f;
}

// What every check uses: the world communicator, one stream on its sim device, and device buffers
// of `total` floats (`count` per rank) to send from and receive into.
struct Collectives {
  Device& device;
  Communicator& comm;
  Stream& stream;
  DeviceMemory& send;
  DeviceMemory& recv;
  testing_mpi::RankChecks& checks;
  int rank;
  int world;
  std::size_t count;
  std::size_t total;
};

// reduce_scatter: rank r gets the tree sum over ranks of element block r.
void check_reduce_scatter(Collectives& c) {
  const int rank = c.rank, world = c.world;
  const std::size_t count = c.count, total = c.total;
  std::vector<float> host(total);
  for (std::size_t i = 0; i < total; ++i) host[i] = contribution(rank, i);
  c.stream.copy_h2d(c.send.data(), host.data(), total * sizeof(float));
  c.comm.reduce_scatter(c.send.data(), c.recv.data(), count, DType::F32, ReduceOp::Sum, c.stream);
  std::vector<float> mine(count);
  c.stream.copy_d2h(mine.data(), c.recv.data(), count * sizeof(float));
  c.stream.synchronize();
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
  c.checks.expect(bad == 0, "reduce_scatter bit-identical to the tree sum (" + std::to_string(bad) + " wrong)");
}

// all_gather: everyone gets every rank's block.
void check_all_gather(Collectives& c) {
  const int rank = c.rank, world = c.world;
  const std::size_t count = c.count, total = c.total;
  std::vector<float> mine(count), host(total);
  for (std::size_t k = 0; k < count; ++k) mine[k] = static_cast<float>(rank * 100000 + static_cast<int>(k));
  c.stream.copy_h2d(c.send.data(), mine.data(), count * sizeof(float));
  c.comm.all_gather(c.send.data(), c.recv.data(), count, DType::F32, c.stream);
  c.stream.copy_d2h(host.data(), c.recv.data(), total * sizeof(float));
  c.stream.synchronize();
  int bad = 0;
  for (int r = 0; r < world; ++r) {
    for (std::size_t k = 0; k < count; ++k) {
      if (host[static_cast<std::size_t>(r) * count + k] != static_cast<float>(r * 100000 + static_cast<int>(k))) ++bad;
    }
  }
  c.checks.expect(bad == 0, "all_gather (" + std::to_string(bad) + " wrong)");
}

// all_reduce of an odd count in bf16: identical on every rank, equal to the tree sum rounded once.
void check_all_reduce_bf16(Collectives& c) {
  const int rank = c.rank, world = c.world;
  const std::size_t odd = 777;
  std::vector<bf16> hb(odd), out(odd);
  for (std::size_t i = 0; i < odd; ++i) hb[i] = f32_to_bf16(contribution(rank, i) * 1e-6f);
  c.stream.copy_h2d(c.send.data(), hb.data(), odd * sizeof(bf16));
  c.comm.all_reduce(c.send.data(), c.recv.data(), odd, DType::BF16, ReduceOp::Sum, c.stream);
  c.stream.copy_d2h(out.data(), c.recv.data(), odd * sizeof(bf16));
  c.stream.synchronize();
  int bad = 0;
  for (std::size_t i = 0; i < odd; ++i) {
    std::vector<bf16> parts(static_cast<std::size_t>(world));
    std::vector<const void*> ptrs;
    for (int r = 0; r < world; ++r) parts[static_cast<std::size_t>(r)] = f32_to_bf16(contribution(r, i) * 1e-6f);
    for (auto& p : parts) ptrs.push_back(&p);
    bf16 expected{};
    tree_reduce_host(ptrs.data(), world, &expected, 1, DType::BF16, ReduceOp::Sum);
    if (expected.bits != out[i].bits) ++bad;
  }
  c.checks.expect(bad == 0, "all_reduce bf16 (" + std::to_string(bad) + " wrong)");
}

// broadcast from the last rank.
void check_broadcast(Collectives& c) {
  const int rank = c.rank, world = c.world;
  const std::size_t count = c.count;
  std::vector<float> mine(count);
  for (std::size_t k = 0; k < count; ++k) mine[k] = rank == world - 1 ? static_cast<float>(k) : -1.0f;
  c.stream.copy_h2d(c.send.data(), mine.data(), count * sizeof(float));
  c.comm.broadcast(c.send.data(), count, DType::F32, world - 1, c.stream);
  c.stream.copy_d2h(mine.data(), c.send.data(), count * sizeof(float));
  c.stream.synchronize();
  int bad = 0;
  for (std::size_t k = 0; k < count; ++k) bad += mine[k] != static_cast<float>(k);
  c.checks.expect(bad == 0, "broadcast");
}

// Host scalars: sum and NaN-propagating max.
void check_host_scalars(Collectives& c) {
  const int rank = c.rank, world = c.world;
  c.checks.expect(c.comm.all_reduce_host(rank + 1.0, ReduceOp::Sum) == world * (world + 1) / 2.0,
                  "all_reduce_host sum");
  const double mx = c.comm.all_reduce_host(rank == 0 ? NAN : 1.0, ReduceOp::Max);
  c.checks.expect(std::isnan(mx), "all_reduce_host max sees a NaN from rank 0");
}

// Hybrid sharding: groups of 2 consecutive ranks.
void check_split(Collectives& c) {
  const int rank = c.rank, world = c.world;
  if (world % 2 == 0) {
    auto group = c.comm.split(rank / 2, rank);
    c.checks.expect(group->world_size() == 2 && group->rank() == rank % 2, "split into groups of 2");
    c.checks.expect(group->all_reduce_host(1.0, ReduceOp::Sum) == 2.0, "collective inside a group");
  }
}

// Point to point along a chain 0 -> 1 -> ... -> world-1 -> 0: even ranks send before they
// receive, odd ranks receive first, so every send meets its receive. The values arrive bit for bit.
void check_send_recv(Collectives& c) {
  const int rank = c.rank, world = c.world;
  const std::size_t n = c.total;
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = contribution(rank, i);
  c.stream.copy_h2d(c.send.data(), host.data(), n * sizeof(float));
  if (rank % 2 == 0) {
    c.comm.send(c.send.data(), n, DType::F32, next, c.stream);
    c.comm.recv(c.recv.data(), n, DType::F32, prev, c.stream);
  } else {
    c.comm.recv(c.recv.data(), n, DType::F32, prev, c.stream);
    c.comm.send(c.send.data(), n, DType::F32, next, c.stream);
  }
  std::vector<float> got(n);
  c.stream.copy_d2h(got.data(), c.recv.data(), n * sizeof(float));
  c.stream.synchronize();
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float want = contribution(prev, i);
    bad += std::memcmp(&want, &got[i], sizeof(float)) != 0 ? 1 : 0;
  }
  c.checks.expect(bad == 0, "send/recv along a chain delivers the sender's values (" + std::to_string(bad) + " wrong)");
}

// See Note [Issue order] in comm/communicator.h.
// One exchange in which every rank first sends to both neighbours and then
// receives from both. Issued as four calls in that order it would deadlock (each send waits for a
// receive queued behind the peer's sends; the messages are past MPI's eager limit); in one exchange
// the transfers progress together. At world 2 both neighbours are one peer: its two transfers pair
// in the order they are listed.
void check_exchange(Collectives& c) {
  const int rank = c.rank, world = c.world;
  const std::size_t n = std::size_t{1} << 16;  // 256 KiB per message
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  auto value = [](int r, int which, std::size_t i) { return contribution(r, i) + static_cast<float>(which) * 1000.0f; };
  std::vector<DeviceMemory> bufs;
  for (int b = 0; b < 4; ++b) bufs.push_back(c.device.allocate(n * sizeof(float), "test exchange"));
  std::vector<float> host(n);
  for (int which = 0; which < 2; ++which) {
    for (std::size_t i = 0; i < n; ++i) host[i] = value(rank, which, i);
    c.stream.copy_h2d(bufs[static_cast<std::size_t>(which)].data(), host.data(), n * sizeof(float));
    c.stream.synchronize();
  }
  const std::vector<PeerOp> ops{PeerOp::send(bufs[0].data(), n, DType::F32, next),
                                PeerOp::send(bufs[1].data(), n, DType::F32, prev),
                                PeerOp::recv(bufs[2].data(), n, DType::F32, prev),
                                PeerOp::recv(bufs[3].data(), n, DType::F32, next)};
  c.comm.exchange(ops, c.stream);
  int bad = 0;
  for (int which = 0; which < 2; ++which) {  // buffer 2 holds prev's first message, 3 next's second
    c.stream.copy_d2h(host.data(), bufs[static_cast<std::size_t>(2 + which)].data(), n * sizeof(float));
    c.stream.synchronize();
    const int from = which == 0 ? prev : next;
    for (std::size_t i = 0; i < n; ++i) {
      const float want = value(from, which, i);
      bad += std::memcmp(&want, &host[i], sizeof(float)) != 0 ? 1 : 0;
    }
  }
  c.checks.expect(bad == 0, "an exchange of sends to both neighbours before the receives delivers every value (" +
                                std::to_string(bad) + " wrong)");
}

}  // namespace

int main(int argc, char** argv) {
  // `staged`: the same checks through the staged communicator (Note [Staged MPI] in comm/comm_staged.cc), whose copies
  // on the sim device are what they are on cuda, in stream order.
  const bool staged = argc > 1 && std::string(argv[1]) == "staged";
  if (!launched_by_mpi()) {
    std::fprintf(stderr, "comm_mpi_test must run under mpirun (ctest does this)\n");
    return 1;
  }
  SimDeviceOptions options;
  options.capacity_bytes = 64 << 20;
  auto device = make_sim_device(options);
  auto comm = make_world_communicator(*device, CommunicatorOptions{});
  // As make_world_communicator nests them on cuda: staged inside, issue order outside.
  if (staged) comm = make_ordered_communicator(make_staged_communicator(std::move(comm), *device), *device);
  const int rank = comm->rank();
  testing_mpi::RankChecks checks(rank);
  const int world = comm->world_size();
  auto stream = device->create_stream("comm");
  checks.expect(comm->backend() == (staged ? "mpi-staged" : "mpi"), "backend is " + comm->backend());

  const std::size_t count = 1000;  // per-rank chunk
  const std::size_t total = count * static_cast<std::size_t>(world);
  DeviceMemory send = device->allocate(total * sizeof(float), "test");
  DeviceMemory recv = device->allocate(total * sizeof(float), "test");
  Collectives c{*device, *comm, *stream, send, recv, checks, rank, world, count, total};
  check_reduce_scatter(c);
  check_all_gather(c);
  check_all_reduce_bf16(c);
  check_broadcast(c);
  check_host_scalars(c);
  check_split(c);
  check_send_recv(c);
  check_exchange(c);
  comm->barrier();
  return checks.finish();
}
