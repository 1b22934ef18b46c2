// ZeroEngine: ZeRO stages 0-3 behind the ParamProvider contract (plan/param_provider.h).
//
// Per param group (plan/partition.h: one flat buffer, padded into shard_count aligned shards):
//   stage 0: full working weights W, full fp32 master/moments on every rank;
//   stage 1: full W; master/moments sharded; full gradients (all-reduce);
//   stage 2: full W; master/moments and gradients sharded (reduce-scatter);
//   stage 3: W sharded too: acquire_params gathers the full W into a temporary buffer on the
//            engine's communication stream and release_params frees it; groups under
//            stage3_param_persistence_threshold stay gathered.
// With a sharding factor F, state is sharded over groups of F consecutive ranks and replicated
// across the groups (gradients: reduce-scatter inside the group, then all-reduce across groups).
//
// Prefetch: the first step records the order of acquisitions (the trace); later steps gather ahead
// along it, bounded by stage3_prefetch_bucket_size (elements in flight ahead) and
// stage3_max_live_parameters (elements gathered at once), and keep a released group when its next
// use is inside that window. A different order replaces the trace. Fetches are ordered with events:
// the compute stream waits on the gather's event, the free waits on the compute stream.
//
// Note [Exact gradient sums]: a step's gradient is the sum of W*A unit gradients (W ranks, A
// micro-batches), unit u = a*W + r being micro-batch a of rank r (the data sampler hands out units
// by that index). In exact mode the sum is taken on one fixed pairwise tree over u: each
// micro-batch's gradients are reduced across ranks right away on the tree over ranks
// (Note [Deterministic reduction], comm/communicator.h), and the per-micro-batch results are
// combined across micro-batches by a binary counter (log2(A)+1 partial buffers) whose merges are
// the upper levels of the same tree. For W and A powers of two the result has the same bits for any
// split of W*A into ranks and micro-batches, any stage and any sharding factor. The global gradient
// norm is summed per optimizer block (blocks never straddle shards) and then over all blocks in
// model order, so it too is independent of the partitioning. In fast mode the micro-batch results
// are simply added into one fp32 accumulator.
//
// The optimizer (optim/) runs where the state lives: device-resident state is updated by device
// ops (engine/device_ops.h: the CPU kernels on the sim device, whose memory is host memory); state
// on a tier by the CPU optimizer. On the cuda device the same device ops launch their CUDA kernels
// on the engine's streams (tests/tools/train_cuda_test.sh checks it against sim).
//
// The engine is the orchestration of four parts (engine/engine_context.h lists them): the working
// weights (engine/working_weights.h), the parameter fetcher (trace, prefetch, gather, release;
// engine/param_fetcher.h), the gradient reducer (micro-batch buffers, reductions across ranks;
// engine/grad_reducer.h) and the optimizer-state home (on the device or on host/NVMe tiers behind
// one interface; engine/state_home.h). step() takes the phase decision from optim
// (optim/optimizer_phase.h) and has the home apply it.
//
// Note [Offload]: with zero_optimization.offload_optimizer on cpu or nvme, each rank's master
// weights and moments live on that tier in chunks (engine/offload_tier.h), never on the device.
// Each micro-batch's reduced gradient goes device -> host on a transfer stream and is combined
// there (same binary-counter tree, same bits) into fp32 chunks on the same tier, by a worker stream
// that runs while backward goes on; the last micro-batch forms the final gradient and its per-block
// sums of squares. The step streams the chunks through the pinned pool (Note [Chunk pipeline] in
// engine/offload_tier.h): NVMe read -> CPU update -> low-precision pack -> NVMe write or device upload, several chunks
// in flight. When the update cannot depend on the whole step (no gradient clipping, no fp16 loss
// scale) and prepare_step(lr) announced the step, the update of a group's chunks runs right when
// its final gradient is formed, overlapped with the rest of backward (Note [Overlapped update] in
// engine/state_home_tiered.cc). With offload_param on cpu or nvme (stage 3), the sharded working weights live on that
// tier too and gathers bring them NVMe -> pinned slot -> device ahead of use along the prefetch trace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/device/device.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "engine/engine_state.h"
#include "engine/offload_tier.h"
#include "plan/param_provider.h"
#include "plan/part_bytes.h"  // init_staging_bytes, what construction holds on the host
#include "plan/partition.h"
#include "plan/run_plan.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"

