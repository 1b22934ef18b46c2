// The optimizer state on host memory or NVMe (engine/state_home.h; Note [Offload] in
// engine/zero_engine.h): each rank's master weights and moments live on the optimizer tier in
// chunks (engine/offload_tier.h), never on the device. Each micro-batch's reduced gradient goes
// device -> host on a transfer stream and is combined there (the same binary-counter tree, the same
// bits) into fp32 chunks on the same tier by the offload host thread (engine/host_executor.h),
// which waits on the event recorded after the reduction and works while backward goes on (Note
// [Host-driven offload] in docs/DESIGN.md); the last micro-batch forms the final gradient and its
// per-block sums of squares. The step streams
// the chunks through the pinned pool (Note [Chunk pipeline] in engine/offload_tier.h): NVMe read -> CPU update ->
// low-precision pack -> NVMe write or device upload, several chunks in flight; where it can, the
// update runs during backward (Note [Overlapped update] in engine/state_home_tiered.cc). With offload_param (stage 3)
// the sharded working weights live on the parameter tier too, and fetches bring them NVMe -> pinned slot ->
// device: the host waits for the NVMe reads, then enqueues the copies up, and the slot returns with
// the event recorded after them. Each chunk lives on its own tier (host or NVMe) as the plan says. Files: engine/state_home_tiered.cc (set-up, sums, update), engine/state_home_tiered_state.cc
// (checkpoints). Not part of the engine's interface.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "engine/chunk_fields.h"
#include "engine/host_executor.h"
#include "engine/state_home.h"
#include "offload/swap_store.h"

namespace strata {

class TieredStateHome final : public StateHome, public ParamTier {
 public:
  TieredStateHome(EngineContext& ctx, WorkingWeights& weights);
  ~TieredStateHome() override;

  void init_group(std::size_t g, const float* master_full, const void* working_full) override;
  float* device_master(std::size_t /*g*/) const override { return nullptr; }
  void synchronize() override { executor_->drain(); }

  bool prepare_step(double lr) override;
  bool take_overlap(double lr) override;
  void add_unit(std::size_t g, DeviceMemory reduced, int unit) override;
  void finish_grads() override { executor_->drain(); }
  std::vector<double> block_partials(std::size_t g) override { return block_partials_[g]; }
  bool partials_are_shards() const override { return true; }
  optim::ExactSquares exact_squares(std::size_t g) override;
  void update(double lr, float grad_scale, std::int64_t step) override;
  void drop_grads() override;
  void end_step() override {}

  std::vector<StateChunkInfo> pieces() const override;
  std::size_t export_depth() const override;
  StatePiece fetch_piece(std::size_t index, const StateChunkInfo& c, std::vector<HostBuffer>& spare) override;
  void import_state(const StateSource& source) override;
  std::vector<float> master_range(std::size_t g) override;
  bool arm_capture(StateCaptureSink sink) override;
  void disarm_capture() override { capture_ = nullptr; }
  std::size_t captured_pieces() const override { return captured_.load(); }

  ParamTier* param_tier() override { return params_ ? this : nullptr; }
  std::shared_ptr<offload::BufferLease> reserve_param_slot(std::size_t g) override;
  void upload_params(std::size_t g, void* dst, std::shared_ptr<offload::BufferLease> slot) override;

  StateHomeStats stats() const override;

 private:
  std::size_t state_bytes(std::size_t elems) const { return static_cast<std::size_t>(nstate_) * 4 * elems; }

  void combine(std::size_t g, const void* reduced, int unit, bool last, bool overlap);
  ChunkJob combine_job(std::size_t g, std::size_t k, const void* reduced, int unit, bool last, bool overlap);
  void final_chunk(std::size_t g, const StateChunk& c, const float* grad, bool overlap, float* state, std::byte* wout);
  void update_chunk(std::size_t g, const StateChunk& c, float* state, const float* grad, std::byte* wout,
                    float grad_scale, std::int64_t step);
  void add_capture(ChunkJob& job, std::size_t g, std::size_t k, std::size_t field, std::size_t bytes);

  EngineContext& ctx_;
  WorkingWeights& weights_;
  // Where chunk k of group g keeps its state, its gradient sums and its working weights: each chunk has its own tier
  // (Note [Spill across tiers], plan/run_plan.cc).
  Home state_tier(std::size_t g, std::size_t k) const { return tier_home(ctx_.group(g).chunks[k].state); }
  Home grad_tier(std::size_t g, std::size_t k) const { return tier_home(ctx_.group(g).chunks[k].grads); }
  Home weights_tier(std::size_t g, std::size_t k) const { return tier_home(ctx_.group(g).chunks[k].params); }

  bool params_ = false;  // stage-3 sharded working weights live on the parameter tier
  int nstate_ = 3;  // fp32 arrays per element in a state chunk: master, moment1[, moment2]
  std::size_t chunk_elems_ = 0;
  std::unique_ptr<offload::IoEngine> io_;
  std::unique_ptr<offload::SwapStore> swap_;
  std::unique_ptr<TierStore> store_;
  std::unique_ptr<offload::BufferPool> pool_;        // the optimizer's chunk pipeline
  std::unique_ptr<offload::BufferPool> param_pool_;  // NVMe -> device parameter fetches
  std::unique_ptr<HostExecutor> executor_;  // gradient combines and overlapped updates (host work, in order)
  std::unique_ptr<Stream> transfer_;        // d2h of reduced gradients, h2d of new weights
  // Parameter slots whose copies up may still run, each with the event recorded after them, oldest
  // first; a slot returns to the pool once its event has completed (reserve_param_slot).
  struct SlotInFlight {
    std::unique_ptr<Event> copied;
    std::shared_ptr<offload::BufferLease> slot;
  };
  std::deque<SlotInFlight> slots_in_flight_;
  // Per group: the per-block sums of squares of the step's final gradient (taken when it is formed,
  // chunk by chunk; outside exact mode).
  std::vector<std::vector<double>> block_partials_;
  // Exact mode: the exact sums of squares of the same gradient, one per chunk, kept at the index of
  // the chunk's first block (the other entries stay zero).
  std::vector<std::vector<optim::ExactSquares>> exact_partials_;
  bool overlap_step_ = false;  // this step's updates run as gradients become final
  double overlap_lr_ = 0;
  std::atomic<std::uint64_t> overlapped_chunks_{0};
  std::atomic<std::uint64_t> chunk_updates_{0};
  std::atomic<std::uint64_t> copy_bytes_{0};
  // See Note [Checkpoint capture] in engine/state_home_tiered_state.cc.
  // Armed for one step by arm_capture.
  StateCaptureSink capture_;
  std::vector<std::size_t> capture_first_;  // piece index of each group's first chunk
  std::atomic<std::size_t> captured_{0};
};

}  // namespace strata
