// The host thread of the offload pipeline (Note [Host-driven offload] in docs/DESIGN.md): tasks run
// one at a time in submission order on a thread of its own; a task waits on device events itself
// (Event::synchronize), does host work (CPU sums, CPU Adam, NVMe I/O) and enqueues the next copies,
// so no stream ever waits for it. Like a stream, it keeps the first failure: later tasks are
// skipped, and drain() and the next submit() rethrow it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "core/device/schedule_chaos.h"

namespace strata {

class HostExecutor {
 public:
  // `chaos_seed` non-zero: each task starts after a seeded random pause of up to `chaos_max_us`
  // (Note [Schedule chaos] in core/device/schedule_chaos.h).
  explicit HostExecutor(std::string name, std::uint64_t chaos_seed = 0, double chaos_max_us = 200);
  // Runs what is queued (errors dropped: drain() was the place to see them), then joins.
  ~HostExecutor();
  HostExecutor(const HostExecutor&) = delete;
  HostExecutor& operator=(const HostExecutor&) = delete;

  void submit(std::function<void()> task);
  // Waits until every submitted task has run; rethrows the first failure.
  void drain();
  const std::string& name() const { return name_; }

 private:
  void run();
  void rethrow_locked() const;

  const std::string name_;
  ScheduleChaos chaos_;  // used by the executor's thread only
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<std::function<void()>> queue_;
  std::uint64_t submitted_ = 0;
  std::uint64_t done_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace strata
