// Host functions on a cuda stream (Note [Host functions on cuda], core/device/cuda_device_cuda.cc):
// they run in stream order, may call CUDA (copy and synchronize on another stream; pinning there is
// refused and unpinning deferred), turn an exception into the stream's sticky error, a copy to
// pageable memory behind one finishes, and a stream destroyed with
// host functions still queued runs them first; a pageable copy from a host function of its own
// stream is refused. Labelled `gpu` (tests/core/CMakeLists.txt): every
// test skips, saying why, where no cuda device is usable. A deadlock shows as ctest's timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/device/device.h"
#include "core/error.h"
#include "core/host_buffer.h"
#include "tests/core/cuda_test_util.h"

namespace strata {
namespace {

using CudaStreamHost = strata::testing::CudaDeviceTest;

// d2h copy -> host function reading what it copied and writing a host buffer -> h2d copy of what it
// wrote -> d2h back: the stream orders the host function between its copies. Pinned host memory:
// a copy from pageable memory may read it when enqueued (cudaMemcpyAsync stages it), not in order.
TEST_F(CudaStreamHost, HostFunctionsRunInStreamOrderBetweenCopies) {
  constexpr std::size_t n = 1 << 20;
  auto stream = device_->create_stream("order");
  HostBufferOptions o;
  o.pinner = device_.get();
  HostBuffer src_b = HostBuffer::allocate(n * sizeof(int), o), seen_b = HostBuffer::allocate(n * sizeof(int), o),
             written_b = HostBuffer::allocate(n * sizeof(int), o), back_b = HostBuffer::allocate(n * sizeof(int), o);
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
    stream->launch_host([=] {
      for (std::size_t i = 0; i < n; ++i) written[i] = seen[i] * 2 + round;
    });
    stream->copy_h2d(b.data(), written, n * sizeof(int));
    stream->copy_d2h(back, b.data(), n * sizeof(int));
    stream->synchronize();
    for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(back[i], static_cast<int>(i) * 2 + round) << "round " << round;
  }
}

// A copy to pageable memory (the driver waits for the stream inside cudaMemcpyAsync) queued behind a
// host function still working: it must finish, with the device's bytes.
TEST_F(CudaStreamHost, APageableCopyBehindAHostFunctionFinishes) {
  constexpr std::size_t n = 1 << 20;
  auto stream = device_->create_stream("pageable");
  DeviceMemory a = device_->allocate(n * sizeof(int), "test.a");
  std::vector<int> src(n), back(n, -1);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<int>(i) * 3;
  stream->copy_h2d(a.data(), src.data(), n * sizeof(int));
  std::atomic<bool> ran{false};
  stream->launch_host([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ran = true;
  });
  stream->copy_d2h(back.data(), a.data(), n * sizeof(int));
  stream->synchronize();
  EXPECT_TRUE(ran.load());
  for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(back[i], static_cast<int>(i) * 3);
}

// From a host function of its own stream a pageable copy would wait for the function issuing it:
// refused, as on sim (Note [Pageable copies]); the stream's error names the rule. A pinned copy
// there is only queued behind the function and is fine.
TEST_F(CudaStreamHost, APageableCopyFromAHostFunctionOfItsOwnStreamIsRefused) {
  auto stream = device_->create_stream("self");
  constexpr std::size_t bytes = 64 << 10;
  DeviceMemory d = device_->allocate(bytes, "test.d");
  stream->memset(d.data(), 0x33, bytes);
  HostBufferOptions o;
  o.pinner = device_.get();
  HostBuffer pinned = HostBuffer::allocate(bytes, o);
  Stream* self = stream.get();
  stream->launch_host([&] { self->copy_d2h(pinned.data(), d.data(), bytes); });
  stream->synchronize();
  EXPECT_EQ(static_cast<const unsigned char*>(pinned.data())[bytes - 1], 0x33);
  const std::uint64_t before = device_->memory_stats().pageable_copies;
  std::vector<unsigned char> pageable(bytes);
  stream->launch_host([&] { self->copy_d2h(pageable.data(), d.data(), bytes); });
  try {
    stream->synchronize();
    FAIL() << "the self-waiting copy was accepted";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("Pageable copies"), std::string::npos) << e.what();
  }
  EXPECT_EQ(device_->memory_stats().pageable_copies, before);  // refused copies are not counted
}

// The offload worker's pattern: inside a host function, copy on a second stream into memory pinned
// beforehand, and wait for it. Must finish (no deadlock) and give the right bytes.
TEST_F(CudaStreamHost, HostFunctionsMayCopyOnAnotherStreamAndWaitForIt) {
  auto worker = device_->create_stream("worker");
  auto transfer = device_->create_stream("transfer");
  constexpr std::size_t bytes = 4 << 20;
  DeviceMemory d = device_->allocate(bytes, "test.d");
  transfer->memset(d.data(), 0x5a, bytes);
  transfer->synchronize();
  HostBufferOptions o;
  o.pinner = device_.get();
  HostBuffer pinned = HostBuffer::allocate(bytes, o);
  std::atomic<int> done{0};
  for (int i = 0; i < 8; ++i) {
    worker->launch_host([&] {
      std::memset(pinned.data(), 0, bytes);
      transfer->copy_d2h(pinned.data(), d.data(), bytes);
      transfer->synchronize();
      const auto* p = static_cast<const unsigned char*>(pinned.data());
      if (p[0] != 0x5a || p[bytes - 1] != 0x5a) throw std::runtime_error("wrong bytes");
      done.fetch_add(1);
    });
  }
  worker->synchronize();
  EXPECT_EQ(done.load(), 8);
}

