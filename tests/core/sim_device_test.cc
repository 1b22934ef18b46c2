// Tests of the sim device backend against the Device contract (core/device/device.h): stream
// order, events joining streams, exact copies of awkward sizes, out-of-memory reports, sticky
// errors, release_after, and use after the device is destroyed. Host memory (the pinned registry,
// pageable copies, pinning rules): sim_device_host_memory_test.cc. The modeled link and load (timed
// tests, a multi-stream stress run, concurrent threads): sim_device_link_stress_test.cc.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/device/device.h"
#include "core/device/sim_kernel.h"
#include "core/error.h"
#include "core/host_buffer.h"
#include "core/units.h"
#include "tests/core/sim_device_test_util.h"

namespace strata {
namespace {

using testing_sim::fill_pattern;
using testing_sim::Gate;
using testing_sim::small_device;

TEST(SimDevice, NameKindAndCapacity) {
  SimDeviceOptions o = small_device(10 * MiB + 100);
  o.ordinal = 3;
  auto device = make_sim_device(o);
  EXPECT_EQ(device->name(), "sim:3");
  EXPECT_EQ(device->kind(), DeviceKind::Sim);
  EXPECT_EQ(device->capacity_bytes(), 10 * MiB);  // rounded down to the alignment
  auto stream = device->create_stream("compute");
  EXPECT_EQ(stream->name(), "compute");
  EXPECT_EQ(&stream->device(), device.get());
  EXPECT_EQ(stream->native_handle(), nullptr);
}

TEST(SimDevice, BadOptionsAreConfigErrors) {
  SimDeviceOptions o = small_device();
  o.h2d_gbps = -1;
  EXPECT_THROW(make_sim_device(o), ConfigError);
  o = small_device();
  o.ordinal = -1;
  EXPECT_THROW(make_sim_device(o), ConfigError);
  o = small_device();
  o.alignment_bytes = 1000;
  EXPECT_THROW(make_sim_device(o), ConfigError);
}

TEST(SimDevice, AllocationIsAlignedTaggedAndZeroIsRejected) {
  auto device = make_sim_device(small_device());
  DeviceMemory a = device->allocate(1000, "param.full");
  EXPECT_EQ(a.size_bytes(), 1000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % 256, 0u);
  EXPECT_EQ(device->memory_stats().bytes_by_tag.at("param.full"), 1024u);
  EXPECT_THROW(device->allocate(0, "empty"), DeviceError);
  DeviceMemory moved = std::move(a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(device->memory_stats().live_allocations, 1u);
  moved.reset();
  EXPECT_EQ(device->memory_stats().live_allocations, 0u);
}

TEST(SimDevice, WorkOnOneStreamRunsInEnqueueOrder) {
  auto device = make_sim_device(small_device());
  auto stream = device->create_stream("s");
  DeviceMemory mem = device->allocate(4 * KiB, "t");
  auto* dev = mem.as<std::uint32_t>();
  std::vector<int> order;  // touched only by the stream's worker until synchronize
  std::vector<std::uint32_t> host(1024);
  std::vector<std::uint32_t> seen;
  for (int i = 0; i < 500; ++i) {
    launch_sim_kernel(*stream, [&order, i] { order.push_back(i); });
    if (i % 50 == 0) {
      std::fill(host.begin(), host.end(), 0u);
      host[7] = static_cast<std::uint32_t>(i);
      // host[] is rewritten below only after synchronize, so the copy's source stays valid.
      stream->copy_h2d(dev, host.data(), 4 * KiB);
      launch_sim_kernel(*stream, [&seen, dev] { seen.push_back(dev[7]); });
      stream->synchronize();
    }
  }
  stream->synchronize();
  ASSERT_EQ(order.size(), 500u);
  for (int i = 0; i < 500; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
  ASSERT_EQ(seen.size(), 10u);
  for (std::size_t k = 0; k < seen.size(); ++k) EXPECT_EQ(seen[k], 50 * k);
}

TEST(SimDevice, EventJoinsStreams) {
  auto device = make_sim_device(small_device());
  auto producer = device->create_stream("producer");
  auto consumer = device->create_stream("consumer");
  auto produced = device->create_event();
  auto consumed = device->create_event();
  Gate gate;
  std::atomic<int> value{0};
  std::atomic<int> observed{-1};
  launch_sim_kernel(*producer, [&] {
    gate.wait();
    value.store(42);
  });
  producer->record(*produced);
  consumer->wait(*produced);
  launch_sim_kernel(*consumer, [&] { observed.store(value.load()); });
  consumer->record(*consumed);

  // The consumer may not pass the wait while the producer is held at the gate. Giving it time to
  // misbehave makes a broken wait show; a correct one passes no matter how long this takes.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(observed.load(), -1);
  EXPECT_FALSE(consumed->query());
  EXPECT_FALSE(produced->query());
  gate.open();
  consumer->synchronize();
  EXPECT_EQ(observed.load(), 42);
  EXPECT_TRUE(consumed->query());
  produced->synchronize();
  EXPECT_TRUE(produced->query());
}

// Schedule chaos (Note [Schedule chaos] in core/device/schedule_chaos.h): with a seed, tasks start
// after random pauses, so stream order and events are what keeps results right. A chain of three
// streams joined by events, a copy round trip, and a kernel that checks what it reads, over many
// seeds; and the pauses are real (the same work takes longer than without them).
TEST(SimDevice, ScheduleChaosKeepsStreamOrderAndEvents) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    SimDeviceOptions o = small_device();
    o.chaos_seed = seed;
    o.chaos_max_us = 300;
    auto device = make_sim_device(o);
    auto a = device->create_stream("a"), b = device->create_stream("b"), c = device->create_stream("c");
    auto ab = device->create_event(), bc = device->create_event();
    DeviceMemory mem = device->allocate(4 * KiB, "t");
    auto* p = mem.as<unsigned char>();
    std::vector<unsigned char> host(4 * KiB, static_cast<unsigned char>(seed)), back(4 * KiB, 0);
    device->pin_host(host.data(), host.size());
    device->pin_host(back.data(), back.size());
    std::atomic<int> wrong{0};
    a->copy_h2d(p, host.data(), host.size());
    a->record(*ab);
    b->wait(*ab);
    launch_sim_kernel(*b, [&wrong, p, seed] {
      for (std::size_t i = 0; i < 4 * KiB; ++i) {
        if (p[i] != static_cast<unsigned char>(seed)) wrong.fetch_add(1);
        p[i] = static_cast<unsigned char>(p[i] + 1);
      }
    });
    b->record(*bc);
    c->wait(*bc);
    c->copy_d2h(back.data(), p, back.size());
    c->synchronize();
    EXPECT_EQ(wrong.load(), 0) << "seed " << seed;
    EXPECT_EQ(back[0], static_cast<unsigned char>(seed + 1)) << "seed " << seed;
    EXPECT_EQ(back[4 * KiB - 1], static_cast<unsigned char>(seed + 1)) << "seed " << seed;
    device->unpin_host(host.data());
    device->unpin_host(back.data());
  }
  // The pauses happen: 200 empty kernels with chaos up to 2 ms take longer than 50 ms (half the
  // tasks pause, 0.5 ms on average: ~100 ms expected), while the same without chaos take far less.
  SimDeviceOptions o = small_device();
  o.chaos_seed = 7;
  o.chaos_max_us = 2000;
  auto device = make_sim_device(o);
  auto s = device->create_stream("paused");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) launch_sim_kernel(*s, [] {});
  s->synchronize();
  EXPECT_GT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50));
}

