// The request generator of `strata bench io` (see bench/bench_io_workload.h).
#include "bench/bench_io_workload.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <numeric>
#include <random>

#include "core/error.h"

namespace strata::bench::bench_io {
namespace {

using offload::IoOp;
using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double seconds_of(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

std::uint64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return b > a ? static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count()) : 0;
}

// slat: queued to submitted; clat: submitted to done. A submission stamp outside [start, done]
// (an engine that leaves IoTimes alone) counts all of it as clat.
RequestLatency split_latency(Clock::time_point start, Clock::time_point submitted, Clock::time_point done) {
  if (submitted < start || submitted > done) return RequestLatency{0, ns_between(start, done)};
  return RequestLatency{ns_between(start, submitted), ns_between(submitted, done)};
}

class Workload {
 public:
  Workload(std::span<const Job> jobs, std::vector<TestFile>& files, std::span<std::byte> buffer,
           const WorkloadSpec& spec)
      : jobs_(jobs), files_(files), spec_(spec), timed_(spec.time.count() > 0) {
    STRATA_CHECK(buffer.size() >= workload_buffer_bytes(spec, jobs.size()), "bench buffer too small");
    std::uint64_t seed = spec.order_seed;
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      for (const Group& whole : spec.groups) {
        Stream s;
        s.range = job_share(whole, jobs[j].share, jobs[j].shares);
        STRATA_CHECK(s.range.blocks > s.range.qd || !timed_, "a timed group needs more blocks than its queue depth");
        s.job = j;
        s.file = jobs[j].file;
        s.rng.seed(seed++);
        if (!timed_ && s.range.pattern == Pattern::Random) {
          s.order.resize(s.range.blocks);
          std::iota(s.order.begin(), s.order.end(), s.range.first_block);
          std::shuffle(s.order.begin(), s.order.end(), s.rng);
        }
        streams_.push_back(std::move(s));
      }
    }
    for (std::size_t si = 0; si < streams_.size(); ++si) {
      for (unsigned q = 0; q < streams_[si].range.qd; ++q) {
        Slot slot;
        slot.stream = si;
        slot.buffer = buffer.data() + slots_.size() * spec.bs_bytes;
        slots_.push_back(slot);
      }
    }
  }

  WorkloadResult run() {
    const CpuTimes cpu0 = CpuTimes::now();
    t0_ = Clock::now();
    ramp_end_ = t0_ + spec_.ramp;
    const auto end = timed_ ? ramp_end_ + spec_.time : Clock::time_point::max();
    for (Slot& s : slots_) issue(s);
    std::optional<SteadyState> steady;
    if (spec_.steady) steady.emplace(spec_.steady->bound_fraction, spec_.steady->window_intervals);
    auto tick = spec_.interval.count() > 0 ? t0_ + spec_.interval : Clock::time_point::max();
    auto last_tick = t0_;
    int index = 0;
    std::unique_lock lock(mutex_);
    for (;;) {
      const auto deadline = stop_ ? tick : std::min(tick, end);
      const auto finished = [&] { return outstanding_ == 0; };
      if (deadline == Clock::time_point::max()) {
        cv_.wait(lock, finished);
      } else {
        cv_.wait_until(lock, deadline, finished);
      }
      if (outstanding_ == 0) break;
      const auto now = Clock::now();
      if (now >= end) stop_ = true;
      if (now < tick) continue;
      OpStats r = std::exchange(interval_read_, {});
      OpStats w = std::exchange(interval_write_, {});
      lock.unlock();
      const IntervalReport rep{index++, seconds_between(t0_, now), seconds_between(last_tick, now), tick <= ramp_end_,
                               r, w};
      if (spec_.on_interval) spec_.on_interval(rep);
      const bool now_steady = steady && !rep.ramp &&
                              steady->add(static_cast<double>(r.bytes + w.bytes) / rep.seconds / 1e9);
      last_tick = now;
      // After a late wake-up (a busy machine) the next interval starts from now, a whole interval
      // long, rather than a sliver up to the missed tick; each report carries its own length.
      tick += spec_.interval;
      if (tick <= now) tick = now + spec_.interval;
      lock.lock();
      if (now_steady && !result_.steady) {
        result_.steady = true;
        result_.steady_at_s = rep.end_s;
        stop_ = true;
      }
    }
    if (error_) std::rethrow_exception(error_);
    // The tail after the last tick is reported when it is a fair sample (half an interval or more),
    // else it only counts in the totals.
    const double tail_s = seconds_between(last_tick, last_done_);
    if (spec_.on_interval && (interval_read_.ios + interval_write_.ios) > 0 &&
        (index == 0 || tail_s >= seconds_of(spec_.interval) / 2)) {
      spec_.on_interval(IntervalReport{index, seconds_between(t0_, last_done_), seconds_between(last_tick, last_done_),
                                       last_done_ <= ramp_end_, interval_read_, interval_write_});
    }
    const auto counted_from = std::max(t0_, std::min(ramp_end_, last_done_));
    result_.seconds = seconds_between(counted_from, last_done_);
    result_.read_seconds = seconds_between(counted_from, std::max(counted_from, last_read_done_));
    result_.write_seconds = seconds_between(counted_from, std::max(counted_from, last_write_done_));
    result_.cpu_s = CpuTimes::now().total_s() - cpu0.total_s();
    return result_;
  }

