// ZeroEngine's private state, shared by engine/zero_engine.cc (stages, gathers, reductions, the
// step) and engine/zero_engine_offload.cc (host and NVMe tiers). Not part of the engine's interface.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/offload_tier.h"
#include "engine/run_plan.h"
#include "engine/zero_engine.h"
#include "offload/buffer_pool.h"
#include "offload/io_engine.h"
#include "offload/swap_store.h"
#include "optim/cpu_exec.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"

namespace strata {

// dst[i] = left[i] + dst[i] (the left operand is the older partial sum: tree order matters).
void add_left(float* dst, const float* left, std::size_t n);

struct ZeroEngine::Group {
  explicit Group(const GroupPlan& p) : plan(p), layout(p.layout) {}

  const GroupPlan& plan;  // placement (engine/run_plan.h); owned by the engine's RunPlan
  const GroupLayout& layout;

  DeviceMemory w_full;   // gathered working weights kept resident (empty: aliases master)
  DeviceMemory w_shard;  // sharded_params: this rank's shard of W (empty: aliases master or offloaded)
  DeviceMemory master;   // empty when the optimizer state is offloaded
  DeviceMemory moment1;
  DeviceMemory moment2;

  DeviceMemory gathered;  // stage 3: the full W while gathered
  std::unique_ptr<Event> gathered_event;
  Stream* last_use_stream = nullptr;
  int live = 0;

  DeviceMemory micro_grad;  // this micro-batch's full gradients, working dtype
  std::unique_ptr<Event> grad_event;
  int ready_count = 0;
  bool reduced_this_micro = false;
  int units = 0;                     // micro-batches combined this step
  std::vector<DeviceMemory> levels;  // exact: binary-counter partial sums (fp32, grad_elems)
  DeviceMemory accum;                // fast: one fp32 accumulator

  // Offloaded optimizer state: the per-block sums of squares of the step's final gradient (taken
  // when it is formed, chunk by chunk).
  std::vector<double> block_partials;

  void* w_full_ptr() const { return plan.weights == WeightsForm::FullIsMaster ? master.data() : w_full.data(); }
  void* w_shard_ptr() const { return plan.weights == WeightsForm::ShardIsMaster ? master.data() : w_shard.data(); }
};

// Host/NVMe tiers (engine/zero_engine_offload.cc).
struct ZeroOffload {
  bool optimizer = false;  // master and moments (and the gradients they consume) live on `opt_tier`
  Tier opt_tier = Tier::Host;
  bool params = false;  // stage-3 sharded working weights live on `param_tier`
  Tier param_tier = Tier::Host;
  int nstate = 3;  // fp32 arrays per element in a state chunk: master, moment1[, moment2]
  std::size_t chunk_elems = 0;  // RunPlan::offload.chunk_elems
  std::unique_ptr<offload::IoEngine> io;
  std::unique_ptr<offload::SwapStore> swap;
  std::unique_ptr<TierStore> store;
  std::unique_ptr<offload::BufferPool> pool;        // the optimizer's chunk pipeline
  std::unique_ptr<offload::BufferPool> param_pool;  // NVMe -> device parameter fetches
  std::unique_ptr<Stream> worker;    // gradient combines and overlapped updates (host work, in order)
  std::unique_ptr<Stream> transfer;  // d2h of reduced gradients, h2d of new weights (from the worker)
  bool overlap_step = false;         // this step's updates run as gradients become final
  double overlap_lr = 0;
  std::atomic<std::uint64_t> overlapped_chunks{0};
  std::atomic<std::uint64_t> chunk_updates{0};
  std::atomic<std::uint64_t> copy_bytes{0};  // host<->device bytes moved for offloaded state
  // Note [Checkpoint capture]: armed for one step by capture_next_step.
  ZeroEngine::StateCaptureSink capture;
  std::vector<std::size_t> capture_first;  // piece index of each group's first chunk
  std::atomic<std::size_t> captured{0};

  static std::string state_key(std::size_t g, std::size_t k) { return "o" + std::to_string(g) + "." + std::to_string(k); }
  static std::string grad_key(std::size_t g, std::size_t k) { return "g" + std::to_string(g) + "." + std::to_string(k); }
  static std::string param_key(std::size_t g, std::size_t k) { return "w" + std::to_string(g) + "." + std::to_string(k); }
  static std::string level_key(std::size_t g, int level, std::size_t k) {
    return "l" + std::to_string(g) + "." + std::to_string(level) + "." + std::to_string(k);
  }
};

struct ZeroEngine::Impl {
  explicit Impl(const TrainConfig& c) : optimizer(make_optimizer(c.optimizer)) {}
  optim::ParamGroup optimizer;
  std::unique_ptr<optim::LossScaler> scaler;
  optim::CpuExec exec = optim::default_cpu_exec();
  std::unique_ptr<Event> weights_event;  // recorded after the step publishes new weights
  bool weights_event_recorded = false;
  ZeroOffload off;
};

}  // namespace strata
