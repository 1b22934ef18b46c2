// Tests of the sim device under load: the modeled link (bandwidth and full duplex: the only timed
// tests, with bounds explained where they are asserted), a multi-stream stress run against a
// serial reference, and threads allocating, copying and releasing at once. The Device contract
// itself: sim_device_test.cc.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/device/device.h"
#include "core/device/sim_kernel.h"
#include "core/units.h"
#include "tests/core/sim_device_test_util.h"

namespace strata {
namespace {

using testing_sim::fill_pattern;
using testing_sim::small_device;

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Timing under a sanitizer measures the sanitizer (memcpy is ~10x slower, threads are slowed
// unevenly); those builds are for races and memory errors.
#if defined(STRATA_SANITIZER)
#define SKIP_TIMING_UNDER_SANITIZER() GTEST_SKIP() << "timed test; skipped in sanitizer builds"
#else
#define SKIP_TIMING_UNDER_SANITIZER() (void)0
#endif

TEST(SimDevice, ModeledBandwidthHoldsOnA256MiBCopy) {
  SKIP_TIMING_UNDER_SANITIZER();
  constexpr std::size_t kBytes = 256 * MiB;
  std::vector<unsigned char> src(kBytes, 0x5A);
  SimDeviceOptions o = small_device(kBytes + MiB);
  auto probe = make_sim_device(o);  // unthrottled twin, to time a plain memcpy into the arena
  DeviceMemory warm = probe->allocate(kBytes, "probe");
  std::memcpy(warm.data(), src.data(), kBytes);  // first touch faults the pages in
  const auto t0 = Clock::now();
  std::memcpy(warm.data(), src.data(), kBytes);
  const double memcpy_ms = ms_since(t0);
  warm.reset();  // the pages go back to the OS (Note [Freed pages] in core/device/sim_allocator.h)
  probe.reset();
  // The model is a floor: a copy takes max(modeled time, memcpy time). Pick a bandwidth whose
  // modeled time leaves the warm memcpy at most 30% of it, so what is measured is the model:
  // 2 GB/s on an idle machine (its memcpy alone runs at ~8 GB/s), less under heavy load.
  double gbps = 2.0;
  while (memcpy_ms > 0.3 * (static_cast<double>(kBytes) / (gbps * 1e9) * 1e3) && gbps > 0.1) gbps /= 2;

  o.h2d_gbps = gbps;
  auto device = make_sim_device(o);
  auto stream = device->create_stream("h2d");
  DeviceMemory dst = device->allocate(kBytes, "bw");
  stream->memset(dst.data(), 0, kBytes);  // fault the pages in: first-touch cost is not the link's
  stream->synchronize();

  const double model_ms = static_cast<double>(kBytes) / (gbps * 1e9) * 1e3;
  const auto start = Clock::now();
  stream->copy_h2d(dst.data(), src.data(), kBytes);
  stream->synchronize();
  const double measured_ms = ms_since(start);
  RecordProperty("model_ms", std::to_string(model_ms));
  RecordProperty("measured_ms", std::to_string(measured_ms));
  std::printf("256 MiB h2d at %.2f GB/s: model %.1f ms, measured %.1f ms (memcpy alone %.1f ms)\n", gbps, model_ms,
              measured_ms, memcpy_ms);
  // Lower bound: guaranteed, the copy sleeps until the modeled finish. Upper bound: the memcpy fits
  // inside the window by construction; the rest is thread hand-off and sleep overshoot (well under
  // a millisecond normally), so 1.25x only fails on a machine too loaded to model anything.
  EXPECT_GE(measured_ms, 0.9 * model_ms);
  EXPECT_LE(measured_ms, 1.25 * model_ms);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), kBytes), 0);
}