namespace strata {

struct EngineContext;
class WorkingWeights;
class StateHome;
class ParamFetcher;
class GradReducer;

// Offload to host memory or NVMe on a cuda device is refused by the engine until it has run
// correctly on a GPU (zero_engine.cc); STRATA_CUDA_OFFLOAD=1 opts in, for the GPU tests.
bool cuda_offload_opted_in();

struct StepResult {
  bool applied = true;      // false: non-finite gradients, the step was skipped (fp16)
  double grad_norm = 0.0;   // of the mean gradient, before clipping
  double loss_scale = 1.0;  // the scale the gradients carried
  double lr = 0.0;
};

class ZeroEngine final : public ParamProvider, private EngineCheckpoint {
 public:
  // Fills `out` (the tensor's elements, fp32) with the initial value of tensor `tensor` of group
  // `group`. Must give the same values on every rank.
  using InitFn = std::function<void(std::size_t group, std::size_t tensor, std::span<float> out)>;

  // Places the state as `plan` says (plan/run_plan.h: make_run_plan for this config, these groups
  // and this rank of `world`).
  ZeroEngine(const TrainConfig& config, Device& device, Communicator& world, std::vector<ParamGroupSpec> groups,
             const InitFn& init, RunPlan plan);
  // The same with the plan made here.
  ZeroEngine(const TrainConfig& config, Device& device, Communicator& world, std::vector<ParamGroupSpec> groups,
             const InitFn& init);
  ~ZeroEngine() override;
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // ParamProvider.
  std::span<const ParamGroupSpec> groups() const override { return specs_; }
  GroupViews acquire_params(std::size_t group, ParamPhase phase, Stream* stream) override;
  void release_params(std::size_t group, Stream* stream) override;
  GroupViews acquire_grads(std::size_t group, Stream* stream) override;
  void grads_ready(std::size_t group, Stream* stream) override;

  // Brackets one micro-batch's forward and backward (index 0..A-1 within the step).
  void begin_micro_batch();
  void end_micro_batch();
  // Brackets forward-only passes between steps (validation): parameters are acquired and released
  // as in a step, on every rank alike (stage 3 gathers are collectives), but the prefetch trace of
  // the steps is left as it was. No gradient may be acquired inside.
  void begin_evaluation();
  void end_evaluation();
  // Announces the learning rate of the step about to run, before its first micro-batch. With the
  // optimizer offloaded this lets the update overlap backward (Note [Overlapped update] in
  // engine/state_home_tiered.cc); without the call the step waits for step() as usual. step() must then get the same
  // lr.
  void prepare_step(double lr);
  // Ends the step: finishes the reductions, takes the global norm, clips, runs the optimizer with
  // learning rate `lr`, and publishes the new working weights. Every rank must call it.
  StepResult step(double lr);
  // Tensor parallelism (models/tensor_parallel.h): `group` holds the ranks with the other slices of
  // this rank's tensors, and shares[g] says how group g is held among them: a slice (Split), whole
  // and alike on each (Replicated), or a copy another rank of the group counts (Copy: replicated KV
  // heads). The step's gradient norm is then the whole model's: the split groups' squares summed
  // over the tensor group, the replicated groups' counted once, copies not at all; so every rank of
  // the group clips and skips alike. Null: no tensor parallelism.
  enum class TensorShare : std::uint8_t { Split, Replicated, Copy };
  void set_tensor_group(Communicator* group, std::vector<TensorShare> shares);
  // Pipeline parallelism (models/pipeline.h): `group` holds the other stages of this rank's model
  // replica, each with consecutive groups of the model; the step's gradient norm is summed over
  // them, so every stage clips and skips alike. Without a tensor group the stages' per-block
  // partials are summed in model order, as without stages: the norm's bits do not depend on P. In
  // exact mode the norm is an exact sum (Note [Exact sum of squares] in optim/exact_squares.h): its bits depend on
  // neither T nor P nor the ZeRO stage.
  // Null: no pipeline.
  void set_pipeline_group(Communicator* group) { pipeline_group_ = group; }

