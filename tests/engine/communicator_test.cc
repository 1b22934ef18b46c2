// Single-process tests of the communicator layer: the deterministic tree reduction (its order is
// the contract that makes world sizes 1, 2 and 4 bit-identical), the local backend and the issue
// order of the ordered wrapper.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "core/device/device.h"
#include "core/device/sim_kernel.h"
#include "core/dtype.h"
#include "comm/communicator.h"

namespace strata {
namespace {

// Reference (see Note [Deterministic reduction] in comm/communicator.h): recursive pairwise split by powers of two.
float tree_reference(const std::vector<float>& v, std::size_t lo, std::size_t n) {
  if (n == 1) return v[lo];
  std::size_t half = 1;
  while (half * 2 < n) half *= 2;
  return tree_reference(v, lo, half) + tree_reference(v, lo + half, n - half);
}

TEST(TreeReduce, SumsInPairwiseTreeOrderForEveryWorldSize) {
  // Values whose fp32 sum depends on the order: large cancelling terms and small ones.
  const std::vector<float> pool = {1e8f, 1.0f, -1e8f, 1.0f, 3.5e7f, -0.75f, 2.0f, -3.5e7f, 0.125f};
  for (int world = 1; world <= 9; ++world) {
    std::vector<float> contributions(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) contributions[static_cast<std::size_t>(r)] = pool[static_cast<std::size_t>(r)];
    std::vector<const void*> parts;
    for (int r = 0; r < world; ++r) parts.push_back(&contributions[static_cast<std::size_t>(r)]);
    float out = 0;
    tree_reduce_host(parts.data(), world, &out, 1, DType::F32, ReduceOp::Sum);
    const float expected = tree_reference(contributions, 0, static_cast<std::size_t>(world));
    EXPECT_EQ(std::memcmp(&out, &expected, sizeof out), 0) << "world " << world << ": " << out << " vs " << expected;
  }
  // The order is observable: for world 4, (1e8 + 1) + (-1e8 + 1) = 0 in fp32, whereas a sequential
  // sum ((1e8 + 1) - 1e8) + 1 = 1.
  std::vector<float> four = {1e8f, 1.0f, -1e8f, 1.0f};
  const void* parts4[] = {&four[0], &four[1], &four[2], &four[3]};
  float out = -1;
  tree_reduce_host(parts4, 4, &out, 1, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(out, 0.0f);
}

TEST(TreeReduce, ManyElementsAndLowPrecisionRoundOnce) {
  const std::size_t n = 5000;  // crosses the internal block size
  std::vector<bf16> a(n), b(n), c(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = f32_to_bf16(static_cast<float>(i) * 0.01f);
    b[i] = f32_to_bf16(1.0f / static_cast<float>(i + 1));
    c[i] = f32_to_bf16(-static_cast<float>(i) * 0.0099f);
  }
  const void* parts[] = {a.data(), b.data(), c.data()};
  std::vector<bf16> out(n);
  tree_reduce_host(parts, 3, out.data(), n, DType::BF16, ReduceOp::Sum);
  for (std::size_t i = 0; i < n; ++i) {
    const float expected = (bf16_to_f32(a[i]) + bf16_to_f32(b[i])) + bf16_to_f32(c[i]);
    ASSERT_EQ(out[i].bits, f32_to_bf16(expected).bits) << "element " << i;
  }
}

TEST(TreeReduce, MaxPropagatesNaN) {
  const float vals[] = {1.0f, NAN, 3.0f};
  const void* parts[] = {&vals[0], &vals[1], &vals[2]};
  float out = 0;
  tree_reduce_host(parts, 3, &out, 1, DType::F32, ReduceOp::Max);
  EXPECT_TRUE(std::isnan(out));
  const void* finite[] = {&vals[0], &vals[2]};
  tree_reduce_host(finite, 2, &out, 1, DType::F32, ReduceOp::Max);
  EXPECT_EQ(out, 3.0f);
}

TEST(LocalCommunicator, CollectivesAreCopiesOnTheStream) {
  auto comm = make_local_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  SimDeviceOptions options;
  options.capacity_bytes = 1 << 20;
  auto device = make_sim_device(options);
  auto stream = device->create_stream("comm");
  DeviceMemory a = device->allocate(64 * sizeof(float), "test");
  DeviceMemory b = device->allocate(64 * sizeof(float), "test");
  std::vector<float> host(64), back(64, 0.0f);
  for (int i = 0; i < 64; ++i) host[static_cast<std::size_t>(i)] = static_cast<float>(i) * 1.5f;
  stream->copy_h2d(a.data(), host.data(), 64 * sizeof(float));
  comm->all_reduce(a.data(), b.data(), 64, DType::F32, ReduceOp::Sum, *stream);
  stream->copy_d2h(back.data(), b.data(), 64 * sizeof(float));
  stream->synchronize();
  EXPECT_EQ(host, back);
  EXPECT_EQ(comm->all_reduce_host(2.5, ReduceOp::Sum), 2.5);
  auto sub = comm->split(0, 0);
  EXPECT_EQ(sub->world_size(), 1);
}

// See Note [Issue order] in comm/communicator.h.
// The ordered communicator runs a call issued on one stream after the call
// issued before it on another. Stream `first` is held by a gate while it copies a to b; the call
// issued next, on `second`, copies b to c. In issue order c gets a's values. Unordered, `second`
// would copy b's old values while `first` waits at the gate.
TEST(OrderedCommunicator, RunsCallsInIssueOrderAcrossStreams) {
  SimDeviceOptions options;
  options.capacity_bytes = 1 << 20;
  auto device = make_sim_device(options);
  auto comm = make_ordered_communicator(make_local_communicator(), *device);
  auto first = device->create_stream("first"), second = device->create_stream("second");
  constexpr std::size_t n = 64;
  DeviceMemory a = device->allocate(n * sizeof(float), "a"), b = device->allocate(n * sizeof(float), "b"),
               c = device->allocate(n * sizeof(float), "c");
  const std::vector<float> values(n, 7.0f), old(n, -1.0f);
  first->copy_h2d(a.data(), values.data(), n * sizeof(float));
  first->copy_h2d(b.data(), old.data(), n * sizeof(float));
  first->synchronize();
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  launch_sim_kernel(*first, [opened] { opened.wait(); });
  comm->all_reduce(a.data(), b.data(), n, DType::F32, ReduceOp::Sum, *first);
  comm->all_gather(b.data(), c.data(), n, DType::F32, *second);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // unordered, `second` copies now
  gate.set_value();
  std::vector<float> got(n);
  second->copy_d2h(got.data(), c.data(), n * sizeof(float));
  second->synchronize();
  first->synchronize();
  EXPECT_EQ(got, values);
  EXPECT_EQ(comm->split(0, 0)->world_size(), 1);
}

}  // namespace
}  // namespace strata
