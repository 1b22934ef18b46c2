// The sim device's modeled copy links: one per copy direction, each a shared "busy until" time,
// so that copies take the wall time a link of the configured bandwidth and latency would.
// Internal to the sim backend (core/device/sim_*.{h,cc}).
//
// Note [Modeled link]: each copy direction (h2d, d2h, d2d) is one shared link with a "busy until"
// time. A copy reserves [max(now, busy_until), + bytes/bandwidth) under the link's mutex, does its
// memcpy, then sleeps until the reserved end plus the fixed latency. Two concurrent copies in one
// direction therefore share its bandwidth (they queue on the link), while h2d and d2h overlap (full
// duplex, as PCIe). Latency does not occupy the link (requests pipeline), it only delays completion.
// The memcpy happens at the start of the window; nobody can observe the data before the modeled
// completion because completion is only visible through the stream's order. When the memcpy itself
// is slower than the model, the copy takes the memcpy's time: the model is a lower bound.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

namespace strata::sim_backend {

using Clock = std::chrono::steady_clock;

// See Note [Modeled link] above.
class ModeledLink {
 public:
  ModeledLink(double gbps, double latency_us)
      : bytes_per_s_(gbps * 1e9),
        latency_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(latency_us))) {}

  // Copies `bytes` from src to dst (memmove: d2d ranges may overlap) in the modeled time.
  void copy(void* dst, const void* src, std::size_t bytes) {
    const std::optional<Clock::time_point> finish = reserve(bytes);
    std::memmove(dst, src, bytes);
    if (finish) std::this_thread::sleep_until(*finish);
  }
  void fill(void* dst, int value, std::size_t bytes) {
    const std::optional<Clock::time_point> finish = reserve(bytes);
    std::memset(dst, value, bytes);
    if (finish) std::this_thread::sleep_until(*finish);
  }

 private:
  std::optional<Clock::time_point> reserve(std::size_t bytes) {
    if (bytes_per_s_ <= 0 && latency_ == Clock::duration::zero()) return std::nullopt;  // as fast as memcpy
    const auto transfer = bytes_per_s_ > 0 ? std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                                 static_cast<double>(bytes) / bytes_per_s_))
                                           : Clock::duration::zero();
    const auto now = Clock::now();
    std::lock_guard lock(mutex_);
    const auto start = std::max(now, busy_until_);
    busy_until_ = start + transfer;
    return busy_until_ + latency_;
  }

  const double bytes_per_s_;
  const Clock::duration latency_;
  std::mutex mutex_;
  Clock::time_point busy_until_{};
};

}  // namespace strata::sim_backend
