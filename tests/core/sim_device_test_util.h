// What the tests on a sim device (tests/core/sim_device*_test.cc, and engine tests such as
// device_ops_test.cc) share: a small sim device's options, a byte pattern that shows a shifted or
// partial copy, the one gate a host function or sim kernel can block on, and a watchdog that turns
// a hang into a failure naming it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include "core/device/device.h"
#include "core/units.h"

namespace strata::testing_sim {

inline SimDeviceOptions small_device(std::size_t capacity_bytes = 64 * MiB) {
  SimDeviceOptions o;
  o.capacity_bytes = capacity_bytes;
  return o;
}

// A pattern that differs at every offset, so a shifted or partial copy shows. Word stores: a
// byte loop over 256 MiB is slow under sanitizers.
inline void fill_pattern(std::span<unsigned char> buf, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::size_t i = 0;
  for (; i + 8 <= buf.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(buf.data() + i, &x, 8);
  }
  for (; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 31 + seed);
}

// A one-shot gate a sim kernel can block on until the test opens it (a test's stand-in for slow
// device work; engine kernels never wait).
class Gate {
 public:
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

// While alive, ends the process with a message naming `what` if it is not destroyed within
// `limit`: a test whose broken rule would deadlock (a copy waiting for itself) fails with the reason
// instead of hanging until ctest's timeout. The process must end: a deadlocked thread cannot be
// unwound.
class HangWatchdog {
 public:
  explicit HangWatchdog(std::string what, std::chrono::seconds limit = std::chrono::seconds(30))
      : what_(std::move(what)), thread_([this, limit] {
          std::unique_lock lock(mutex_);
          if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
            std::fprintf(stderr, "FAILED: hung for %lld s: %s\n", static_cast<long long>(limit.count()),
                         what_.c_str());
            std::fflush(stderr);
            std::_Exit(1);
          }
        }) {}
  ~HangWatchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;

 private:
  const std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the members it reads exist
};

}  // namespace strata::testing_sim