TEST(SimDevice, WaitUsesTheRecordAtTheTimeOfTheWait) {
  auto device = make_sim_device(small_device());
  auto a = device->create_stream("a");
  auto b = device->create_stream("b");
  auto e = device->create_event();
  a->record(*e);
  a->synchronize();
  Gate gate;
  std::atomic<bool> b_ran{false};
  b->wait(*e);  // refers to the completed record: must not wait for the re-record below
  launch_sim_kernel(*b, [&] { b_ran.store(true); });
  launch_sim_kernel(*a, [&] { gate.wait(); });
  a->record(*e);
  b->synchronize();  // would hang if b waited for the second record
  EXPECT_TRUE(b_ran.load());
  EXPECT_FALSE(e->query());
  gate.open();
  e->synchronize();
  EXPECT_TRUE(e->query());
}

TEST(SimDevice, EventNeverRecordedThrows) {
  auto device = make_sim_device(small_device());
  auto stream = device->create_stream("s");
  auto never = device->create_event();
  auto done = device->create_event();
  EXPECT_THROW(stream->wait(*never), DeviceError);
  EXPECT_THROW(never->query(), DeviceError);
  EXPECT_THROW(never->synchronize(), DeviceError);
  stream->record(*done);
  stream->synchronize();
  EXPECT_THROW(done->elapsed_ms_since(*never), DeviceError);
  try {
    never->query();
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("never recorded"), std::string::npos) << e.what();
  }
  stream->synchronize();  // the failed wait left no error behind
}

