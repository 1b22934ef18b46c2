// ZeroEngine: ZeRO stages 0-3 with trace-based prefetch and exact gradient sums (see
// engine/zero_engine.h for the design and Note [Exact gradient sums] in engine/zero_engine.h). This file builds the
// parts (engine/engine_context.h) and runs a step through them.
#include "engine/zero_engine.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/dtype_bulk.h"
#include "core/error.h"
#include "engine/engine_context.h"
#include "engine/grad_reducer.h"
#include "engine/param_fetcher.h"
#include "engine/state_home.h"
#include "engine/working_weights.h"
#include "optim/grad_stats.h"
#include "optim/optimizer_phase.h"

namespace strata {

namespace {

std::unique_ptr<optim::LossScaler> make_scaler(const TrainConfig& config) {
  if (config.precision != Precision::Fp16) return nullptr;
  optim::LossScalerConfig sc;
  sc.static_loss_scale = config.fp16.loss_scale;
  sc.initial_scale_power = config.fp16.initial_scale_power;
  sc.loss_scale_window = config.fp16.loss_scale_window;
  sc.hysteresis = config.fp16.hysteresis;
  sc.consecutive_hysteresis = config.fp16.consecutive_hysteresis;
  sc.min_loss_scale = config.fp16.min_loss_scale;
  return std::make_unique<optim::LossScaler>(sc, "fp16");
}

// Offload has not yet run right on a GPU (docs/GPU_LOG.md): its host-driven design (see Note
// [Host-driven offload] in docs/DESIGN.md) has not run on one. Until it does, a cuda run
// whose plan puts the optimizer state (or the parameters) on the host or NVMe is refused before
// any step, saying how to train it instead; STRATA_CUDA_OFFLOAD=1 runs it anyway, for the tests
// that exercise it on a GPU (tests/tools/train_cuda_test.sh, tools/gpu-verify.sh).
void refuse_unverified_offload(const TrainConfig& config, const RunPlan& plan, const Device& device) {
  if (device.kind() != DeviceKind::Cuda || !(plan.optimizer_offloaded() || plan.params_offloaded())) return;
  if (cuda_offload_opted_in()) {
    spdlog::warn("STRATA_CUDA_OFFLOAD=1: offloading to {} on {}, which has not yet run correctly on a GPU",
                 home_name(plan.offload.optimizer), device.name());
    return;
  }
  throw ConfigError(fmt::format(
      "{}: the optimizer state goes to {} (zero_optimization.offload_optimizer.device, or the tier plan because it "
      "does not fit {}), but offload on a cuda device does not run correctly yet (README, \"How the CUDA path is "
      "verified\"). Train offloaded runs on the sim device (strata.device.kind \"sim\"), or on the GPU without "
      "offload (zero_optimization.offload_optimizer.device \"none\", with a model that fits)",
      config.source, plan.offload.optimizer == Home::Nvme ? "NVMe" : "host memory", device.name()));
}

}  // namespace

bool cuda_offload_opted_in() {
  const char* v = std::getenv("STRATA_CUDA_OFFLOAD");
  return v != nullptr && std::string_view(v) == "1";
}

ZeroEngine::ZeroEngine(const TrainConfig& config, Device& device, Communicator& world,
                       std::vector<ParamGroupSpec> groups, const InitFn& init)
    : ZeroEngine(config, device, world, groups, init, make_run_plan(config, groups, world.world_size(), world.rank())) {}

ZeroEngine::ZeroEngine(const TrainConfig& config, Device& device, Communicator& world,
                       std::vector<ParamGroupSpec> groups, const InitFn& init, RunPlan plan)
    : config_(config),
      plan_(std::move(plan)),
      device_(device),
      world_(world),
      topo_(plan_.topo),
      working_dtype_(plan_.working),
      accumulation_(config.gradient_accumulation_steps),
      specs_(std::move(groups)),
      optimizer_(make_optimizer(config.optimizer)),
      scaler_(make_scaler(config)) {
  STRATA_CHECK(plan_.groups.size() == specs_.size() && plan_.topo.rank == world.rank() &&
                   plan_.topo.world_size == world.world_size(),
               "run plan of {} groups for rank {} of {}, engine of {} groups on rank {} of {}", plan_.groups.size(),
               plan_.topo.rank, plan_.topo.world_size, specs_.size(), world.rank(), world.world_size());
  refuse_unverified_offload(config, plan_, device);
  if (topo_.world_size > 1 && (std::popcount(static_cast<unsigned>(topo_.world_size)) != 1) && config.strata.exact) {
    spdlog::warn("exact mode: world size {} is not a power of two; results are deterministic but not bit-identical "
                 "to other world sizes (Note [Exact gradient sums] in engine/zero_engine.h)",
                 topo_.world_size);
  }
  shard_comm_ = world_.split(topo_.shard_group(), topo_.rank);
  replica_comm_ = world_.split(topo_.shard_index(), topo_.rank);
  comm_stream_ = device_.create_stream("zero.comm");
  ctx_ = std::make_unique<EngineContext>(EngineContext{config_, plan_, device_, world_, *shard_comm_, *replica_comm_,
                                                       *comm_stream_, optimizer_, optim::default_cpu_exec()});
  weights_ = std::make_unique<WorkingWeights>(*ctx_);
  home_ = make_state_home(*ctx_, *weights_);
  fetcher_ = std::make_unique<ParamFetcher>(*ctx_, *weights_, home_->param_tier(),
                                            [home = home_.get()] { home->synchronize(); });
  reducer_ = std::make_unique<GradReducer>(*ctx_, specs_, *fetcher_, *home_);
  for (std::size_t g = 0; g < specs_.size(); ++g) init_group(g, init);
  spdlog::debug("zero engine: stage {}, {} groups, world {}, sharding factor {}, working dtype {}", plan_.stage,
                specs_.size(), topo_.world_size, topo_.sharding_factor, dtype_name(working_dtype_));
}

// Group g's initial values go where the plan says: the fp32 master and zeroed moments to the state
// home, W to the working weights (or, on the parameter tier, to the home).
void ZeroEngine::init_group(std::size_t g, const InitFn& init) {
  const GroupLayout& L = plan_.groups[g].layout;
  std::vector<float> host(L.total_elems(), 0.0f);
  for (std::size_t t = 0; t < L.slots().size(); ++t) {
    const TensorSlot& s = L.slots()[t];
    init(g, t, std::span<float>(host.data() + s.offset_elems, s.elems));
  }
  std::vector<std::uint16_t> narrow_host;
  const void* w_source = host.data();
  if (working_dtype_ != DType::F32) {
    narrow_host.resize(L.total_elems());
    convert_parallel(host.data(), DType::F32, narrow_host.data(), working_dtype_, L.total_elems());
    w_source = narrow_host.data();
  }
  home_->init_group(g, host.data(), w_source);
  weights_->init_group(g, w_source, home_->device_master(g));
  // The host staging vectors die at the end of this call: wait for the copies.
  comm_stream_->synchronize();
}

ZeroEngine::~ZeroEngine() {
  // Let queued communication that still reads our buffers finish before they are freed (the state
  // home waits for its own streams). The caller's compute streams are the caller's to drain (they
  // may already be gone).
  try {
    if (comm_stream_) comm_stream_->synchronize();
  } catch (const std::exception& e) {
    spdlog::error("zero engine shutdown: {}", e.what());
  }
}

GroupViews ZeroEngine::acquire_params(std::size_t g, ParamPhase phase, Stream* stream) {
  return fetcher_->acquire(g, phase, stream);
}
void ZeroEngine::release_params(std::size_t g, Stream* stream) { fetcher_->release(g, stream); }
GroupViews ZeroEngine::acquire_grads(std::size_t g, Stream* stream) { return reducer_->acquire(g, stream); }
void ZeroEngine::grads_ready(std::size_t g, Stream* stream) { reducer_->ready(g, stream); }
void ZeroEngine::begin_micro_batch() { reducer_->begin_micro_batch(); }
void ZeroEngine::end_micro_batch() { reducer_->end_micro_batch(); }

void ZeroEngine::begin_evaluation() {
  STRATA_CHECK(!reducer_->in_micro_batch() && (specs_.empty() || reducer_->units(0) == 0),
               "an evaluation runs between steps, not inside one");
  fetcher_->begin_evaluation();
}

void ZeroEngine::end_evaluation() { fetcher_->end_evaluation(); }

void ZeroEngine::prepare_step(double lr) {
  STRATA_CHECK(!reducer_->in_micro_batch() && (specs_.empty() || reducer_->units(0) == 0),
               "prepare_step() must come before the step's first micro-batch");
  home_->prepare_step(lr);
}

StepResult ZeroEngine::step(double lr) {
  STRATA_CHECK(!reducer_->in_micro_batch(), "step() inside a micro-batch");
  for (std::size_t g = 0; g < specs_.size(); ++g) {
    STRATA_CHECK(reducer_->units(g) == accumulation_, "step() after {} of {} micro-batches of group {}",
                 reducer_->units(g), accumulation_, plan_.groups[g].layout.name());
  }
  const bool overlapped = home_->take_overlap(lr);
  // Host sync, on purpose: whether to skip, the clip coefficient and the loss scale are host
  // decisions that need every gradient reduced first.
  comm_stream_->synchronize();
  home_->synchronize();
  home_->finish_grads();
  const double sum_squares = global_sum_squares();

  // The phase's decision is optim's (optim/optimizer_phase.h, the same code the CPU phase and
  // `strata bench adam` run): skip on a non-finite norm, else clip and unscale into grad_scale.
  optim::PhaseOptions phase_options;
  phase_options.max_grad_norm = config_.gradient_clipping;
  phase_options.grad_divisor = static_cast<double>(accumulation_) * topo_.world_size;
  const optim::PhaseResult phase = optim::decide_phase(optim::GradStats{sum_squares}, scaler_.get(), phase_options);
  StepResult result;
  result.applied = phase.applied;
  result.grad_norm = phase.grad_norm;
  result.loss_scale = phase.loss_scale;
  result.lr = lr;
  if (!phase.applied) {
    home_->drop_grads();
  } else {
    const std::int64_t step = optimizer_.step_count() + 1;
    if (!overlapped) home_->update(lr, phase.grad_scale, step);
    optimizer_.set_step_count(step);
    weights_->publish(/*from_master=*/true);
  }
  home_->disarm_capture();  // armed for this step only (Note [Checkpoint capture] in engine/state_home_tiered_state.cc)
  // Ready for the next step: sums dropped, gathered copies (now stale) freed, the trace kept or
  // replaced, and the next step's first groups prefetched.
  reducer_->end_step();
  home_->end_step();
  fetcher_->end_step();
  return result;
}

void ZeroEngine::set_tensor_group(Communicator* group, std::vector<TensorShare> shares) {
  STRATA_CHECK(group == nullptr || shares.size() == specs_.size(), "{} tensor shares for {} groups", shares.size(),
               specs_.size());
  tensor_group_ = group;
  tensor_shares_ = std::move(shares);
}

// Global sum of squares: one partial per optimizer block, summed over all blocks in model order.
// Where the partials cover this rank's shard only, the shard group's ranks exchange them first
// (blocks never straddle shards, so the concatenation is the same list of partials in the same
// order as the whole gradient's).
double ZeroEngine::global_sum_squares() {
  if (config_.strata.exact) return global_exact_sum_squares();
  double split = 0.0, replicated = 0.0, copies = 0.0;  // with a tensor group: slices, whole, counted elsewhere
  std::vector<double> ordered;                         // every partial in model order (for the pipeline's sum)
  for (std::size_t g = 0; g < specs_.size(); ++g) {
    const TensorShare share = tensor_group_ == nullptr ? TensorShare::Split : tensor_shares_[g];
    double& sum_squares = share == TensorShare::Replicated ? replicated : share == TensorShare::Copy ? copies : split;
    const std::vector<double> partials = home_->block_partials(g);
    const int shards = plan_.groups[g].layout.shard_count();
    std::vector<double> all = partials;
    if (home_->partials_are_shards() && shards > 1) {
      const std::size_t blocks = partials.size();
      all.resize(blocks * static_cast<std::size_t>(shards));
      for (int r = 0; r < shards; ++r) {
        std::vector<double> part = partials;
        shard_comm_->broadcast_host_bytes(part.data(), part.size() * sizeof(double), r);
        std::copy(part.begin(), part.end(), all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * blocks));
      }
    }
    for (double p : all) sum_squares += p;
    ordered.insert(ordered.end(), all.begin(), all.end());
  }
  const double model = tensor_group_ == nullptr ? split : tensor_group_->all_reduce_host(split, ReduceOp::Sum) + replicated;
  if (pipeline_group_ == nullptr) return model;
  if (tensor_group_ != nullptr) return pipeline_group_->all_reduce_host(model, ReduceOp::Sum);
  // The stages hold consecutive groups of the model: their partials, stage after stage, are the
  // whole model's in model order, summed as a run without stages sums them (so clipping in exact
  // mode gives the same bits for every P).
  double total = 0.0;
  for (int q = 0; q < pipeline_group_->world_size(); ++q) {
    std::vector<double> part = q == pipeline_group_->rank() ? ordered : std::vector<double>();
    std::uint64_t n = part.size();
    pipeline_group_->broadcast_host_bytes(&n, sizeof n, q);
    part.resize(n);
    pipeline_group_->broadcast_host_bytes(part.data(), n * sizeof(double), q);
    for (double p : part) total += p;
  }
  return total;
}