// Memory released behind a host function stays valid until the function ran: the offload worker
// reads a reduced gradient in a host function and releases it right after enqueueing it (Note
// [Released memory]: with cudaFreeAsync called at once, the function's copy failed on an H100).
TEST_F(CudaStreamHost, MemoryReleasedAfterAHostFunctionOutlivesIt) {
  auto worker = device_->create_stream("worker");
  auto transfer = device_->create_stream("transfer");
  constexpr std::size_t bytes = 1 << 20;
  std::atomic<int> good{0};
  for (int i = 0; i < 8; ++i) {
    DeviceMemory d = device_->allocate(bytes, "test.released");
    transfer->memset(d.data(), 0x30 + i, bytes);
    transfer->synchronize();
    const void* src = d.data();
    worker->launch_host([&, src, i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let the free run first, if it can
      std::vector<unsigned char> back(bytes);
      transfer->copy_d2h(back.data(), src, bytes);
      transfer->synchronize();
      if (back[0] == 0x30 + i && back[bytes - 1] == 0x30 + i) good.fetch_add(1);
    });
    worker->release_after(std::move(d));
  }
  worker->synchronize();
  EXPECT_EQ(good.load(), 8);
  EXPECT_EQ(device_->memory_stats().live_allocations, 0u);
}

// cudaHostRegister/cudaHostUnregister inside a host function never returned on an H200 (Note [Host
// functions on cuda]): pinning there is refused with a message, and unpinning is deferred, so the
// stream still finishes and the pages are unregistered by the next pin.
TEST_F(CudaStreamHost, PinningInsideAHostFunctionIsRefusedAndUnpinningIsDeferred) {
  const std::size_t pinned_before = device_->memory_stats().pinned_host_bytes;
  HostBufferOptions o;
  o.pinner = device_.get();
  auto unpinner = device_->create_stream("unpins");
  auto held = std::make_shared<HostBuffer>(HostBuffer::allocate(1 << 20, o));
  // The host function holds the only reference: ~HostBuffer unpins on the stream's thread.
  unpinner->launch_host([held = std::move(held)]() mutable { held.reset(); });
  unpinner->synchronize();
  EXPECT_EQ(device_->memory_stats().pinned_host_bytes, pinned_before);
  HostBuffer again = HostBuffer::allocate(1 << 20, o);  // flushes the deferred unregistration first
  EXPECT_TRUE(again.pinned());

  auto pinner = device_->create_stream("pins");
  pinner->launch_host([&] { HostBuffer b = HostBuffer::allocate(1 << 20, o); });
  try {
    pinner->synchronize();
    FAIL() << "page-locking inside a host function was not refused";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("pin_host inside a host function"), std::string::npos) << e.what();
  }
}

TEST_F(CudaStreamHost, AnExceptionIsTheStreamsStickyErrorAndLaterHostFunctionsAreSkipped) {
  auto stream = device_->create_stream("fails");
  std::atomic<bool> later_ran{false};
  stream->launch_host([] { throw std::runtime_error("host function failed on purpose"); });
  stream->launch_host([&] { later_ran = true; });
  try {
    stream->synchronize();
    FAIL() << "synchronize did not report the failed host function";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("failed on purpose"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(later_ran.load());
  EXPECT_THROW(stream->launch_host([] {}), DeviceError);
}

TEST_F(CudaStreamHost, AStreamDestroyedWithQueuedHostFunctionsRunsThemFirst) {
  std::atomic<int> ran{0};
  {
    auto stream = device_->create_stream("short-lived");
    DeviceMemory m = device_->allocate(64 << 20, "test.m");
    for (int i = 0; i < 16; ++i) {
      stream->memset(m.data(), i, 64 << 20);
      stream->launch_host([&] { ran.fetch_add(1); });
    }
    stream->release_after(std::move(m));
  }
  EXPECT_EQ(ran.load(), 16);
}

// Two threads enqueue on one stream: every host function runs once, and the stream finishes.
TEST_F(CudaStreamHost, ConcurrentEnqueuesOnOneStreamFinish) {
  auto stream = device_->create_stream("shared");
  std::atomic<int> ran{0};
  auto enqueue = [&] {
    for (int i = 0; i < 200; ++i) stream->launch_host([&] { ran.fetch_add(1); });
  };
  std::thread t1(enqueue), t2(enqueue);
  t1.join();
  t2.join();
  stream->synchronize();
  EXPECT_EQ(ran.load(), 400);
}

}  // namespace
}  // namespace strata
