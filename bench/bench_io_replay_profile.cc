// The replay's recording I/O engine and its step profile (bench/bench_io_replay_profile.h).
#include "bench/bench_io_replay_profile.h"

#include <algorithm>
#include <vector>

namespace strata::bench::bench_io {

double ReplayIoProfile::mean_read_request_bytes() const {
  return read_requests > 0 ? static_cast<double>(read_bytes) / static_cast<double>(read_requests) : 0;
}

double ReplayIoProfile::mean_write_request_bytes() const {
  return write_requests > 0 ? static_cast<double>(write_bytes) / static_cast<double>(write_requests) : 0;
}

nlohmann::json ReplayIoProfile::to_json() const {
  return {{"read_batches", read_batches},
          {"write_batches", write_batches},
          {"read_requests", read_requests},
          {"write_requests", write_requests},
          {"mean_read_request_bytes", mean_read_request_bytes()},
          {"mean_write_request_bytes", mean_write_request_bytes()},
          {"wall_seconds", wall_seconds},
          {"busy_seconds", busy_seconds},
          {"read_busy_seconds", read_busy_seconds},
          {"write_busy_seconds", write_busy_seconds},
          {"mixed_seconds", mixed_seconds},
          {"mean_requests_in_flight", mean_requests_in_flight},
          {"callback_seconds", callback_seconds},
          {"median_reaction_seconds", median_reaction_seconds}};
}

RecordingIoEngine::RecordingIoEngine(std::unique_ptr<offload::IoEngine> inner) : inner_(std::move(inner)) {
  const offload::IoEngineInfo i = inner_->info();
  limits_ = {std::max<std::size_t>(i.max_request_bytes, 4096), std::max<std::size_t>(i.max_write_request_bytes, 4096)};
}

void RecordingIoEngine::clear() {
  std::lock_guard lock(mutex_);
  batches_.clear();
}

offload::IoHandle RecordingIoEngine::queue_batch(std::span<const offload::IoRequest> requests,
                                                 offload::IoCallback callback, offload::IoTimes* times) {
  Batch b;
  b.op = requests.empty() ? offload::IoOp::Read : requests.front().op;
  const std::size_t limit = b.op == offload::IoOp::Read ? limits_.read_bytes : limits_.write_bytes;
  for (const offload::IoRequest& r : requests) {
    b.bytes += r.length_bytes;
    b.requests += (r.length_bytes + limit - 1) / limit;
  }
  b.submitted = Clock::now();
  Batch* slot = nullptr;
  {
    std::lock_guard lock(mutex_);
    batches_.push_back(b);
    slot = &batches_.back();  // a deque's elements stay put as it grows at the back
  }
  offload::IoCallback recorded = [this, slot, callback = std::move(callback)](std::exception_ptr& error) {
    const Clock::time_point transferred = Clock::now();
    if (callback) callback(error);
    const Clock::time_point done = Clock::now();
    std::lock_guard lock(mutex_);
    slot->transferred = transferred;
    slot->done = done;
  };
  return inner_->submit(requests, std::move(recorded), times);
}

double RecordingIoEngine::median_reaction(const std::deque<Batch>& batches) {
  std::vector<Clock::time_point> done;
  for (const Batch& b : batches) {
    if (b.done != Clock::time_point{}) done.push_back(b.done);
  }
  std::sort(done.begin(), done.end());
  std::vector<double> gaps;
  for (const Batch& b : batches) {
    const auto after = std::upper_bound(done.begin(), done.end(), b.submitted);
    if (after == done.begin()) continue;  // nothing had completed yet
    gaps.push_back(std::chrono::duration<double>(b.submitted - *(after - 1)).count());
  }
  if (gaps.empty()) return 0;
  std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2), gaps.end());
  return gaps[gaps.size() / 2];
}

ReplayIoProfile RecordingIoEngine::profile() const {
  std::lock_guard lock(mutex_);
  ReplayIoProfile p;
  struct Edge {
    Clock::time_point at;
    int reads = 0, writes = 0;
    std::int64_t requests = 0;
  };
  std::vector<Edge> edges;
  for (const Batch& b : batches_) {
    if (b.done == Clock::time_point{}) continue;  // still in flight: not this step's
    const bool read = b.op == offload::IoOp::Read;
    (read ? p.read_batches : p.write_batches) += 1;
    (read ? p.read_requests : p.write_requests) += b.requests;
    (read ? p.read_bytes : p.write_bytes) += b.bytes;
    p.callback_seconds += std::chrono::duration<double>(b.done - b.transferred).count();
    const auto n = static_cast<std::int64_t>(b.requests);
    edges.push_back({b.submitted, read ? 1 : 0, read ? 0 : 1, n});
    edges.push_back({b.transferred, read ? -1 : 0, read ? 0 : -1, -n});
  }
  if (edges.empty()) return p;
  std::sort(edges.begin(), edges.end(), [](const Edge& x, const Edge& y) { return x.at < y.at; });
  int reads = 0, writes = 0;
  std::int64_t requests = 0;
  double weighted = 0;
  Clock::time_point last_done = edges.front().at;
  for (const Batch& b : batches_) last_done = std::max(last_done, b.done);
  p.wall_seconds = std::chrono::duration<double>(last_done - edges.front().at).count();
  for (std::size_t i = 0; i + 1 < edges.size(); ++i) {
    reads += edges[i].reads;
    writes += edges[i].writes;
    requests += edges[i].requests;
    const double dt = std::chrono::duration<double>(edges[i + 1].at - edges[i].at).count();
    if (reads > 0) p.read_busy_seconds += dt;
    if (writes > 0) p.write_busy_seconds += dt;
    if (reads > 0 && writes > 0) p.mixed_seconds += dt;
    if (reads > 0 || writes > 0) p.busy_seconds += dt;
    weighted += static_cast<double>(requests) * dt;
  }
  p.mean_requests_in_flight = p.busy_seconds > 0 ? weighted / p.busy_seconds : 0;
  p.median_reaction_seconds = median_reaction(batches_);
  return p;
}

}  // namespace strata::bench::bench_io
