// The offload pipeline's host thread (engine/host_executor.h).
#include "engine/host_executor.h"

#include <utility>

#include <fmt/format.h>

#include "core/error.h"

namespace strata {

HostExecutor::HostExecutor(std::string name, std::uint64_t chaos_seed, double chaos_max_us)
    : name_(std::move(name)),
      chaos_(chaos_seed == 0 ? 0 : chaos_seed ^ 0xD1B54A32D192ED03ULL, chaos_max_us) {
  thread_ = std::thread([this] { run(); });
}

HostExecutor::~HostExecutor() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void HostExecutor::submit(std::function<void()> task) {
  STRATA_CHECK(task != nullptr, "host executor '{}': an empty task", name_);
  {
    std::lock_guard lock(mutex_);
    rethrow_locked();
    queue_.push_back(std::move(task));
    ++submitted_;
  }
  work_cv_.notify_one();
}

void HostExecutor::drain() {
  std::unique_lock lock(mutex_);
  idle_cv_.wait(lock, [&] { return done_ == submitted_; });
  rethrow_locked();
}

void HostExecutor::rethrow_locked() const {
  if (error_) std::rethrow_exception(error_);
}

void HostExecutor::run() {
  for (;;) {
    std::function<void()> task;
    bool skip = false;
    {
      std::unique_lock lock(mutex_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      task = std::move(queue_.front());
      queue_.pop_front();
      skip = error_ != nullptr;
    }
    std::exception_ptr failure;
    if (!skip) {
      chaos_.pause();  // see Note [Schedule chaos] in core/device/schedule_chaos.h
      try {
        task();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    task = nullptr;  // what it captured (device memory, leases) goes before it counts as done
    {
      std::lock_guard lock(mutex_);
      if (failure && !error_) error_ = failure;
      ++done_;
    }
    idle_cv_.notify_all();
  }
}

}  // namespace strata