// See Note [Modeled link] in core/device/sim_link.h: one link per direction, shared; h2d and d2h are separate.
TEST(SimDevice, LinksAreFullDuplexAndSharedPerDirection) {
  SKIP_TIMING_UNDER_SANITIZER();
  constexpr std::size_t kBytes = 8 * MiB;
  SimDeviceOptions o = small_device(32 * MiB);
  o.h2d_gbps = 0.1;
  o.d2h_gbps = 0.1;
  const double one_ms = static_cast<double>(kBytes) / 0.1e9 * 1e3;  // ~84 ms: long against scheduling noise
  auto device = make_sim_device(o);
  auto s1 = device->create_stream("s1");
  auto s2 = device->create_stream("s2");
  DeviceMemory d1 = device->allocate(kBytes, "duplex");
  DeviceMemory d2 = device->allocate(kBytes, "duplex");
  std::vector<unsigned char> h1(kBytes, 1), h2(kBytes, 2);
  device->pin_host(h1.data(), kBytes);  // pinned: the copies are queued and overlap (Note [Pageable copies] in core/device/sim_stream.cc)
  device->pin_host(h2.data(), kBytes);
  s1->memset(d1.data(), 0, kBytes);  // fault the pages in (memset goes over the unthrottled d2d link)
  s1->memset(d2.data(), 0, kBytes);
  s1->synchronize();

  const auto duplex_start = Clock::now();
  s1->copy_h2d(d1.data(), h1.data(), kBytes);
  s2->copy_d2h(h2.data(), d2.data(), kBytes);
  s1->synchronize();
  s2->synchronize();
  const double duplex_ms = ms_since(duplex_start);

  const auto shared_start = Clock::now();
  s1->copy_h2d(d1.data(), h1.data(), kBytes);
  s2->copy_h2d(d2.data(), h2.data(), kBytes);
  s1->synchronize();
  s2->synchronize();
  const double shared_ms = ms_since(shared_start);
  std::printf("one copy model %.1f ms; h2d+d2h concurrently %.1f ms; two h2d concurrently %.1f ms\n", one_ms,
              duplex_ms, shared_ms);
  // Generous: both overlap fully in the model (about 1x); 1.6x leaves room for a loaded machine.
  EXPECT_GE(duplex_ms, 0.9 * one_ms);
  EXPECT_LE(duplex_ms, 1.6 * one_ms);
  // Guaranteed by the model: the second reservation starts where the first ends.
  EXPECT_GE(shared_ms, 1.9 * one_ms);
}

