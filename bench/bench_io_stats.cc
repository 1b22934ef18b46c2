// Latency buckets, CPU time and steady state of `strata bench io` (see bench/bench_io_stats.h).
#include "bench/bench_io_stats.h"

#include <sys/resource.h>

#include <algorithm>
#include <bit>
#include <cmath>

namespace strata::bench::bench_io {

int LatencyHistogram::bucket_of(std::uint64_t ns) {
  if (ns < kSub) return static_cast<int>(ns);
  const int exp = std::bit_width(ns) - 1;  // >= kSubBits
  const auto sub = static_cast<int>((ns >> (exp - kSubBits)) - kSub);
  return (exp - kSubBits + 1) * kSub + sub;
}

std::uint64_t LatencyHistogram::bucket_upper_ns(int bucket) {
  if (bucket < kSub) return static_cast<std::uint64_t>(bucket);
  const int exp = bucket / kSub + kSubBits - 1;
  const auto sub = static_cast<std::uint64_t>(bucket % kSub);
  return ((kSub + sub + 1) << (exp - kSubBits)) - 1;
}

void LatencyHistogram::record(std::uint64_t ns) {
  ++counts_[static_cast<std::size_t>(bucket_of(ns))];
  ++count_;
  max_ns_ = std::max(max_ns_, ns);
  sum_ns_ += ns;
}

void LatencyHistogram::merge(const LatencyHistogram& other) {
  for (std::size_t i = 0; i < counts_.size(); ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  max_ns_ = std::max(max_ns_, other.max_ns_);
  sum_ns_ += other.sum_ns_;
}

double LatencyHistogram::percentile_us(double percent) const {
  if (count_ == 0) return 0;
  const auto rank = std::max<std::uint64_t>(
      1, static_cast<std::uint64_t>(std::ceil(percent / 100.0 * static_cast<double>(count_))));
  std::uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += counts_[static_cast<std::size_t>(b)];
    if (seen >= rank) return static_cast<double>(std::min(bucket_upper_ns(b), max_ns_)) / 1e3;
  }
  return max_us();
}

nlohmann::json LatencyHistogram::buckets_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (int b = 0; b < kBuckets; ++b) {
    const std::uint64_t n = counts_[static_cast<std::size_t>(b)];
    if (n != 0) out.push_back({static_cast<double>(bucket_upper_ns(b)) / 1e3, n});
  }
  return out;
}

nlohmann::json percentiles_json(const LatencyHistogram& h) {
  return {{"p50_us", h.percentile_us(50)},         {"p90_us", h.percentile_us(90)},
          {"p99_us", h.percentile_us(99)},         {"p99_9_us", h.percentile_us(99.9)},
          {"p99_99_us", h.percentile_us(99.99)}, {"max_us", h.max_us()},
          {"mean_us", h.mean_us()}};
}

nlohmann::json OpStats::json(double seconds) const {
  const double s = seconds > 0 ? seconds : 1;
  nlohmann::json j = percentiles_json(latency);
  j["ios"] = ios;
  j["bytes"] = bytes;
  j["gbps"] = static_cast<double>(bytes) / s / 1e9;
  j["iops"] = static_cast<double>(ios) / s;
  j["slat"] = percentiles_json(submit_latency);
  j["clat"] = percentiles_json(completion_latency);
  return j;
}

CpuTimes CpuTimes::now() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return CpuTimes{sec(ru.ru_utime), sec(ru.ru_stime)};
}

bool SteadyState::add(double gbps) {
  values_.push_back(gbps);
  if (values_.size() < window_ || window_ < 2) return false;
  const auto first = values_.end() - static_cast<std::ptrdiff_t>(window_);
  const auto [lo, hi] = std::minmax_element(first, values_.end());
  double mean = 0;
  for (auto it = first; it != values_.end(); ++it) mean += *it;
  mean /= static_cast<double>(window_);
  if (mean <= 0) return false;
  // Least-squares slope over x = 0..window-1, in GB/s per interval.
  const double xbar = static_cast<double>(window_ - 1) / 2;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < window_; ++i) {
    const double dx = static_cast<double>(i) - xbar;
    num += dx * (first[static_cast<std::ptrdiff_t>(i)] - mean);
    den += dx * dx;
  }
  range_ = (*hi - *lo) / mean;
  drift_ = std::abs(num / den) * static_cast<double>(window_ - 1) / mean;
  return range_ <= bound_ && drift_ <= bound_;
}

}  // namespace strata::bench::bench_io