TEST(SimDevice, ElapsedTimeBetweenEvents) {
  auto device = make_sim_device(small_device());
  auto stream = device->create_stream("s");
  auto start = device->create_event();
  auto end = device->create_event();
  stream->record(*start);
  launch_sim_kernel(*stream, [] { std::this_thread::sleep_for(std::chrono::milliseconds(15)); });
  stream->record(*end);
  stream->synchronize();
  // Lower bound only: the sleep lies between the two completions.
  EXPECT_GE(end->elapsed_ms_since(*start), 15.0);
  EXPECT_LE(start->elapsed_ms_since(*end), -15.0);
}

// Copies of 0, 1, odd and > 256 MiB bytes: h2d, then d2d, then d2h, compared byte for byte.
// Host sides are HostBuffers (fresh mmap pages): no initialization pass over 256 MiB, which
// matters under sanitizers.
TEST(SimDevice, CopiesOfAwkwardSizesAreExact) {
  auto device = make_sim_device(small_device(600 * MiB));
  auto stream = device->create_stream("copy");
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4097}, 256 * MiB + 4097}) {
    SCOPED_TRACE(bytes);
    HostBuffer src = HostBuffer::allocate(std::max<std::size_t>(bytes, 1));
    HostBuffer dst = HostBuffer::allocate(bytes + 1);  // one guard byte past the end
    fill_pattern(src.as<unsigned char>().first(bytes), bytes);
    dst.as<unsigned char>()[bytes] = 0xEE;
    if (bytes > 0) dst.as<unsigned char>()[0] = static_cast<unsigned char>(~src.as<unsigned char>()[0]);
    DeviceMemory a = device->allocate(std::max<std::size_t>(bytes, 1), "copy.a");
    DeviceMemory b = device->allocate(std::max<std::size_t>(bytes, 1), "copy.b");
    stream->copy_h2d(a.data(), src.data(), bytes);
    stream->copy_d2d(b.data(), a.data(), bytes);
    stream->copy_d2h(dst.data(), b.data(), bytes);
    stream->synchronize();
    EXPECT_EQ(std::memcmp(dst.data(), src.data(), bytes), 0);
    EXPECT_EQ(dst.as<unsigned char>()[bytes], 0xEE);
  }
  EXPECT_EQ(device->memory_stats().live_allocations, 0u);
}

TEST(SimDevice, MemsetFillsExactlyTheRange) {
  auto device = make_sim_device(small_device());
  auto stream = device->create_stream("s");
  DeviceMemory mem = device->allocate(10000, "t");
  std::vector<unsigned char> host(10000);
  stream->memset(mem.data(), 0x11, 10000);
  stream->memset(mem.as<unsigned char>() + 3, 0xAB, 4097);
  stream->memset(mem.data(), 0x77, 0);
  stream->copy_d2h(host.data(), mem.data(), 10000);
  stream->synchronize();
  for (std::size_t i = 0; i < host.size(); ++i) {
    const unsigned char expected = (i >= 3 && i < 3 + 4097) ? 0xAB : 0x11;
    ASSERT_EQ(host[i], expected) << "offset " << i;
  }
}