// 8 streams, thousands of operations: copies, memsets, sim kernels and a ring of cross-stream
// waits. Compared with the same operations run serially on plain host memory.
TEST(SimDevice, StressManyStreamsMatchesSerialReference) {
  constexpr int kStreams = 8;
  constexpr int kRounds = 200;
  constexpr std::size_t kElems = 512;
  constexpr std::size_t kBytes = kElems * sizeof(std::uint32_t);
  auto device = make_sim_device(small_device(16 * MiB));
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Event>> events;
  std::vector<DeviceMemory> ring, priv;
  std::vector<std::vector<std::uint32_t>> host_src(kStreams, std::vector<std::uint32_t>(kElems));
  std::vector<std::vector<std::uint32_t>> ring_out(kStreams, std::vector<std::uint32_t>(kElems));
  std::vector<std::vector<std::uint32_t>> priv_out(kStreams, std::vector<std::uint32_t>(kElems));
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(device->create_stream("stress" + std::to_string(i)));
    events.push_back(device->create_event());
    ring.push_back(device->allocate(kBytes, "ring"));
    priv.push_back(device->allocate(kBytes, "private"));
    for (std::size_t k = 0; k < kElems; ++k) host_src[i][k] = static_cast<std::uint32_t>(i * 1000 + k);
  }
  // Pinned, so the copies queue instead of blocking this thread (Note [Pageable copies] in core/device/sim_stream.cc).
  for (auto* arrays : {&host_src, &ring_out, &priv_out}) {
    for (auto& a : *arrays) device->pin_host(a.data(), kBytes);
  }
  auto setup = device->create_stream("setup");
  for (int i = 0; i < kStreams; ++i) setup->memset(ring[i].data(), i + 1, kBytes);
  setup->synchronize();

  // Serial reference on host memory.
  std::vector<std::vector<std::uint32_t>> ref_ring(kStreams, std::vector<std::uint32_t>(kElems));
  std::vector<std::vector<std::uint32_t>> ref_priv(kStreams, std::vector<std::uint32_t>(kElems, 0));
  for (int i = 0; i < kStreams; ++i) {
    std::memset(ref_ring[i].data(), i + 1, kBytes);
  }

  for (int r = 0; r < kRounds; ++r) {
    for (int i = 0; i < kStreams; ++i) {
      const int prev = (i + kStreams - 1) % kStreams;
      Stream& s = *streams[i];
      auto* mine = ring[i].as<std::uint32_t>();
      auto* pv = priv[i].as<std::uint32_t>();
      const auto round = static_cast<std::uint32_t>(r);
      if (r > 0 || i > 0) s.wait(*events[prev]);
      s.copy_h2d(pv, host_src[i].data(), kBytes);           // independent traffic
      s.copy_d2d(mine, ring[prev].as<std::uint32_t>(), kBytes);  // needs prev's latest result
      launch_sim_kernel(s, [mine, pv, round] {
        for (std::size_t k = 0; k < kElems; ++k) mine[k] = mine[k] * 3u + pv[k] + round;
      });
      if (r % 7 == 3) s.memset(pv, 0, kBytes / 2);
      s.record(*events[i]);

      // Reference, same order.
      ref_priv[i] = host_src[i];
      ref_ring[i] = ref_ring[prev];
      for (std::size_t k = 0; k < kElems; ++k) ref_ring[i][k] = ref_ring[i][k] * 3u + ref_priv[i][k] + round;
      if (r % 7 == 3) std::memset(ref_priv[i].data(), 0, kBytes / 2);
    }
  }
  for (int i = 0; i < kStreams; ++i) {
    streams[i]->copy_d2h(ring_out[i].data(), ring[i].data(), kBytes);
    streams[i]->copy_d2h(priv_out[i].data(), priv[i].data(), kBytes);
  }
  for (auto& s : streams) s->synchronize();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_EQ(ring_out[i], ref_ring[i]) << "ring buffer of stream " << i;
    EXPECT_EQ(priv_out[i], ref_priv[i]) << "private buffer of stream " << i;
  }
}

// Allocations, release_after and copies from several threads at once, each with its own stream.
TEST(SimDevice, ConcurrentThreadsAllocateCopyAndRelease) {
  constexpr int kThreads = 4;
  constexpr int kIterations = 150;
  SimDeviceOptions o = small_device(32 * MiB);
  o.h2d_gbps = 50;  // fast, but the shared links are contended (no timing is asserted here)
  o.d2h_gbps = 50;
  o.latency_us = 2;
  auto device = make_sim_device(o);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto stream = device->create_stream("worker" + std::to_string(t));
      for (int i = 0; i < kIterations; ++i) {
        const std::size_t bytes = 1000 + static_cast<std::size_t>((t * 7919 + i * 104729) % 200000);
        std::vector<unsigned char> src(bytes), dst(bytes, 0);
        fill_pattern(src, static_cast<std::uint64_t>(t * 100000 + i));
        DeviceMemory mem = device->allocate(bytes, t % 2 == 0 ? "even" : "odd");
        stream->copy_h2d(mem.data(), src.data(), bytes);
        stream->copy_d2h(dst.data(), mem.data(), bytes);
        stream->release_after(std::move(mem));
        stream->synchronize();
        if (dst != src) mismatches.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  const MemoryStats s = device->memory_stats();
  EXPECT_EQ(s.live_allocations, 0u);
  EXPECT_EQ(s.total_allocations, static_cast<std::uint64_t>(kThreads * kIterations));
  EXPECT_EQ(s.largest_free_block_bytes, device->capacity_bytes());
}

}  // namespace
}  // namespace strata
