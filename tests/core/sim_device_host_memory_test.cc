// Tests of the sim device's host-memory rules (core/device/sim_device.cc, sim_stream.cc): the pinned registry, Note
// [Pageable copies] (a copy of pageable memory blocks its caller, reports only its own failure, and
// is refused inside a sim kernel), Note [Sim kernels] in core/device/sim_kernel.h (no page-locking and no waits inside
// a kernel), and Note [Pinning while streams run] in core/device/sim_device.cc (pins are counted).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
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

using testing_sim::Gate;
using testing_sim::HangWatchdog;
using testing_sim::small_device;

TEST(SimDevice, PinnedHostRegistry) {
  auto device = make_sim_device(small_device());
  std::vector<unsigned char> a(5000), b(3000);
  device->pin_host(a.data(), a.size());
  device->pin_host(b.data(), b.size());
  EXPECT_EQ(device->memory_stats().pinned_host_bytes, 8000u);
  EXPECT_THROW(device->pin_host(a.data(), a.size()), DeviceError);  // already pinned
  EXPECT_THROW(device->pin_host(nullptr, 10), DeviceError);
  int unknown = 0;
  device->unpin_host(&unknown);  // ignored
  device->unpin_host(a.data());
  EXPECT_EQ(device->memory_stats().pinned_host_bytes, 3000u);
  device->unpin_host(b.data());
  EXPECT_EQ(device->memory_stats().pinned_host_bytes, 0u);

  HostBufferOptions options;
  options.pinner = device.get();
  {
    HostBuffer buffer = HostBuffer::allocate(64 * KiB, options);
    EXPECT_TRUE(buffer.pinned());
    EXPECT_EQ(device->memory_stats().pinned_host_bytes, 64 * KiB);
  }
  EXPECT_EQ(device->memory_stats().pinned_host_bytes, 0u);
}