namespace {

// Every rank of `comm` ends with the merge of all ranks' sums (exact, so the order is free).
optim::ExactSquares merge_over(Communicator& comm, const optim::ExactSquares& mine) {
  optim::ExactSquares all;
  for (int r = 0; r < comm.world_size(); ++r) {
    optim::ExactSquares part = mine;
    comm.broadcast_host_bytes(&part, sizeof part, r);
    all.merge(part);
  }
  return all;
}

}  // namespace

// The same groups as global_sum_squares, each counted once: a shard group's ranks merge their
// shards, the tensor group its slices (replicated groups counted on every rank alike, copies not at
// all), the pipeline group its stages. Exact sums merge in any order, so the bits are those of
// one rank summing the whole model.
double ZeroEngine::global_exact_sum_squares() {
  optim::ExactSquares split, replicated;
  for (std::size_t g = 0; g < specs_.size(); ++g) {
    const TensorShare share = tensor_group_ == nullptr ? TensorShare::Split : tensor_shares_[g];
    if (share == TensorShare::Copy) continue;
    optim::ExactSquares sum = home_->exact_squares(g);
    if (home_->partials_are_shards() && plan_.groups[g].layout.shard_count() > 1) sum = merge_over(*shard_comm_, sum);
    (share == TensorShare::Replicated ? replicated : split).merge(sum);
  }
  if (tensor_group_ != nullptr) split = merge_over(*tensor_group_, split);
  split.merge(replicated);
  if (pipeline_group_ != nullptr) split = merge_over(*pipeline_group_, split);
  return split.value();
}