TEST(SimDevice, CopiesOutsideTheArenaAreRejected) {
  auto device = make_sim_device(small_device());
  auto stream = device->create_stream("s");
  DeviceMemory mem = device->allocate(4096, "t");
  std::vector<unsigned char> host(8192);
  EXPECT_THROW(stream->copy_h2d(host.data(), host.data() + 4096, 16), InternalError);  // dst is host memory
  EXPECT_THROW(stream->copy_d2h(host.data(), host.data(), 16), InternalError);
  EXPECT_THROW(stream->copy_d2d(mem.data(), host.data(), 16), InternalError);
  EXPECT_THROW(stream->memset(host.data(), 0, 16), InternalError);
  EXPECT_THROW(stream->copy_h2d(mem.data(), nullptr, 16), InternalError);
  const std::size_t past_end = device->capacity_bytes();  // the arena ends right after mem + rest
  EXPECT_THROW(stream->copy_h2d(mem.as<unsigned char>() + past_end - 8, host.data(), 16), InternalError);
  stream->synchronize();  // rejected at enqueue: the stream has no error
}

TEST(SimDevice, AllocationPastCapacityFailsWithReportAndDeviceStaysUsable) {
  auto device = make_sim_device(small_device(4 * MiB));
  DeviceMemory a = device->allocate(3 * MiB, "activations");
  try {
    DeviceMemory b = device->allocate(2 * MiB, "param.full");
    FAIL() << "allocation past the cap succeeded";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(format_memory_report("sim:0", device->memory_stats()), 0), 0u) << msg;
    EXPECT_NE(msg.find("activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'param.full'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("2097152 bytes"), std::string::npos) << msg;
  }
  EXPECT_EQ(device->memory_stats().failed_allocations, 1u);
  DeviceMemory c = device->allocate(1 * MiB, "param.full");  // what is left still works
  auto stream = device->create_stream("s");
  std::vector<unsigned char> src(1 * MiB, 0x3C), dst(1 * MiB, 0);
  stream->copy_h2d(c.data(), src.data(), src.size());
  stream->copy_d2h(dst.data(), c.data(), dst.size());
  stream->synchronize();
  EXPECT_EQ(dst, src);
}

TEST(SimDevice, LargeCapacityCostsNothingUntilUsed) {
  auto device = make_sim_device(small_device(64 * GiB));
  EXPECT_EQ(device->capacity_bytes(), 64 * GiB);
  DeviceMemory m = device->allocate(32 * GiB, "huge");
  EXPECT_EQ(device->memory_stats().allocated_bytes, 32 * GiB);
}

TEST(SimDevice, StickyErrorFromHostFunction) {
  auto device = make_sim_device(small_device());
  auto failing = device->create_stream("failing");
  auto other = device->create_stream("other");
  auto after = device->create_event();
  std::atomic<bool> later_work_ran{false};
  Gate gate;  // holds the failure back until everything below is enqueued
  launch_sim_kernel(*failing, [&] {
    gate.wait();
    throw std::runtime_error("kernel exploded");
  });
  launch_sim_kernel(*failing, [&] { later_work_ran.store(true); });
  failing->record(*after);  // control work still runs, so waiters on other streams never hang
  other->wait(*after);
  gate.open();
  other->synchronize();
  for (int attempt = 0; attempt < 2; ++attempt) {  // sticky: reported again, not once
    try {
      failing->synchronize();
      FAIL() << "synchronize did not report the error";
    } catch (const DeviceError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("kernel exploded"), std::string::npos) << msg;
      EXPECT_NE(msg.find("failing"), std::string::npos) << msg;
    }
  }
  EXPECT_FALSE(later_work_ran.load());
  EXPECT_THROW(launch_sim_kernel(*failing, [] {}), DeviceError);
  EXPECT_THROW(failing->copy_h2d(nullptr, nullptr, 0), DeviceError);
  launch_sim_kernel(*other, [] {});
  other->synchronize();  // errors belong to their stream
}

