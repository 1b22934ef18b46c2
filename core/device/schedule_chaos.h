// Seeded random pauses that try orders two idle cores rarely produce: the sim device's stream
// workers and the offload pipeline's host thread (engine/host_executor.h) take one before each
// task when a chaos seed is set.
//
// Note [Schedule chaos]: with SimDeviceOptions::chaos_seed (strata.device.chaos) set, every stream
// task of the sim device (copy, kernel, event record or wait, free) and every task of the offload
// host thread starts after a random pause, drawn from a generator of its own seeded from the
// device's, so that orders CUDA allows but two idle cores rarely produce (a copy finishing after the
// kernel queued behind a later event, an event completing late, a host thread waking late) are
// tried. Half the tasks get no pause; the rest up to chaos_max_us. Results must not change: stream
// order and events are what keeps them right (tests/engine/offload_chaos_test.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <thread>

namespace strata {

class ScheduleChaos {
 public:
  // `seed` 0 or `max_us` 0: no pauses.
  ScheduleChaos(std::uint64_t seed, double max_us) : rng_(seed), max_us_(max_us), on_(seed != 0 && max_us > 0) {}

  // Called by the one thread that runs the tasks, before each.
  void pause() {
    if (!on_) return;
    std::uniform_real_distribution<double> d(-max_us_, max_us_);
    const double us = d(rng_);
    if (us > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(us));
  }

 private:
  std::mt19937_64 rng_;
  double max_us_;
  bool on_;
};

}  // namespace strata
