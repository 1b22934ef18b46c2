// The step simulator's timeline and chunk pipeline (sim/step_sim_timeline.h).
#include "sim/step_sim_timeline.h"

#include <algorithm>
#include <cmath>

#include "core/device/traced_device.h"
#include "core/error.h"

namespace strata::sim {

const char* sim_queue_name(SimQueue queue) {
  switch (queue) {
    case SimQueue::Compute: return "compute";
    case SimQueue::H2D: return "h2d";
    case SimQueue::D2H: return "d2h";
    case SimQueue::Collective: return "collectives";
    case SimQueue::Nvme: return "nvme";
    case SimQueue::Cpu: return "cpu";
  }
  return "?";
}

const char* sim_lane_name(SimLane lane) {
  switch (lane) {
    case SimLane::Host: return "host";
    case SimLane::Compute: return "compute";
    case SimLane::Comm: return "zero.comm";
    case SimLane::Worker: return "zero.offload";
    case SimLane::Io: return "nvme";
    case SimLane::SendNext: return "link to the next stage";
    case SimLane::SendPrev: return "link to the previous stage";
    case SimLane::SendFar: return "link between the first and last stage";
  }
  return "?";
}

double transfer_seconds(double bytes, double bytes_per_s) {
  if (bytes <= 0 || std::isinf(bytes_per_s)) return 0;
  STRATA_CHECK(bytes_per_s > 0, "a rate of {} for {} bytes (the machine check should have refused it)", bytes_per_s,
               bytes);
  return bytes / bytes_per_s;
}

Timeline::Timeline(const std::array<SimQueue, kSimQueues>& shared, double wake_seconds)
    : shared_(shared), wake_(wake_seconds) {}

Timeline::Timeline()
    : Timeline({SimQueue::Compute, SimQueue::H2D, SimQueue::D2H, SimQueue::Collective, SimQueue::Nvme, SimQueue::Cpu}) {}

double Timeline::reserve(SimQueue queue, double ready, double seconds) {
  if (seconds <= 0) return ready;  // takes no time: needs no turn
  auto& busy = busy_[static_cast<std::size_t>(shared_[static_cast<std::size_t>(queue)])];
  // The first interval that ends after `ready`; ends are sorted as the intervals are disjoint.
  auto it = std::upper_bound(busy.begin(), busy.end(), ready,
                             [](double t, const std::pair<double, double>& iv) { return t < iv.second; });
  double start = ready;
  for (; it != busy.end(); ++it) {
    if (it->first >= start + seconds) break;  // the gap before this interval holds the operation
    start = std::max(start, it->second);
  }
  const double end = start + seconds;
  // Insert [start, end) at `it`, merged with the neighbours it touches.
  auto next = busy.insert(it, {start, end});
  if (next + 1 != busy.end() && (next + 1)->first <= end) {
    next->second = (next + 1)->second;
    busy.erase(next + 1);
  }
  if (next != busy.begin() && (next - 1)->second >= start) {
    (next - 1)->second = next->second;
    busy.erase(next);
  }
  return end;
}

double Timeline::add(std::string name, SimLane lane, SimQueue queue, double seconds, double ready, std::uint64_t bytes) {
  double& lane_end = lane_end_[static_cast<std::size_t>(lane)];
  if (lane != SimLane::Io) ready = ready > lane_end ? ready + wake_ : lane_end;
  const double end = reserve(queue, ready, seconds);
  const double begin = end - std::max(seconds, 0.0);
  if (lane != SimLane::Io) lane_end = end;
  ops_.push_back(SimOp{std::move(name), lane, queue, begin, end, bytes});
  return end;
}

void Timeline::hold(SimLane lane, double until) {
  double& end = lane_end_[static_cast<std::size_t>(lane)];
  end = std::max(end, until);
}

double Timeline::busy_seconds(SimQueue queue, double from, double to) const {
  double sum = 0;
  for (const SimOp& op : ops_) {
    if (op.queue != queue) continue;
    sum += std::max(0.0, std::min(op.end, to) - std::max(op.begin, from));
  }
  return sum;
}

double simulate_pipeline(Timeline& timeline, SimLane lane, double start, const std::vector<PipelineJob>& jobs,
                         std::size_t slots, const PipelineRates& rates) {
  slots = std::max<std::size_t>(slots, 1);
  start = std::max(start, timeline.lane_end(lane));  // the thread gets to the pipeline then
  const std::size_t n = jobs.size();
  const double streams = static_cast<double>(std::min(slots, std::max<std::size_t>(n, 1)));
  const auto nvme_seconds = [&](DriveOp op, std::uint64_t bytes, double requests) {
    if (rates.drives.set()) return rates.drives.seconds(op, static_cast<double>(bytes), requests, streams);
    return transfer_seconds(static_cast<double>(bytes),
                            op == DriveOp::Read ? rates.nvme_read_bytes_per_s : rates.nvme_write_bytes_per_s);
  };
  std::vector<double> ran(n, start), slot_back(n, start), reads_done(n, start);
  std::size_t issued = 0;  // jobs whose reads are placed
  double thread = start;
  double all_done = start;
  // A copy the thread hands to its transfer stream and waits for: the stream's worker is woken,
  // copies, and wakes the thread (Note [Wake-ups] in sim/step_sim.h).
  const double wake = timeline.wake_seconds();
  const auto synchronous_copy = [&](std::string name, SimQueue queue, double seconds, double at, std::uint64_t bytes) {
    timeline.hold(lane, at + wake);
    const double end = timeline.add(std::move(name), lane, queue, seconds, at, bytes) + wake;
    timeline.hold(lane, end);
    return end;
  };
  for (std::size_t j = 0; j < n; ++j) {
    // ChunkPipeline::run keeps at most `slots` jobs in flight, each in its own slot: job k takes
    // the slot job k-slots gave back and is issued once that job has run. Its reads go out before
    // job j runs, so they are placed before job j's writes. (The real loop notices a slot coming
    // back between two runs; this takes the moment itself.)
    for (; issued < n && issued < j + slots; ++issued) {
      const PipelineJob& job = jobs[issued];
      const double issue = issued >= slots ? std::max(ran[issued - slots], slot_back[issued - slots]) : start;
      reads_done[issued] = issue;
      if (job.nvme_read_bytes == 0) continue;
      reads_done[issued] =
          timeline.add("nvme read " + job.name, SimLane::Io, SimQueue::Nvme,
                       nvme_seconds(DriveOp::Read, job.nvme_read_bytes, job.nvme_read_requests), issue,
                       job.nvme_read_bytes);
    }
    const PipelineJob& job = jobs[j];
    thread = std::max(thread, reads_done[j]);
    if (job.d2h_bytes > 0) {
      thread = synchronous_copy(job.name + " d2h", SimQueue::D2H,
                                transfer_seconds(static_cast<double>(job.d2h_bytes), rates.d2h_bytes_per_s), thread,
                                job.d2h_bytes);
    }
    thread = timeline.add(job.name, lane, SimQueue::Cpu, job.cpu_seconds, thread);
    if (job.h2d_bytes > 0) {
      thread = synchronous_copy(job.name + " h2d", SimQueue::H2D,
                                transfer_seconds(static_cast<double>(job.h2d_bytes), rates.h2d_bytes_per_s), thread,
                                job.h2d_bytes);
    }
    ran[j] = slot_back[j] = thread;
    if (job.nvme_write_bytes > 0) {
      slot_back[j] =
          timeline.add("nvme write " + job.name, SimLane::Io, SimQueue::Nvme,
                       nvme_seconds(DriveOp::Write, job.nvme_write_bytes, job.nvme_write_requests),
                       thread, job.nvme_write_bytes);
    }
    all_done = std::max(all_done, slot_back[j]);
  }
  timeline.hold(lane, all_done);
  return all_done;
}

void write_sim_trace(const std::vector<SimOp>& ops, const std::string& path) {
  TraceRecorder recorder;
  for (const SimOp& op : ops) {
    recorder.add(TraceSlice{sim_lane_name(op.lane), op.name, static_cast<std::size_t>(op.bytes), op.begin * 1e6,
                            op.end * 1e6});
  }
  recorder.write_chrome_trace(path);
}

}  // namespace strata::sim
