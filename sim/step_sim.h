// The step simulator behind `strata simulate` (cli/simulate.cc): one training step of the real
// engine replayed against a machine described by numbers (plan/machine.h), for machines Strata
// runs on and machines it does not.
//
// Note [Step simulator]: a discrete-event simulation of one steady-state step (the prefetch trace
// recorded, the previous step's end having started the first gathers, as from the second step of
// `strata train` on). The work and its order come from the code that runs it, not from a second
// description: the param groups and every size (shards, state and gradient ranges, chunks, pinned
// slots, tiers) from the run plan (make_run_plan over models::Decoder's groups, plan/run_plan.h),
// and the schedule is the engine's, step by step: the decoder's acquire/compute/grads_ready/release
// sequence per micro-batch (models/decoder.h); the ParamFetcher's trace, prefetch window
// (stage3_prefetch_bucket_size, stage3_max_live_parameters), keep-if-needed-soon rule and pinned
// parameter slots (engine/param_fetcher.cc); the GradReducer's reduction of a group as soon as its
// gradients are ready (engine/grad_reducer.cc); the state homes' sums and updates, on the device or
// through the chunk pipeline with its fixed slots (Note [Chunk pipeline] in engine/offload_tier.h) on the worker stream
// during backward and, without Note [Overlapped update] in engine/state_home_tiered.cc, on the trainer's thread in
// step(); the host's waits (end of each micro-batch, step()). Durations come from the machine: FLOPs per op /
// (peak x efficiency), bytes / bandwidth for copies (PCIe each way), collectives (ring formulas
// over the GPU link), NVMe (drives x per-drive bandwidth) and host memory passes, parameters /
// (Adam params/s) for the CPU update. Each queue (sim/step_sim_timeline.h) serves one operation at
// a time, so contention between prefetch reads and state writes, or between the GPU's compute and
// device-side sums, is in the answer. With pipeline stages each stage's rank is simulated so, on
// queues of its own, through its schedule and its messages (Note [Pipelined step simulation] in
// sim/step_sim_stages.cc).
//
// Simplifications, each small for the configs it was checked on (docs/MEASUREMENTS.md):
//   - FLOPs: 2 x (matmul weights) x tokens forward, twice that backward, the forward again when
//     activations are checkpointed; attention 4 x seq x d_attn per token forward (the 12 x L x s x h
//     of models::train_flops_per_token split 1:2 into forward and backward); non-matmul ops are
//     inside the efficiency, which is one figure for the blocks and one for the head and embedding.
//   - NVMe: each transfer at the drives' figure for the kernel requests and depth it issues (Note
//     [Drive curves] in plan/machine_curve.h; one figure per direction without a curve); a drive
//     serves reads and writes in turn, not both at full speed; its latency tail is not modeled.
//   - One rank is simulated; what the node's ranks share (the drives, host memory bandwidth, the
//     CPU's Adam rate) is split evenly among them, as every rank runs the same step at once.
//   - Collectives: ring algorithms at the link bandwidth, no latency; world 1 copies on the device.
//     Tensor parallelism's collectives (Megatron's count, models::tensor_parallel_traffic) run on
//     the compute stream over the same link, each rank computing its slices' FLOPs. With sequence
//     parallelism (Note [Sequence parallelism] in models/tensor_parallel.h) each all-reduce is a
//     reduce-scatter and an all-gather, which on a ring move what it moves, so they are charged as
//     the all-reduces, and the backward's 2 more all-gathers per block (the norms' outputs again) as
//     one pass each; the norms' weight gradients (exact mode's rank-order chain, fast mode's
//     all-reduces: d_model values each) and the norms running on 1/T of the rows are not modeled. Its activation bytes are the decoder's.
//   - Device memory is taken to be enough (the tier plan is checked first): no eviction, no
//     demand fetch that waits for frees; a tiled block's tile groups are acquired one by one with
//     the block's FLOPs split by their size.
//   - Host-side costs that do not grow with the model (scalar decisions, launching work) are not
//     counted, except the wake-ups of Note [Wake-ups].
//
// Note [Wake-ups]: a stream's worker that has run out of work, or a thread blocked on a
// synchronization, sleeps; work handed to it starts only once it has been woken. On the sim device
// each stream is a thread sleeping on a condition variable, and a wake-up costs 2-25 us on this
// project's 2-core machines (measured; it depends on how busy the other core is). tiny's 4 ms step
// has dozens: the loss read back after each micro-batch, step()'s waits for the reductions and for
// the norm, a stream resuming after an event from another, and with offloaded state two per copy
// of each chunk job (the transfer stream woken, then the thread that waits for it). Charged
// nothing, the simulator predicted tiny 20 % short (docs/MEASUREMENTS.md), though its compute is
// calibrated on tiny's own forward and backward, which has no waits. So an operation starts
// SimMachine::wake_seconds late when its lane was idle when it became ready, the host resumes that
// late from each wait that blocked it, and a chunk job's copy costs two of them (simulate_pipeline).
// `--machine measure` measures it as half the median round trip of an empty sim kernel through
// an idle sim stream (the worker woken, then the host). A GPU's launch and synchronization
// latencies (microseconds) have not been measured, so a machine file charges none.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "config/config.h"
#include "plan/machine.h"
#include "plan/run_plan.h"
#include "models/pipeline.h"
#include "sim/step_sim_timeline.h"