 private:
  struct Stream {
    Group range;  // the job's share of its group
    std::size_t job = 0;
    std::size_t file = 0;
    std::vector<std::uint64_t> order;  // one random pass: the permutation
    std::uint64_t next = 0;            // requests taken (one pass) or the sequential cursor
    std::mt19937_64 rng;
  };
  // One request in flight: its buffer and what it carries.
  struct Slot {
    std::size_t stream = 0;
    std::byte* buffer = nullptr;
    offload::IoRequest request;
    std::uint64_t block = 0;
    std::uint64_t generation = 0;  // with --verify: what a write stamps or a read expects
    Clock::time_point start;        // queued: the submit call
    offload::IoTimes times;         // when the engine handed it to the kernel
  };

  // The next block of the slot's stream (mutex_ held); false when the stream is done.
  bool take_next_locked(Slot& slot) {
    Stream& s = streams_[slot.stream];
    const Group& g = s.range;
    if (stop_ || error_ || (!timed_ && s.next == g.blocks)) return false;
    std::uint64_t block = 0;
    VerifyMap* map = spec_.verify != nullptr ? &(*spec_.verify)[s.file] : nullptr;
    // A block with a request in flight is skipped, so a read never races a write of it (with
    // fewer requests in flight than blocks, some block is free).
    for (;;) {
      if (!timed_) {
        block = g.pattern == Pattern::Random ? s.order[s.next] : g.first_block + s.next;
        ++s.next;
      } else if (g.pattern == Pattern::Random) {
        block = g.first_block + s.rng() % g.blocks;
      } else {
        block = g.first_block + s.next++ % g.blocks;
      }
      if (map == nullptr || map->busy[block] == 0) break;
    }
    const bool read = g.read_percent == 100 || (g.read_percent > 0 && s.rng() % 100 < g.read_percent);
    slot.block = block;
    slot.request = offload::IoRequest{read ? IoOp::Read : IoOp::Write, jobs_[s.job].file_ids[s.file],
                                      block * spec_.bs_bytes, slot.buffer, spec_.bs_bytes};
    if (map != nullptr) {
      map->busy[block] = 1;
      slot.generation = read ? map->generation[block] : map->generation[block] + 1;
    }
    ++outstanding_;
    return true;
  }

  void issue(Slot& slot) {
    {
      std::lock_guard lock(mutex_);
      if (!take_next_locked(slot)) return;
    }
    submit(slot);
  }