  // The factor the model must multiply its loss gradient by in the next micro-batches: the fp16
  // loss scale (1 in bf16 and fp32). step() divides it out again (optim::decide_phase).
  double loss_scale() const;
  // Where everything lives (plan/run_plan.h).
  const RunPlan& plan() const { return plan_; }
  // Full fp32 master weights of one tensor, gathered (every rank must call it; all get the values).
  std::vector<float> gather_master(std::size_t group, std::size_t tensor);
  // Device bytes held for model state (resident weights, master, moments, gradients; not the
  // temporary gathered copies of stage-3 groups) once the engine's queued
  // work has run (waits for its streams; the caller's compute streams are the caller's to drain).
  std::size_t model_state_device_bytes() const;
  // How many gathers the prefetcher issued ahead of use, and how many acquisitions found their
  // group already gathered (tests and the progress line).
  std::uint64_t prefetched_gathers() const;
  std::uint64_t gathers() const;
  // Offload: whether state lives on host/NVMe, the tiers' byte counts, and how many state chunks
  // were updated in all / during backward.
  bool optimizer_offloaded() const;
  TierIoStats tier_stats() const;
  std::uint64_t chunk_updates() const;
  std::uint64_t overlapped_chunk_updates() const;
  // Host<->device bytes moved for offloaded state (parameter fetches, gradients out, new weights in).
  std::uint64_t offload_copy_bytes() const;
  // Host bytes of the fixed pinned staging pools.
  std::size_t pinned_pool_bytes() const;

  // The checkpoint state (engine/engine_state.h; engine/zero_engine_state.cc, Note [Checkpoint state] in
  // engine/zero_engine_state.cc).
  EngineCheckpoint& checkpoint() { return *this; }
  const EngineCheckpoint& checkpoint() const { return *this; }

 private:
  // EngineCheckpoint (engine/zero_engine_state.cc).
  int state_arrays() const override;
  StateRange state_range(std::size_t group) const override;
  bool holds_primary_state() const override { return topo_.shard_group() == 0; }
  std::vector<StateChunkInfo> state_chunks() const override;
  void export_state(const StateSink& sink) override;
  bool capture_next_step(StateCaptureSink sink) override;
  std::size_t captured_pieces() const override;
  void import_state(const StateSource& source) override;
  EngineCounters counters() const override;
  void restore_counters(const EngineCounters& counters) override;

  void init_group(std::size_t g, const InitFn& init);
  void check_between_steps(const char* what) const;
  double global_sum_squares();
  // Exact mode's: the exact sum over every rank's gradients (Note [Exact sum of squares] in optim/exact_squares.h),
  // whose bits depend on no layout.
  double global_exact_sum_squares();

  TrainConfig config_;
  RunPlan plan_;
  Device& device_;
  Communicator& world_;
  Communicator* tensor_group_ = nullptr;  // set_tensor_group
  Communicator* pipeline_group_ = nullptr;  // set_pipeline_group
  std::vector<TensorShare> tensor_shares_;
  std::unique_ptr<Communicator> shard_comm_;
  std::unique_ptr<Communicator> replica_comm_;
  ShardTopology topo_;
  DType working_dtype_;
  int accumulation_;
  std::vector<ParamGroupSpec> specs_;
  std::unique_ptr<Stream> comm_stream_;
  optim::ParamGroup optimizer_;
  std::unique_ptr<optim::LossScaler> scaler_;  // fp16 only
  // The parts (declared in the order they are built; destroyed in reverse).
  std::unique_ptr<EngineContext> ctx_;
  std::unique_ptr<WorkingWeights> weights_;
  std::unique_ptr<StateHome> home_;
  std::unique_ptr<ParamFetcher> fetcher_;
  std::unique_ptr<GradReducer> reducer_;
};

}  // namespace strata