namespace strata::sim {

// How fast the device runs the model, beyond the machine file's peak rate (Note [Step simulator]).
struct SimMachine {
  MachineSpec spec;
  // Achieved fraction of spec.gpus.bf16_tflops on the transformer blocks and on the head and
  // embedding. For a GPU these are assumptions (--efficiency); `--machine measure` measures them.
  double block_efficiency = 0.5;
  double head_efficiency = 0.5;
  // Device memory bandwidth for the device-side passes (gradient sums, copies inside the device,
  // the update of device-resident state). Not in machine files: an HBM figure by default.
  double device_memory_gbps = 2000;
  // The sim device: the "GPU" is the host's cores, so model ops, the device's state math and the
  // CPU work of offloaded state share one queue.
  bool device_is_host = false;
  // See Note [Wake-ups] in sim/step_sim.h.
  // What a stream or the trainer's thread takes to resume after waiting for other
  // work. Measured on the sim device (`--machine measure`); not in machine files, and 0 for a GPU,
  // where it has not been measured.
  double wake_seconds = 0;
};

enum class ComputeClass : std::uint8_t { Block, Head };

// One thing the model does, in the order the trainer's thread issues it (models/decoder.cc).
// TensorCollective: a collective of the tensor group on the compute stream (models/tensor_parallel.h),
// `bytes` per rank passed in, `passes` 2 for an all-reduce and 1 for an all-gather.
struct SimAction {
  enum Kind : std::uint8_t { Acquire, Compute, GradsReady, Release, TensorCollective };
  Kind kind = Compute;
  std::size_t group = 0;  // Acquire, GradsReady, Release
  std::string name;       // Compute, TensorCollective
  double flops = 0;       // Compute
  ComputeClass cls = ComputeClass::Block;
  double bytes = 0;   // TensorCollective
  double passes = 0;  // TensorCollective
};

struct StepWorkload;

// A pipeline stage's part of the step (strata.parallel.pipeline = P > 1, Note [Pipelined step
// simulation] in sim/step_sim_stages.cc): its blocks, its schedule, what its workload's
// micro_batch holds (its stage_forward's actions, then its stage_backward's) and what it sends.
struct StageWork {
  int stages = 1;  // P; 1: no pipeline, the workload is the whole model's
  int rank = 0;
  std::int64_t first_layer = 0, end_layer = 0;
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  std::vector<models::PipelineOp> ops;  // the stage's order of work (models::pipeline_schedule)
  int activation_sets = 0;              // Note [Stage activations] in models/pipeline.h; 0: re-materialized
  std::size_t forward_actions = 0;      // micro_batch[0, forward_actions): the stage's forward
  // One micro-batch's stage output (and its gradient, back): batch x seq x d_model x dtype bytes
  // (the rank's rows of them under sequence parallelism: models::Decoder::boundary_elems), and the
  // final norm's output the last stage sends the first with a tied embedding (every row).
  double boundary_bytes = 0;
  double head_bytes = 0;
  // GPT-2's tied embedding across stages (Note [Tied embedding across stages] in models/pipeline.h): the weights the
  // first stage sends the last once per step (0: none), and the first stage's acquisition and
  // release of its embedding group around that send.
  double tied_bytes = 0;
  std::vector<SimAction> share_tied;
  std::uint64_t parameters = 0;  // the stage's (its groups' elements)