  // Completions re-issue on the engine thread, so the queue stays full without a round trip
  // through the main thread. The next request is counted before the finished one is uncounted,
  // so run() cannot return (and destroy this) while a callback still uses it.
  void submit(Slot& slot) {
    const Stream& s = streams_[slot.stream];
    const bool write = slot.request.op == IoOp::Write;
    if (spec_.verify != nullptr && write) {
      stamp_block({slot.buffer, spec_.bs_bytes}, slot.request.offset_bytes, slot.generation, spec_.verify_seed);
    }
    slot.start = Clock::now();
    const auto on_done = [this, &slot, &s, write](std::exception_ptr& err) {
      const auto done = Clock::now();
      bool checked = false;
      if (!err && !write && spec_.verify != nullptr && slot.generation > 0) {
        try {
          check_block({slot.buffer, spec_.bs_bytes}, slot.request.offset_bytes, slot.generation, spec_.verify_seed,
                      files_[s.file].path);
          checked = true;
        } catch (...) {
          err = std::current_exception();
        }
      }
      const RequestLatency latency = split_latency(slot.start, slot.times.submitted, done);
      bool more = false;
      {
        std::lock_guard lock(mutex_);
        OpStats& interval = write ? interval_write_ : interval_read_;
        interval.record(spec_.bs_bytes, latency);
        if (done >= ramp_end_) (write ? result_.write : result_.read).record(spec_.bs_bytes, latency);
        result_.all_bytes += spec_.bs_bytes;
        if (checked) ++result_.verified_blocks;
        if (spec_.verify != nullptr) {
          VerifyMap& map = (*spec_.verify)[s.file];
          map.busy[slot.block] = 0;
          if (write && !err) map.generation[slot.block] = slot.generation;
        }
        if (err && !error_) error_ = err;
        last_done_ = done;
        (write ? last_write_done_ : last_read_done_) = done;
        more = take_next_locked(slot);
        --outstanding_;
        if (outstanding_ == 0) cv_.notify_all();
      }
      if (more) submit(slot);
    };
    jobs_[s.job].engine->submit(std::span(&slot.request, 1), on_done, &slot.times);
  }

  std::span<const Job> jobs_;
  std::vector<TestFile>& files_;
  const WorkloadSpec& spec_;
  const bool timed_;
  std::vector<Stream> streams_;
  std::vector<Slot> slots_;
  Clock::time_point t0_, ramp_end_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::size_t outstanding_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  OpStats interval_read_, interval_write_;
  WorkloadResult result_;
  Clock::time_point last_done_, last_read_done_, last_write_done_;
};

}  // namespace

std::size_t workload_buffer_bytes(const WorkloadSpec& spec, std::size_t jobs) {
  std::size_t slots = 0;
  for (const Group& g : spec.groups) slots += g.qd;
  return slots * jobs * spec.bs_bytes;
}

Group job_share(const Group& g, unsigned share, unsigned shares) {
  Group out = g;
  out.first_block = g.first_block + g.blocks * share / shares;
  out.blocks = g.blocks * (share + 1) / shares - g.blocks * share / shares;
  return out;
}

WorkloadResult run_workload(std::span<const Job> jobs, std::vector<TestFile>& files, std::span<std::byte> buffer,
                            const WorkloadSpec& spec) {
  Workload w(jobs, files, buffer, spec);
  return w.run();
}

WorkloadResult run_workload(offload::IoEngine& engine, std::vector<TestFile>& files, std::span<std::byte> buffer,
                            const WorkloadSpec& spec) {
  std::vector<offload::FileId> ids;
  for (const TestFile& f : files) ids.push_back(f.id);
  std::vector<Job> jobs;
  for (std::size_t f = 0; f < files.size(); ++f) jobs.push_back(Job{&engine, f, ids, 0, 1});
  return run_workload(jobs, files, buffer, spec);
}

}  // namespace strata::bench::bench_io
