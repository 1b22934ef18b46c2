// The host-driven contract on a cuda device (Note [Host-driven offload] in docs/DESIGN.md): host
// threads wait on events, do host work and enqueue the next copies; no stream waits for a host
// thread. These are the offload pipeline's patterns, each of which must finish with the right
// bytes: host work between copies ordered by an event, a pageable copy behind queued work, a
// second thread that waits on another stream's event, copies, and frees the device memory itself,
// pinning while streams work, and two threads enqueueing on one stream; and the tracing device's
// event-timed slices. Labelled `gpu` (tests/core/CMakeLists.txt): every test skips, saying why,
// where no cuda device is usable. A deadlock shows as ctest's timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/device/device.h"
#include "core/device/traced_device.h"
#include "core/error.h"
#include "core/host_buffer.h"
#include "tests/core/cuda_test_util.h"

namespace strata {
namespace {

using CudaHostDriven = strata::testing::CudaDeviceTest;

HostBuffer pinned(Device& device, std::size_t bytes) {
  HostBufferOptions o;
  o.pinner = &device;
  return HostBuffer::allocate(bytes, o);
}

// d2h copy -> event -> the host waits, reads what was copied and writes a host buffer -> h2d copy of
// what it wrote -> d2h back.
TEST_F(CudaHostDriven, HostWorkBetweenCopiesIsOrderedByEvents) {
  constexpr std::size_t n = 1 << 20;
  auto stream = device_->create_stream("order");
  auto copied = device_->create_event();
  HostBuffer src_b = pinned(*device_, n * sizeof(int)), seen_b = pinned(*device_, n * sizeof(int)),
             written_b = pinned(*device_, n * sizeof(int)), back_b = pinned(*device_, n * sizeof(int));
  int* src = static_cast<int*>(src_b.data());
  int* seen = static_cast<int*>(seen_b.data());
  int* written = static_cast<int*>(written_b.data());
  int* back = static_cast<int*>(back_b.data());
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<int>(i);
  DeviceMemory a = device_->allocate(n * sizeof(int), "test.a");
  DeviceMemory b = device_->allocate(n * sizeof(int), "test.b");
  for (int round = 0; round < 20; ++round) {
    stream->copy_h2d(a.data(), src, n * sizeof(int));
    stream->copy_d2h(seen, a.data(), n * sizeof(int));
    stream->record(*copied);
    copied->synchronize();
    for (std::size_t i = 0; i < n; ++i) written[i] = seen[i] * 2 + round;
    stream->copy_h2d(b.data(), written, n * sizeof(int));
    stream->copy_d2h(back, b.data(), n * sizeof(int));
    stream->synchronize();
    for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(back[i], static_cast<int>(i) * 2 + round) << "round " << round;
  }
}

// A copy to pageable memory (the driver may wait for the stream inside cudaMemcpyAsync) behind
// queued work finishes with the device's bytes, and is counted.
TEST_F(CudaHostDriven, APageableCopyBehindQueuedWorkFinishes) {
  constexpr std::size_t bytes = 64 << 20;
  auto stream = device_->create_stream("pageable");
  DeviceMemory d = device_->allocate(bytes, "test.d");
  for (int i = 0; i < 8; ++i) stream->memset(d.data(), 0x40 + i, bytes);
  std::vector<unsigned char> pageable(bytes, 0);
  const std::uint64_t before = device_->memory_stats().pageable_copies;
  stream->copy_d2h(pageable.data(), d.data(), bytes);
  stream->synchronize();
  EXPECT_EQ(pageable[0], 0x47);
  EXPECT_EQ(pageable[bytes - 1], 0x47);
  EXPECT_EQ(device_->memory_stats().pageable_copies, before + 1);
}

// The offload pipeline's pattern: the main thread reduces into device memory on a "comm" stream and
// records an event; a host thread waits on it, copies down on a transfer stream into pinned
// staging, waits, checks the bytes and frees the device memory itself, while the main thread goes
// on enqueueing. Every buffer is freed only after its last copy completed (Note [Released memory] in
// core/device/sim_allocator.h).
TEST_F(CudaHostDriven, AHostThreadWaitsOnEventsCopiesAndFrees) {
  constexpr std::size_t bytes = 4 << 20;
  constexpr int kUnits = 64;
  auto comm = device_->create_stream("comm");
  auto transfer = device_->create_stream("transfer");
  HostBuffer staging = pinned(*device_, bytes);
  std::atomic<int> wrong{0}, done{0};
  struct Unit {
    std::shared_ptr<DeviceMemory> memory;
    std::shared_ptr<Event> reduced;
    int value;
  };
  std::vector<Unit> units;
  for (int u = 0; u < kUnits; ++u) {
    auto mem = std::make_shared<DeviceMemory>(device_->allocate(bytes, "test.reduced"));
    comm->memset(mem->data(), u & 0xff, bytes);
    std::shared_ptr<Event> ev = device_->create_event();
    comm->record(*ev);
    units.push_back(Unit{std::move(mem), std::move(ev), u & 0xff});
  }
  std::thread host([&] {
    for (Unit& u : units) {
      u.reduced->synchronize();
      transfer->copy_d2h(staging.data(), u.memory->data(), bytes);
      transfer->synchronize();
      const auto* p = static_cast<const unsigned char*>(staging.data());
      if (p[0] != u.value || p[bytes - 1] != u.value) wrong.fetch_add(1);
      u.memory->reset();
      done.fetch_add(1);
    }
  });
  DeviceMemory busy = device_->allocate(bytes, "test.busy");
  for (int i = 0; i < 200; ++i) comm->memset(busy.data(), i & 0xff, bytes);  // the main thread goes on
  host.join();
  comm->synchronize();
  EXPECT_EQ(done.load(), kUnits);
  EXPECT_EQ(wrong.load(), 0);
}

// Page-locking while streams work (Note [Pinning while streams run] in core/device/sim_device.cc) may stall them, but
// never hangs: no stream waits for the pinning thread.
TEST_F(CudaHostDriven, PinningWhileStreamsWorkFinishes) {
  constexpr std::size_t bytes = 64 << 20;
  auto stream = device_->create_stream("busy");
  DeviceMemory d = device_->allocate(bytes, "test.busy");
  for (int i = 0; i < 50; ++i) stream->memset(d.data(), i, bytes);
  for (int i = 0; i < 4; ++i) {
    HostBuffer b = pinned(*device_, 8 << 20);
    stream->copy_d2h(b.data(), d.data(), 8 << 20);
    stream->synchronize();
  }
  EXPECT_EQ(device_->memory_stats().pinned_host_bytes, 0u);
}

// Two threads enqueue on one stream: every copy runs once, and the stream finishes.
TEST_F(CudaHostDriven, ConcurrentEnqueuesOnOneStreamFinish) {
  auto stream = device_->create_stream("shared");
  DeviceMemory d = device_->allocate(1 << 20, "test.shared");
  HostBuffer h = pinned(*device_, 1 << 20);
  auto enqueue = [&] {
    for (int i = 0; i < 500; ++i) stream->copy_d2h(h.data(), d.data(), 4096);
  };
  std::thread other(enqueue);
  enqueue();
  other.join();
  stream->synchronize();
  SUCCEED();
}

// The tracing device times copies on cuda with events (core/device/traced_device.h): every slice
// has its stream, a begin before its end, and lies inside the test's own time.
TEST_F(CudaHostDriven, TracedCopiesAreTimedByEvents) {
  auto recorder = std::make_shared<TraceRecorder>();
  auto traced = make_traced_device(*device_, recorder);
  auto stream = traced->create_stream("traced");
  DeviceMemory d = traced->allocate(16 << 20, "test.traced");
  HostBuffer h = pinned(*device_, 16 << 20);
  const double start = recorder->now_us();
  for (int i = 0; i < 10; ++i) {
    stream->memset(d.data(), i, 16 << 20);
    stream->copy_d2h(h.data(), d.data(), 16 << 20);
  }
  stream->synchronize();
  const double end = recorder->now_us();
  const std::vector<TraceSlice> slices = recorder->slices();
  ASSERT_EQ(slices.size(), 20u);
  for (const TraceSlice& s : slices) {
    EXPECT_EQ(s.stream, "traced");
    EXPECT_LE(s.begin_us, s.end_us) << s.op;
    EXPECT_GE(s.begin_us, start - 1000) << s.op;  // the origin's host time is taken just after its event
    EXPECT_LE(s.end_us, end + 1000) << s.op;
  }
}

}  // namespace
}  // namespace strata
