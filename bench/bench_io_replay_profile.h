// What `strata bench io --replay` hands the I/O engine, batch by batch: an IoEngine that forwards
// to the real one and records, for every batch the swap store submits, its direction, bytes,
// kernel requests, and when it was submitted, when its last byte arrived and when its callback
// (the swap store's checksum check on reads) had run. From the records, a step's I/O profile:
// how long the drive had something in flight, how long reads and writes were in flight together,
// the mean depth while busy, and the time spent in callbacks, which is what tells a slow drive
// from a pipeline that leaves it idle (Note [Step replay] in bench/bench_io_replay.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "offload/io_engine.h"

namespace strata::bench::bench_io {

// One step's I/O, as the engine saw it.
struct ReplayIoProfile {
  std::uint64_t read_batches = 0, write_batches = 0;
  std::uint64_t read_requests = 0, write_requests = 0;  // kernel requests (batches cut at the engine's limits)
  std::uint64_t read_bytes = 0, write_bytes = 0;
  double wall_seconds = 0;       // from the first submission to the last completion
  double busy_seconds = 0;       // something in flight (union of the batches' submit..last byte)
  double read_busy_seconds = 0;  // a read in flight
  double write_busy_seconds = 0; // a write in flight
  double mixed_seconds = 0;      // reads and writes in flight together
  double mean_requests_in_flight = 0;  // time-weighted, over busy_seconds
  double callback_seconds = 0;   // in the batches' callbacks (checksums), on the engine's thread
  // Median of, for each batch, the time from the latest completion before it to its submission:
  // how long a thread that waited for I/O takes to issue the next, in a pipeline where most
  // submissions follow a completion (see Note [Wake-ups] in sim/step_sim.h).
  double median_reaction_seconds = 0;
  double mean_read_request_bytes() const;
  double mean_write_request_bytes() const;
  nlohmann::json to_json() const;
};

class RecordingIoEngine final : public offload::IoEngine {
 public:
  explicit RecordingIoEngine(std::unique_ptr<offload::IoEngine> inner);

  offload::FileId register_file(int fd, const std::string& path) override { return inner_->register_file(fd, path); }
  void unregister_file(offload::FileId file) override { inner_->unregister_file(file); }
  void register_buffers(std::span<const std::span<std::byte>> buffers) override { inner_->register_buffers(buffers); }
  offload::IoEngineInfo info() const override { return inner_->info(); }

  // Forgets what was recorded (call with nothing in flight); the next profile covers what follows.
  void clear();
  ReplayIoProfile profile() const;

 protected:
  offload::IoHandle queue_batch(std::span<const offload::IoRequest> requests, offload::IoCallback callback,
                                offload::IoTimes* times) override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Batch {
    offload::IoOp op = offload::IoOp::Read;
    std::uint64_t bytes = 0;
    std::uint64_t requests = 0;
    Clock::time_point submitted{}, transferred{}, done{};
  };
  static double median_reaction(const std::deque<Batch>& batches);

  std::unique_ptr<offload::IoEngine> inner_;
  offload::RequestLimits limits_{};
  mutable std::mutex mutex_;
  std::deque<Batch> batches_;  // a deque: callbacks write into entries while others are added
};

}  // namespace strata::bench::bench_io
