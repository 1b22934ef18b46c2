// A Device decorator that records a timeline of every operation its streams run, for Chrome's
// trace viewer (chrome://tracing, Perfetto): one row per stream, one slice per copy, memset and
// host function (the sim device's kernels and the MPI collectives are host functions), timed from
// the moment the stream starts it to the moment it finishes. It is how a run shows that prefetch
// gathers and gradient reductions overlap compute (`strata.trace` in the config).
//
// Timestamps come from host functions enqueued around each operation, so they are exact for the
// sim device and approximate (host callback latency) for cuda.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/device/device.h"

namespace strata {

struct TraceSlice {
  std::string stream;
  std::string op;          // "h2d", "d2h", "d2d", "memset", "host"
  std::size_t bytes = 0;   // for copies
  double begin_us = 0;     // since the recorder was created
  double end_us = 0;
};

class TraceRecorder {
 public:
  TraceRecorder() : origin_(std::chrono::steady_clock::now()) {}
  double now_us() const;
  void add(TraceSlice slice);
  std::vector<TraceSlice> slices() const;
  // Writes the Chrome trace-event JSON ("X" complete events, one thread per stream). Throws IoError.
  void write_chrome_trace(const std::string& path, int rank = 0) const;

 private:
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<TraceSlice> slices_;
};

// Wraps `inner` (which must outlive the result); streams created through it record into `recorder`.
std::unique_ptr<Device> make_traced_device(Device& inner, std::shared_ptr<TraceRecorder> recorder);

}  // namespace strata
