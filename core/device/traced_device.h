// A Device decorator that records a timeline of every operation its streams run, for Chrome's
// trace viewer (chrome://tracing, Perfetto): one row per stream, one slice per copy, memset and
// sim kernel (the sim device's ops and the MPI collectives), timed from the moment the stream
// starts it to the moment it finishes. It is how a run shows that prefetch gathers and gradient
// reductions overlap compute (`strata.trace` in the config).
//
// On sim, timestamps come from sim kernels enqueued around each operation (exact); on cuda from
// two events per copy or memset, turned into times once they completed (CUDA kernels launched on
// native_handle() are not seen). No stream waits for the host (Note [Host-driven offload] in docs/DESIGN.md).
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/device/device.h"

namespace strata {

struct TraceSlice {
  std::string stream;
  std::string op;          // "h2d", "d2h", "d2d", "memset", "kernel"
  std::size_t bytes = 0;   // for copies
  double begin_us = 0;     // since the recorder was created
  double end_us = 0;
};

class TraceRecorder {
 public:
  TraceRecorder() : origin_(std::chrono::steady_clock::now()) {}
  double now_us() const;
  void add(TraceSlice slice);
  // A slice bracketed by two events (a backend without sim kernels): timed against the origin
  // event once `end` has completed.
  void add_timed(std::string stream, const char* op, std::size_t bytes, std::shared_ptr<Event> begin,
                 std::shared_ptr<Event> end);
  // The completed event that marks `origin_us` on this recorder's clock.
  void set_origin(std::shared_ptr<Event> origin, double origin_us);
  // Every slice; waits for the events of timed slices still in flight.
  std::vector<TraceSlice> slices() const;
  // Writes the Chrome trace-event JSON ("X" complete events, one thread per stream), never through
  // a symbolic link (Note [No writing through links] in core/file_io.h). Throws IoError.
  void write_chrome_trace(const std::string& path, int rank = 0) const;

 private:
  struct Timed {
    TraceSlice slice;
    std::shared_ptr<Event> begin, end;
  };
  void resolve_front_locked() const;  // the oldest timed slice, completed, becomes a slice

  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mutex_;
  // Both change in slices() const, which resolves what is still timed.
  mutable std::vector<TraceSlice> slices_;
  mutable std::deque<Timed> timed_;
  std::shared_ptr<Event> origin_event_;
  double origin_event_us_ = 0;
};

// Wraps `inner` (which must outlive the result); streams created through it record into `recorder`.
std::unique_ptr<Device> make_traced_device(Device& inner, std::shared_ptr<TraceRecorder> recorder);

}  // namespace strata
