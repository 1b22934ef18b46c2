// The sim device's events: record generations completed in stream order, so that waiting on an
// event waits for exactly the work recorded before it. Internal to the sim backend
// (core/device/sim_*.{h,cc}); streams record and wait on them (core/device/sim_stream.cc).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "core/device/device.h"
#include "core/device/sim_state.h"
#include "core/error.h"

namespace strata::sim_backend {

// One event's record generations. gen 0 means "never recorded"; a generation is complete once
// the stream it was recorded on has passed it (exactly, even when records on several streams
// complete out of order).
struct SimEventState {
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t latest_gen = 0;
  std::set<std::uint64_t> pending_gens;
  Clock::time_point latest_completed_at{};

  std::uint64_t begin_record() {
    std::lock_guard lock(mutex);
    pending_gens.insert(++latest_gen);
    return latest_gen;
  }
  void complete(std::uint64_t gen) {
    {
      std::lock_guard lock(mutex);
      pending_gens.erase(gen);
      if (gen == latest_gen) latest_completed_at = Clock::now();
    }
    cv.notify_all();
  }
  void wait_for(std::uint64_t gen) {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return !pending_gens.contains(gen); });
  }
};

class SimEvent final : public Event {
 public:
  SimEvent(std::weak_ptr<SimDeviceState> device, std::string device_name)
      : device_(std::move(device)), device_name_(std::move(device_name)), state_(std::make_shared<SimEventState>()) {}

  bool query() override {
    lock_alive(device_, device_name_, "an event", "Event::query");
    std::lock_guard lock(state_->mutex);
    const std::uint64_t gen = recorded_gen_locked("Event::query");
    return !state_->pending_gens.contains(gen);
  }

  void synchronize() override {
    lock_alive(device_, device_name_, "an event", "Event::synchronize");
    refuse_inside_kernel(device_name_, "Event::synchronize");
    std::uint64_t gen = 0;
    {
      std::lock_guard lock(state_->mutex);
      gen = recorded_gen_locked("Event::synchronize");
    }
    state_->wait_for(gen);
  }

  double elapsed_ms_since(const Event& start_event) override {
    lock_alive(device_, device_name_, "an event", "Event::elapsed_ms_since");
    const auto* start = dynamic_cast<const SimEvent*>(&start_event);
    if (start == nullptr) {
      throw DeviceError(fmt::format("Event::elapsed_ms_since on {}: the start event belongs to another backend",
                                    device_name_));
    }
    const Clock::time_point start_at = start->completed_at("Event::elapsed_ms_since (start event)");
    const Clock::time_point end_at = completed_at("Event::elapsed_ms_since (end event)");
    return std::chrono::duration<double, std::milli>(end_at - start_at).count();
  }

  // The generation the latest record() created; throws if there was none.
  std::uint64_t recorded_gen_locked(std::string_view what, std::string_view stream_name = {}) const {
    if (state_->latest_gen == 0) {
      const std::string where = stream_name.empty() ? std::string() : fmt::format(" (stream '{}')", stream_name);
      throw DeviceError(fmt::format("{}{} on an event of {} that was never recorded: record it on a stream "
                                    "(Stream::record) before waiting on or querying it",
                                    what, where, device_name_));
    }
    return state_->latest_gen;
  }

  const std::shared_ptr<SimEventState>& state() const { return state_; }

 private:
  Clock::time_point completed_at(std::string_view what) const {
    std::lock_guard lock(state_->mutex);
    const std::uint64_t gen = recorded_gen_locked(what);
    if (state_->pending_gens.contains(gen)) {
      throw DeviceError(fmt::format("{} on {}: the event has not completed yet; synchronize it first", what,
                                    device_name_));
    }
    return state_->latest_completed_at;
  }

  std::weak_ptr<SimDeviceState> device_;
  std::string device_name_;
  std::shared_ptr<SimEventState> state_;
};

// `event` as a sim event; DeviceError (naming `what`) when another backend made it.
inline const SimEvent& as_sim_event(const Event& event, std::string_view what) {
  const auto* sim = dynamic_cast<const SimEvent*>(&event);
  if (sim == nullptr) {
    throw DeviceError(fmt::format("{}: the event was not created by a sim device; use Device::create_event of "
                                  "the stream's device",
                                  what));
  }
  return *sim;
}

}  // namespace strata::sim_backend