TEST(SimDevice, ReleaseAfterFreesOnlyOncePriorWorkRan) {
  auto device = make_sim_device(small_device());
  auto stream = device->create_stream("s");
  DeviceMemory mem = device->allocate(1 * MiB, "scratch");
  auto* p = mem.as<unsigned char>();
  Gate gate;
  std::atomic<int> wrong{0};
  launch_sim_kernel(*stream, [&gate, &wrong, p] {
    gate.wait();
    std::memset(p, 0x42, 1 * MiB);
    // Nobody else may have been handed this memory while the stream still used it.
    for (std::size_t i = 0; i < 1 * MiB; i += 4096) {
      if (p[i] != 0x42) wrong.fetch_add(1);
    }
  });
  stream->release_after(std::move(mem));
  EXPECT_TRUE(mem.empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a premature free would show now
  EXPECT_EQ(device->memory_stats().live_allocations, 1u);
  gate.open();
  stream->synchronize();
  EXPECT_EQ(device->memory_stats().live_allocations, 0u);
  EXPECT_EQ(wrong.load(), 0);
}

// As cudaMemcpyAsync after cudaFreeAsync (Note [Released memory] in core/device/sim_allocator.h),
// a copy issued after release_after is refused, though the free itself has not run yet; a copy
// that runs off the end of an allocation or names freed memory is refused too.
TEST(SimDevice, ACopyIssuedAfterReleaseAfterIsRefused) {
  auto device = make_sim_device(small_device());
  auto stream = device->create_stream("s");
  auto copier = device->create_stream("copier");
  DeviceMemory mem = device->allocate(64 * KiB, "released");
  DeviceMemory keep = device->allocate(64 * KiB, "kept");
  const void* p = mem.data();
  std::vector<unsigned char> host(128 * KiB);
  device->pin_host(host.data(), host.size());  // so the copies below queue behind the gate (Note [Pageable copies] in core/device/sim_stream.cc)
  Gate gate;
  launch_sim_kernel(*copier, [&gate] { gate.wait(); });  // holds the copier back
  std::unique_ptr<Event> opened(device->create_event());
  copier->record(*opened);
  stream->wait(*opened);  // and holds `stream` back through an event, so the free cannot run yet
  stream->release_after(std::move(mem));
  try {
    copier->copy_d2h(host.data(), p, 64 * KiB);
    ADD_FAILURE() << "a copy of released memory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("released with release_after"), std::string::npos) << e.what();
  }
  EXPECT_THROW(copier->copy_d2h(host.data(), keep.data(), 64 * KiB + 1), Error);  // past its end
  copier->copy_d2h(host.data(), keep.data(), 64 * KiB);                           // still fine
  gate.open();
  copier->synchronize();
  stream->synchronize();
  EXPECT_THROW(copier->copy_d2h(host.data(), p, 16), Error);  // freed now
  device->unpin_host(host.data());
}

TEST(SimDevice, UseAfterDeviceIsDestroyedThrows) {
  auto device = make_sim_device(small_device());
  auto stream = device->create_stream("late");
  auto event = device->create_event();
  DeviceMemory mem = device->allocate(4096, "t");
  stream->record(*event);
  stream->synchronize();
  void* p = mem.data();
  device.reset();

  try {
    launch_sim_kernel(*stream, [] {});
    FAIL() << "enqueue after the device was destroyed succeeded";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("device sim:0 was destroyed"), std::string::npos) << e.what();
  }
  std::vector<unsigned char> host(16);
  EXPECT_THROW(stream->copy_h2d(p, host.data(), 16), DeviceError);
  EXPECT_THROW(stream->synchronize(), DeviceError);
  EXPECT_THROW(stream->device(), DeviceError);
  EXPECT_THROW(stream->record(*event), DeviceError);
  EXPECT_THROW(event->query(), DeviceError);
  EXPECT_THROW(event->synchronize(), DeviceError);
  EXPECT_EQ(stream->name(), "late");
  mem.reset();  // harmless no-ops from here on
  stream.reset();
  event.reset();
}

TEST(SimDevice, WorkQueuedWhenTheDeviceDiesFailsInsteadOfTouchingFreedMemory) {
  auto device = make_sim_device(small_device());
  auto stream = device->create_stream("orphan");
  DeviceMemory mem = device->allocate(1 * MiB, "t");
  std::vector<unsigned char> host(1 * MiB, 1);
  device->pin_host(host.data(), host.size());  // so the copy queues behind the gate (Note [Pageable copies] in core/device/sim_stream.cc)
  Gate gate;
  std::atomic<bool> later_work_ran{false};
  launch_sim_kernel(*stream, [&] { gate.wait(); });
  stream->copy_h2d(mem.data(), host.data(), host.size());
  launch_sim_kernel(*stream, [&] { later_work_ran.store(true); });
  mem.reset();
  device.reset();
  gate.open();
  stream.reset();  // drains: the copy fails (device gone), later work is skipped, the worker is joined
  EXPECT_FALSE(later_work_ran.load());
}

}  // namespace
}  // namespace strata