std::vector<float> ZeroEngine::gather_master(std::size_t g, std::size_t tensor) {
  STRATA_CHECK(g < specs_.size(), "param group {} of {}", g, specs_.size());
  const GroupPlan& P = plan_.groups[g];
  STRATA_CHECK(tensor < P.layout.slots().size(), "tensor {} of group {}", tensor, P.layout.name());
  const std::size_t total = P.layout.total_elems();
  std::vector<float> full = home_->master_range(g);
  if (P.layout.shard_count() > 1) {
    std::vector<float> mine = std::move(full);
    full.assign(total, 0.0f);
    // At the plan's sizes (see Note [Part bytes] in plan/part_bytes.h: export_shard_bytes,
    // export_gather_bytes), through the fetcher: on a full device it gives back the gathered copies
    // nobody holds (the next step's prefetch) and waits for queued frees, so the export fits where
    // the step's window was (TierPlan::device_export).
    const std::size_t no_group_kept = specs_.size();
    DeviceMemory src = fetcher_->allocate(export_shard_bytes(plan_, g), "io.gather", no_group_kept);
    DeviceMemory tmp = fetcher_->allocate(export_gather_bytes(plan_, g), "io.gather", no_group_kept);
    comm_stream_->copy_h2d(src.data(), mine.data(), P.state_elems * sizeof(float));
    shard_comm_->all_gather(src.data(), tmp.data(), P.layout.shard_elems(), DType::F32, *comm_stream_);
    comm_stream_->copy_d2h(full.data(), tmp.data(), total * sizeof(float));
    comm_stream_->release_after(std::move(src));
    comm_stream_->release_after(std::move(tmp));
    comm_stream_->synchronize();  // `mine` is the source of the queued copy
  }
  const TensorSlot& s = P.layout.slots()[tensor];
  return std::vector<float>(full.begin() + static_cast<std::ptrdiff_t>(s.offset_elems),
                            full.begin() + static_cast<std::ptrdiff_t>(s.offset_elems + s.elems));
}

