// Host functions on a cuda stream (Note [Host functions on cuda], core/device/cuda_device_cuda.cc):
// they run in stream order, may call CUDA (pin and unpin host memory, copy and synchronize on
// another stream), turn an exception into the stream's sticky error, and a stream destroyed with
// host functions still queued runs them first. Labelled `gpu` (tests/core/CMakeLists.txt): every
// test skips, saying why, where no cuda device is usable. A deadlock shows as ctest's timeout.
#include <gtest/gtest.h>

#include <atomic>
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
// wrote -> d2h back: the stream orders the host function between its copies.
TEST_F(CudaStreamHost, HostFunctionsRunInStreamOrderBetweenCopies) {
  constexpr std::size_t n = 1 << 20;
  auto stream = device_->create_stream("order");
  std::vector<int> src(n), seen(n), written(n), back(n);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<int>(i);
  DeviceMemory a = device_->allocate(n * sizeof(int), "test.a");
  DeviceMemory b = device_->allocate(n * sizeof(int), "test.b");
  for (int round = 0; round < 20; ++round) {
    stream->copy_h2d(a.data(), src.data(), n * sizeof(int));
    stream->copy_d2h(seen.data(), a.data(), n * sizeof(int));
    stream->launch_host([&, round] {
      for (std::size_t i = 0; i < n; ++i) written[i] = seen[i] * 2 + round;
    });
    stream->copy_h2d(b.data(), written.data(), n * sizeof(int));
    stream->copy_d2h(back.data(), b.data(), n * sizeof(int));
    stream->synchronize();
    for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(back[i], static_cast<int>(i) * 2 + round) << "round " << round;
  }
}

// The offload worker's pattern: inside a host function, pin and unpin host memory, and copy on a
// second stream and wait for it. Must finish (no deadlock) and give the right bytes.
TEST_F(CudaStreamHost, HostFunctionsMayPinUnpinAndWaitForAnotherStream) {
  auto worker = device_->create_stream("worker");
  auto transfer = device_->create_stream("transfer");
  constexpr std::size_t bytes = 4 << 20;
  DeviceMemory d = device_->allocate(bytes, "test.d");
  transfer->memset(d.data(), 0x5a, bytes);
  transfer->synchronize();
  std::atomic<int> done{0};
  for (int i = 0; i < 8; ++i) {
    worker->launch_host([&] {
      HostBufferOptions o;
      o.pinner = device_.get();
      HostBuffer pinned = HostBuffer::allocate(bytes, o);  // cudaHostRegister
      transfer->copy_d2h(pinned.data(), d.data(), bytes);
      transfer->synchronize();
      const auto* p = static_cast<const unsigned char*>(pinned.data());
      if (p[0] != 0x5a || p[bytes - 1] != 0x5a) throw std::runtime_error("wrong bytes");
      done.fetch_add(1);
    });  // ~HostBuffer: cudaHostUnregister, inside the host function
  }
  worker->synchronize();
  EXPECT_EQ(done.load(), 8);
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
