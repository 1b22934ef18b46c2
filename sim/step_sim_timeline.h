// The step simulator's clock and queues (Note [Step simulator], sim/step_sim.h): a timeline of
// simulated operations, each placed on one hardware queue and, where it has one, one lane (a
// stream or a thread, which runs its operations in order). A queue serves one operation at a
// time; an operation takes the earliest free interval of its queue at or after the moment its
// inputs are ready (later-issued work may fill an earlier gap, as a real device runs whatever is
// ready). The chunk pipeline's bounded slots are simulated here too, so the tests can check them
// on their own.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sim/drive_model.h"

namespace strata::sim {

// The hardware a step's work waits for.
enum class SimQueue : std::uint8_t {
  Compute,     // the GPU's compute (model ops; device-side sums, copies and updates)
  H2D,         // host -> device copies (PCIe, or the sim device's memcpy or modeled link)
  D2H,         // device -> host copies
  Collective,  // GPU <-> GPU collectives (all-gather, reduce-scatter, all-reduce)
  Nvme,        // the drives: reads and writes of the swap store
  Cpu,         // host CPU work: gradient sums of offloaded state, CPU Adam
};
inline constexpr std::size_t kSimQueues = 6;
const char* sim_queue_name(SimQueue queue);

// Who issues an operation and waits for it in order: the real engine's streams and threads. The
// names are the streams' names in a `strata.trace` file, so the two timelines line up.
enum class SimLane : std::uint8_t {
  Host,     // the trainer's thread (the non-overlapped update's chunk pipeline runs on it)
  Compute,  // the model's compute stream
  Comm,     // zero.comm: gathers, reductions, device-side state math
  Worker,   // zero.offload: gradient sums and overlapped updates of offloaded state
  Io,       // the I/O engine: asynchronous, no order (only the drives' queue)
  // A pipeline stage's outgoing links, whose transfers queue on them (Note [Pipelined step
  // simulation]): to the next stage, to the previous one, and between the first and the last stage
  // when they are not neighbours (the tied embedding, Note [Tied embedding across stages] in models/pipeline.h).
  SendNext,
  SendPrev,
  SendFar,
};
inline constexpr std::size_t kSimLanes = 8;
const char* sim_lane_name(SimLane lane);

struct SimOp {
  std::string name;
  SimLane lane = SimLane::Io;
  SimQueue queue = SimQueue::Compute;
  double begin = 0;  // seconds
  double end = 0;
  std::uint64_t bytes = 0;
};

class Timeline {
 public:
  // `shared[q]` is the queue whose hardware q runs on: on the sim device the "GPU" is the host's
  // cores, so Cpu work and Compute share one queue there; elsewhere each queue is its own.
  explicit Timeline(const std::array<SimQueue, kSimQueues>& shared, double wake_seconds = 0);
  Timeline();

  // Places an operation of `seconds` on `queue`, no earlier than `ready` nor (except on the Io
  // lane) than the end of the lane's last operation; returns its end. A lane that is idle when the
  // operation becomes ready (`ready` after its last operation's end) starts it wake_seconds later
  // (Note [Wake-ups] in sim/step_sim.h).
  double add(std::string name, SimLane lane, SimQueue queue, double seconds, double ready, std::uint64_t bytes = 0);
  double lane_end(SimLane lane) const { return lane_end_[static_cast<std::size_t>(lane)]; }
  double wake_seconds() const { return wake_; }
  // The lane's thread waits, idle, until `until` (an I/O it must see complete).
  void hold(SimLane lane, double until);

  const std::vector<SimOp>& ops() const { return ops_; }
  // Seconds of operations of `queue` (by what they are, not where they ran) inside [from, to).
  double busy_seconds(SimQueue queue, double from, double to) const;

 private:
  // Busy intervals of each hardware queue, sorted and disjoint (touching ones merged).
  double reserve(SimQueue queue, double ready, double seconds);

  std::array<SimQueue, kSimQueues> shared_;
  double wake_ = 0;
  std::array<std::vector<std::pair<double, double>>, kSimQueues> busy_;
  std::array<double, kSimLanes> lane_end_{};
  std::vector<SimOp> ops_;
};

// One job of a chunk pipeline (Note [Chunk pipeline], engine/offload_tier.h), by what it costs:
// its NVMe reads, then on the pipeline's thread a device->host copy, CPU work and a host->device
// copy (synchronous, as the engine's transfer stream is waited for), then its NVMe writes.
struct PipelineJob {
  std::string name;
  std::uint64_t nvme_read_bytes = 0;
  std::uint64_t nvme_write_bytes = 0;
  std::uint64_t d2h_bytes = 0;
  std::uint64_t h2d_bytes = 0;
  double cpu_seconds = 0;
  double nvme_read_requests = 0;  // kernel requests of the NVMe bytes (DriveModel::key_requests)
  double nvme_write_requests = 0;
};

// What the pipeline's figures are turned into seconds with.
struct PipelineRates {
  double nvme_read_bytes_per_s = 0;  // without `drives`: every NVMe transfer at these
  double nvme_write_bytes_per_s = 0;
  double h2d_bytes_per_s = 0;
  double d2h_bytes_per_s = 0;
  // When set: a job's NVMe reads or writes take the drives' seconds at their requests, with the
  // pipeline's jobs in flight (min(slots, jobs)) as the streams (Note [Drive curves] in plan/machine_curve.h).
  DriveModel drives;
};

// Runs `jobs` as ChunkPipeline::run does with `slots` pinned slots, its thread being `lane` from
// `start` on: job j's reads are issued once job j-slots has run and its slot came back (its writes
// completed), and before later jobs' writes; jobs run in order on the lane, each copy costing two
// wake-ups besides its bytes (the transfer stream's worker woken, then the thread waiting for it);
// the lane is held until every write has completed, which is when it returns.
double simulate_pipeline(Timeline& timeline, SimLane lane, double start, const std::vector<PipelineJob>& jobs,
                         std::size_t slots, const PipelineRates& rates);

// Operations as Chrome trace JSON in the format of `strata.trace` (core/device/traced_device.h):
// one row per lane, named as the engine's streams, so a real and a simulated run open side by side.
// Throws IoError.
void write_sim_trace(const std::vector<SimOp>& ops, const std::string& path);

// bytes / rate, with an infinite rate taking no time (what the tests use for "infinitely fast").
double transfer_seconds(double bytes, double bytes_per_s);

}  // namespace strata::sim