std::size_t ZeroEngine::model_state_device_bytes() const {
  // Frees queued with release_after count until they run.
  comm_stream_->synchronize();
  home_->synchronize();
  std::size_t bytes = 0;
  for (const auto& [tag, b] : device_.memory_stats().bytes_by_tag) {
    if (tag == "param.gathered" || tag == "param.shard") continue;  // working copies, not state
    if (tag.rfind("param.", 0) == 0 || tag.rfind("optim.", 0) == 0 || tag.rfind("grad.", 0) == 0) bytes += b;
  }
  return bytes;
}

double ZeroEngine::loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
std::uint64_t ZeroEngine::prefetched_gathers() const { return fetcher_->prefetched(); }
std::uint64_t ZeroEngine::gathers() const { return fetcher_->gathers(); }
bool ZeroEngine::optimizer_offloaded() const { return plan_.optimizer_offloaded(); }
TierIoStats ZeroEngine::tier_stats() const { return home_->stats().tiers; }
std::uint64_t ZeroEngine::chunk_updates() const { return home_->stats().chunk_updates; }
std::uint64_t ZeroEngine::overlapped_chunk_updates() const { return home_->stats().overlapped_updates; }
std::uint64_t ZeroEngine::offload_copy_bytes() const { return home_->stats().copy_bytes; }
std::size_t ZeroEngine::pinned_pool_bytes() const { return home_->stats().pinned_pool_bytes; }

}  // namespace strata
