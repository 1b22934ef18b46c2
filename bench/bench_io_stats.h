// What `strata bench io` measures about a stream of requests (bench/bench_io_workload.h): bytes,
// requests and a latency histogram per operation, the process's CPU time, and the steady-state
// test of sustained runs. Kept apart from the runner so that intervals and totals are the same
// arithmetic.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata::bench::bench_io {

// Request latencies in log buckets: 32 sub-buckets per power of two, so a percentile is within
// ~3 % of the exact one while a run of any length costs 15 KiB (fio's clat histogram is the same
// idea). The maximum is exact.
class LatencyHistogram {
 public:
  void record(std::uint64_t ns);
  void merge(const LatencyHistogram& other);
  std::uint64_t count() const { return count_; }
  // The latency at or under which `percent` of the requests completed, in microseconds (0 if none).
  double percentile_us(double percent) const;
  double max_us() const { return static_cast<double>(max_ns_) / 1e3; }
  double mean_us() const { return count_ > 0 ? static_cast<double>(sum_ns_) / static_cast<double>(count_) / 1e3 : 0; }
  // Non-empty buckets as [[upper_us, count], ...] for plots.
  nlohmann::json buckets_json() const;

 private:
  static constexpr int kSubBits = 5;
  static constexpr int kSub = 1 << kSubBits;
  static constexpr int kBuckets = (64 - kSubBits + 1) * kSub;
  static int bucket_of(std::uint64_t ns);
  static std::uint64_t bucket_upper_ns(int bucket);

  std::array<std::uint64_t, kBuckets> counts_{};
  std::uint64_t count_ = 0;
  std::uint64_t max_ns_ = 0;
  std::uint64_t sum_ns_ = 0;  // exact, so the means of slat and clat add up to lat's
};

// One request's latency, as fio splits it: slat from the moment it was queued (the bench's submit
// call) to its submission to the kernel (offload::IoTimes), clat from there to its completion being
// reaped (the batch's callback), lat the whole (slat + clat).
struct RequestLatency {
  std::uint64_t slat_ns = 0;
  std::uint64_t clat_ns = 0;
  std::uint64_t lat_ns() const { return slat_ns + clat_ns; }
};

// One operation's (reads' or writes') requests over a span of time.
struct OpStats {
  std::uint64_t bytes = 0;
  std::uint64_t ios = 0;
  LatencyHistogram latency;  // lat
  LatencyHistogram submit_latency;      // slat
  LatencyHistogram completion_latency;  // clat

  void record(std::uint64_t length_bytes, const RequestLatency& l) {
    bytes += length_bytes;
    ++ios;
    latency.record(l.lat_ns());
    submit_latency.record(l.slat_ns);
    completion_latency.record(l.clat_ns);
  }
  void merge(const OpStats& o) {
    bytes += o.bytes;
    ios += o.ios;
    latency.merge(o.latency);
    submit_latency.merge(o.submit_latency);
    completion_latency.merge(o.completion_latency);
  }
  // {"gbps", "iops", "p50_us", "p90_us", "p99_us", "p99_9_us", "p99_99_us", "max_us", "mean_us"} of
  // lat over `seconds`, and "slat" and "clat" objects with the same percentiles, max and mean.
  nlohmann::json json(double seconds) const;
};

// p50/p90/p99/p99.9/p99.99, max and mean of one histogram, in microseconds.
nlohmann::json percentiles_json(const LatencyHistogram& h);

// User and system CPU seconds of the whole process (the engine's thread and io_uring's workers are
// threads of it), from getrusage.
struct CpuTimes {
  double user_s = 0;
  double sys_s = 0;
  static CpuTimes now();
  double total_s() const { return user_s + sys_s; }
};

// fio's steady-state test (ss=bw:...), both criteria at once: over the last `window` intervals the
// range (max - min) and the drift of the least-squares line across the window are each within
// `bound` of the window's mean bandwidth.
class SteadyState {
 public:
  SteadyState(double bound_fraction, std::size_t window) : bound_(bound_fraction), window_(window) {}
  // Adds one interval's bandwidth; true once the window is steady.
  bool add(double gbps);
  double range_fraction() const { return range_; }
  double drift_fraction() const { return drift_; }

 private:
  double bound_;
  std::size_t window_;
  std::vector<double> values_;
  double range_ = 0;
  double drift_ = 0;
};

}  // namespace strata::bench::bench_io