// Waits (up to 10 s) until the device has counted `n` pageable copies: a pageable copy is counted
// once queued, before it blocks its caller.
void wait_until_pageable_copies(Device& device, std::uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (device.memory_stats().pageable_copies < n) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the pageable copy was never queued";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// See Note [Pageable copies] in core/device/sim_stream.cc.
// A copy to or from host memory that is not pinned returns only once it
// has run (as CUDA's), so it waits for the stream's earlier work; a pinned one (or any range inside
// a pinned buffer) is queued and returns at once.
TEST(SimDevice, PageableCopiesBlockTheCallerPinnedOnesDoNot) {
  auto device = make_sim_device(small_device());
  auto stream = device->create_stream("s");
  DeviceMemory mem = device->allocate(64 * KiB, "t");
  stream->memset(mem.data(), 0x5a, 64 * KiB);
  HostBufferOptions options;
  options.pinner = device.get();
  HostBuffer pinned = HostBuffer::allocate(64 * KiB, options);
  ASSERT_TRUE(pinned.pinned());
  std::vector<unsigned char> pageable(64 * KiB);
  auto* pin = static_cast<unsigned char*>(pinned.data());

  Gate gate;
  launch_sim_kernel(*stream, [&gate] { gate.wait(); });  // holds the stream until the gate opens
  // Queued copies into the pinned buffer (whole and a range inside it) return while it is held.
  // Were they synchronous, the wait below times out and the gate is opened so nothing hangs.
  auto queued = std::async(std::launch::async, [&] {
    stream->copy_d2h(pin, mem.data(), 64 * KiB);
    stream->copy_h2d(mem.data(), pin + 1024, 4 * KiB);
  });
  if (queued.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    gate.open();
    queued.get();
    FAIL() << "a copy to pinned memory blocked the caller";
  }
  queued.get();
  EXPECT_EQ(device->memory_stats().pageable_copies, 0u);
  std::atomic<bool> returned{false};
  auto blocking = std::async(std::launch::async, [&] {
    stream->copy_d2h(pageable.data(), mem.data(), 64 * KiB);
    returned.store(true);
  });
  // The copy is counted once queued; from then a broken (asynchronous) copy returns at once, a
  // correct one cannot before the gate opens. Waiting for the count first means a thread slow to
  // start on a loaded machine cannot make the check below pass by luck.
  wait_until_pageable_copies(*device, 1);
  EXPECT_EQ(blocking.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  EXPECT_FALSE(returned.load());
  gate.open();
  blocking.get();
  // Returned means done: the bytes are there without a synchronize.
  EXPECT_EQ(pageable[0], 0x5a);
  EXPECT_EQ(pageable[64 * KiB - 1], 0x5a);
  EXPECT_EQ(device->memory_stats().pageable_copies, 1u);  // counted (MemoryStats)
  EXPECT_EQ(device->memory_stats().pageable_copy_bytes, 64 * KiB);
  stream->synchronize();
  EXPECT_EQ(pin[0], 0x5a);

  // A range that runs past the end of a pinned range is not pinned: it blocks too.
  std::vector<unsigned char> half_pinned(128 * KiB);
  device->pin_host(half_pinned.data(), 64 * KiB);
  Gate second;
  launch_sim_kernel(*stream, [&second] { second.wait(); });
  auto outside = std::async(std::launch::async,
                            [&] { stream->copy_h2d(mem.data(), half_pinned.data() + 60 * KiB, 8 * KiB); });
  wait_until_pageable_copies(*device, 2);
  EXPECT_EQ(outside.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  second.open();
  outside.get();
  stream->synchronize();
  EXPECT_EQ(device->memory_stats().pageable_copies, 2u);
  device->unpin_host(half_pinned.data());
}

// A blocking copy reports its own failure, not that of work queued after it by another thread: its
// data arrived. The later failure stays sticky for the stream's next call. (Before the failing task's
// ticket was recorded, the copy's caller usually woke after the later task had failed and threw.)
TEST(SimDevice, APageableCopyDoesNotReportTheFailureOfLaterWork) {
  auto device = make_sim_device(small_device());
  DeviceMemory mem = device->allocate(4 * KiB, "t");
  std::vector<unsigned char> pageable(4 * KiB);
  for (int round = 0; round < 20; ++round) {
    auto stream = device->create_stream("s");
    stream->memset(mem.data(), round, 4 * KiB);
    Gate gate;
    launch_sim_kernel(*stream, [&gate] { gate.wait(); });
    auto copy = std::async(std::launch::async, [&] { stream->copy_d2h(pageable.data(), mem.data(), 4 * KiB); });
    wait_until_pageable_copies(*device, static_cast<std::uint64_t>(round) + 1);
    launch_sim_kernel(*stream, [] { throw std::runtime_error("later work failed"); });
    gate.open();
    EXPECT_NO_THROW(copy.get()) << "round " << round;
    EXPECT_EQ(pageable[4 * KiB - 1], round);
    EXPECT_THROW(stream->synchronize(), DeviceError);
  }
  // A copy queued after a failure was skipped: it reports that failure.
  auto stream = device->create_stream("failed");
  launch_sim_kernel(*stream, [] { throw std::runtime_error("earlier work failed"); });
  EXPECT_THROW(stream->copy_d2h(pageable.data(), mem.data(), 4 * KiB), DeviceError);
}

// See Note [Sim kernels] in core/device/sim_kernel.h: a pageable copy blocks its caller (Note
// [Pageable copies]); from inside a kernel, on its own stream or another, it would make the device
// wait: refused, naming the stream.
TEST(SimDevice, APageableCopyInsideASimKernelIsRefused) {
  auto device = make_sim_device(small_device());
  auto stream = device->create_stream("worker");
  auto other = device->create_stream("other");
  DeviceMemory mem = device->allocate(4 * KiB, "t");
  std::vector<unsigned char> pageable(4 * KiB);
  // Were the rule broken, the first copy would wait for itself: fail by name instead of hanging.
  HangWatchdog watchdog("SimDevice.APageableCopyInsideASimKernelIsRefused: a pageable copy from a kernel of its own "
                        "stream waited for itself");
  for (Stream* target : {stream.get(), other.get()}) {
    launch_sim_kernel(*stream, [&, target] { target->copy_d2h(pageable.data(), mem.data(), 4 * KiB); });
    try {
      stream->synchronize();
      FAIL() << "a pageable copy inside a kernel was accepted (on '" << target->name() << "')";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("Pageable copies"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("inside a sim kernel"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(target->name()), std::string::npos) << e.what();
    }
    stream = device->create_stream("worker");  // the failed one stays failed
  }
}

// Page-locking may wait for the device (Note [Pinning while streams run] in core/device/sim_device.cc): inside a kernel
// it is refused. Unpinning there is allowed.
TEST(SimDevice, PinningInsideASimKernelIsRefused) {
  auto device = make_sim_device(small_device());
  auto stream = device->create_stream("worker");
  std::vector<unsigned char> a(4 * KiB), b(4 * KiB);
  device->pin_host(b.data(), b.size());
  launch_sim_kernel(*stream, [&] { device->unpin_host(b.data()); });
  stream->synchronize();
  EXPECT_EQ(device->memory_stats().pinned_host_bytes, 0u);
  launch_sim_kernel(*stream, [&] { device->pin_host(a.data(), a.size()); });
  try {
    stream->synchronize();
    FAIL() << "pin_host inside a kernel was accepted";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("pin_host inside a sim kernel"), std::string::npos) << e.what();
  }
  EXPECT_EQ(device->memory_stats().pinned_host_bytes, 0u);
  device->pin_host(a.data(), a.size());  // from the host thread: fine
  EXPECT_EQ(device->memory_stats().pinned_host_bytes, 4 * KiB);
  device->unpin_host(a.data());
}

// See Note [Sim kernels] in core/device/sim_kernel.h: the device never waits for the host. A
// kernel that waits on an event or a stream is refused (a GPU kernel cannot; a stream waiting for a
// host thread can hang the GPU), so engine code that makes a stream wait for host work fails on CI.
TEST(SimDevice, ASimKernelMayNotWaitOnEventsOrStreams) {
  auto device = make_sim_device(small_device());
  auto stream = device->create_stream("kernel");
  auto other = device->create_stream("other");
  auto event = device->create_event();
  other->record(*event);
  other->synchronize();
  HangWatchdog watchdog("SimDevice.ASimKernelMayNotWaitOnEventsOrStreams: a wait inside a kernel hung");
  const std::vector<std::pair<std::string, std::function<void()>>> waits = {
      {"Event::synchronize", [&] { event->synchronize(); }},
      {"Stream::synchronize of stream 'other'", [&] { other->synchronize(); }},
      {"Stream::synchronize of stream 'kernel'", [&] { stream->synchronize(); }},
  };
  for (const auto& [what, wait] : waits) {
    auto s = device->create_stream("kernel");
    launch_sim_kernel(*s, wait);
    try {
      s->synchronize();
      FAIL() << what << " inside a kernel was accepted";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find(what + " inside a sim kernel"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(event->query());  // a query does not wait: allowed
}

TEST(SimDevice, HostPinsAreCounted) {
  auto device = make_sim_device(small_device());
  std::vector<unsigned char> x(4 * KiB), y(4 * KiB);
  EXPECT_EQ(device->memory_stats().host_pins, 0u);
  device->pin_host(x.data(), x.size());
  EXPECT_EQ(device->memory_stats().host_pins, 1u);
  EXPECT_THROW(device->pin_host(x.data(), x.size()), DeviceError);  // already pinned
  device->pin_host(y.data(), y.size());
  device->unpin_host(x.data());
  device->unpin_host(y.data());
  EXPECT_EQ(device->memory_stats().host_pins, 2u);
}

}  // namespace
}  // namespace strata