  bool split() const { return stages > 1; }
  bool first() const { return rank == 0; }
  bool last() const { return rank == stages - 1; }
  bool tied() const { return tied_bytes > 0; }
  std::span<const SimAction> forward(const StepWorkload& w) const;
  std::span<const SimAction> backward(const StepWorkload& w) const;
};

// One step's work for rank 0, from a config.
struct StepWorkload {
  std::string source;  // the config, for messages
  RunPlan plan;
  std::vector<std::string> group_names;
  std::vector<SimAction> micro_batch;  // one micro-batch's actions (the same for each)
  int micro_batches = 1;
  bool overlap_update = false;  // Note [Overlapped update] in engine/state_home_tiered.cc applies to this config
  bool exact = false;
  std::uint64_t prefetch_bucket_elems = 0;
  std::uint64_t max_live_elems = 0;
  std::int64_t tokens_per_step = 0;  // all ranks
  int tensor_ranks = 1;               // strata.parallel.tensor: the plan is one tensor rank's
  std::uint64_t activation_bytes = 0;
  std::uint64_t parameters = 0;  // the whole model's
  StageWork stage;               // with pipeline stages: which one this is
};

inline std::span<const SimAction> StageWork::forward(const StepWorkload& w) const {
  return std::span<const SimAction>(w.micro_batch).first(forward_actions);
}
inline std::span<const SimAction> StageWork::backward(const StepWorkload& w) const {
  return std::span<const SimAction>(w.micro_batch).subspan(forward_actions);
}

// The workload of `config` on `world_size` ranks with `device_bytes` per GPU (which decides automatic
// tiling, models/tiling_plan.h). With strata.parallel.tensor = T, it is the last tensor rank's (the
// most vocabulary rows), its state sharded over world_size / T data ranks. ConfigError for a config
// that cannot be planned.
StepWorkload make_step_workload(const TrainConfig& config, int world_size, std::uint64_t device_bytes);
// With strata.parallel.pipeline = P > 1: one workload per stage, each the plan and actions of the
// stage's rank (the last tensor rank of the stage, sharded over world_size / (T x P) data ranks), the
// stages split as the trainer splits them (models::pipeline_boundaries). P = 1: the one workload of
// make_step_workload.
std::vector<StepWorkload> make_stage_workloads(const TrainConfig& config, int world_size, std::uint64_t device_bytes);

struct SimResult {
  double step_seconds = 0;
  double tokens_per_second = 0;
  std::array<double, kSimQueues> busy_seconds{};  // per SimQueue, inside the step
  SimQueue slowest = SimQueue::Compute;
  double lower_bound_seconds = 0;  // the busiest queue: no schedule is faster
  std::uint64_t nvme_read_bytes = 0;
  std::uint64_t nvme_written_bytes = 0;
  std::vector<SimOp> ops;  // the step's operations, times from its start
};

// Simulates one steady-state step. ConfigError naming the field when the machine lacks a figure the
// config needs (drives for NVMe, a GPU link for more than one GPU).
SimResult simulate_step(const StepWorkload& workload, const SimMachine& machine);

// One pipeline stage's rank in a pipelined step (Note [Pipelined step simulation] in sim/step_sim_stages.cc).
struct StageSimResult {
  // Its queues' busy time, NVMe bytes and operations over the step (step_seconds: the pipeline's).
  SimResult sim;
  // Its forwards' and backwards' compute (Note [Measured bubble] in models/pipeline_runner.h: each
  // from its input's arrival to its last op), and 1 - that / the pipeline's span.
  double busy_seconds = 0;
  double bubble_fraction = 0;
  int peak_in_flight = 0;  // micro-batches whose forward had begun and backward had not ended
  // Point-to-point bytes this step: to and from the neighbouring stages and, with a tied embedding,
  // between the first and the last stage.
  std::uint64_t sent_bytes = 0, received_bytes = 0;
};
struct PipelineSimResult {
  double step_seconds = 0;  // every stage's, as the step ends with collectives over all of them
  double tokens_per_second = 0;
  // The pipeline's span: from the step's start to the end of the last forward or backward on any
  // stage (see Note [Measured bubble] in models/pipeline_runner.h: what each stage's idle share is taken of).
  double span_seconds = 0;
  double ideal_bubble_fraction = 0;  // (P - 1) / (A + P - 1)
  std::size_t busiest_stage = 0;
  std::vector<StageSimResult> stages;
};
// Simulates one steady-state step of the pipeline whose stages `stages` are (make_stage_workloads).
// ConfigError naming the field when the machine lacks a figure the stages need.
PipelineSimResult simulate_pipelined_step(std::span<const StepWorkload> stages, const SimMachine& machine);
// The simulated timeline as Chrome trace JSON, one process per stage. Throws IoError.
void write_stage_trace(const PipelineSimResult& result, const std::string& path);

}  // namespace strata::sim
