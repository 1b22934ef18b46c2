// ZeroEngine: ZeRO stages 0-3 with trace-based prefetch and exact gradient sums (see
// engine/zero_engine.h for the design and Note [Exact gradient sums]).
#include "engine/zero_engine.h"
#include "engine/zero_engine_internal.h"
#include "engine/device_ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <tbb/parallel_for.h>

#include "core/dtype_bulk.h"
#include "core/error.h"
#include "optim/cpu_exec.h"
#include "optim/grad_stats.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "optim/optimizer_phase.h"

namespace strata {

void add_left(float* dst, const float* left, std::size_t n) {
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 1 << 16), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t i = r.begin(); i < r.end(); ++i) dst[i] = left[i] + dst[i];
  });
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
      impl_(std::make_unique<Impl>(config)) {
  if (device.kind() != DeviceKind::Sim) {
    throw DeviceError(fmt::format("the ZeRO engine of this version runs on the sim device; {} is not wired yet "
                                  "(set strata.device.kind=sim)",
                                  device.name()));
  }
  STRATA_CHECK(plan_.groups.size() == specs_.size() && plan_.topo.rank == world.rank() &&
                   plan_.topo.world_size == world.world_size(),
               "run plan of {} groups for rank {} of {}, engine of {} groups on rank {} of {}", plan_.groups.size(),
               plan_.topo.rank, plan_.topo.world_size, specs_.size(), world.rank(), world.world_size());
  if (topo_.world_size > 1 && (std::popcount(static_cast<unsigned>(topo_.world_size)) != 1) && config.strata.exact) {
    spdlog::warn("exact mode: world size {} is not a power of two; results are deterministic but not bit-identical "
                 "to other world sizes (Note [Exact gradient sums])",
                 topo_.world_size);
  }
  if (config.precision == Precision::Fp16) {
    optim::LossScalerConfig sc;
    sc.static_loss_scale = config.fp16.loss_scale;
    sc.initial_scale_power = config.fp16.initial_scale_power;
    sc.loss_scale_window = config.fp16.loss_scale_window;
    sc.hysteresis = config.fp16.hysteresis;
    sc.consecutive_hysteresis = config.fp16.consecutive_hysteresis;
    sc.min_loss_scale = config.fp16.min_loss_scale;
    impl_->scaler = std::make_unique<optim::LossScaler>(sc, "fp16");
  }
  shard_comm_ = world_.split(topo_.shard_group(), topo_.rank);
  replica_comm_ = world_.split(topo_.shard_index(), topo_.rank);
  comm_stream_ = device_.create_stream("zero.comm");
  impl_->weights_event = device_.create_event();

  ready_per_micro_.assign(specs_.size(), 0);
  declared_ready_ = !specs_.empty();
  for (std::size_t g = 0; g < specs_.size(); ++g) {
    ready_per_micro_[g] = specs_[g].grads_ready_calls;
    declared_ready_ = declared_ready_ && specs_[g].grads_ready_calls > 0;
  }
  for (const GroupPlan& P : plan_.groups) {
    auto G = std::make_unique<Group>(P);
    G->gathered_event = device_.create_event();
    G->grad_event = device_.create_event();
    groups_.push_back(std::move(G));
  }
  if (plan_.optimizer_offloaded()) setup_offload();
  for (std::size_t g = 0; g < specs_.size(); ++g) init_group(g, init);
  spdlog::debug("zero engine: stage {}, {} groups, world {}, sharding factor {}, working dtype {}", plan_.stage,
                specs_.size(), topo_.world_size, topo_.sharding_factor, dtype_name(working_dtype_));
}

// Places group g's initial values where the plan says: the fp32 master and zeroed moments on the
// device or the optimizer tier, W as the plan's WeightsForm.
void ZeroEngine::init_group(std::size_t g, const InitFn& init) {
  Group* G = groups_[g].get();
  const GroupLayout& L = G->layout;
  const std::size_t wbytes = dtype_bytes(working_dtype_);
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
  const std::size_t state_elems = G->plan.state_elems;
  if (plan_.optimizer_offloaded()) {
    init_offloaded_group(g, host.data(), w_source);
  } else {
    G->master = device_.allocate(state_elems * sizeof(float), "optim.master");
    comm_stream_->copy_h2d(G->master.data(), host.data() + G->plan.state_offset, state_elems * sizeof(float));
    G->moment1 = device_.allocate(state_elems * sizeof(float), "optim.moments");
    comm_stream_->memset(G->moment1.data(), 0, state_elems * sizeof(float));
    if (plan_.state_arrays == 3) {
      G->moment2 = device_.allocate(state_elems * sizeof(float), "optim.moments");
      comm_stream_->memset(G->moment2.data(), 0, state_elems * sizeof(float));
    }
  }
  switch (G->plan.weights) {
    case WeightsForm::Shard:
      G->w_shard = device_.allocate(L.shard_elems() * wbytes, "param.w");
      comm_stream_->copy_h2d(G->w_shard.data(),
                             static_cast<const char*>(w_source) + L.shard_begin(plan_.shard_index) * wbytes,
                             L.shard_elems() * wbytes);
      break;
    case WeightsForm::Full:
      G->w_full = device_.allocate(L.total_elems() * wbytes, "param.w");
      comm_stream_->copy_h2d(G->w_full.data(), w_source, L.total_elems() * wbytes);
      break;
    case WeightsForm::FullIsMaster:
    case WeightsForm::ShardIsMaster:
    case WeightsForm::ShardOnTier:  // init_offloaded_group put it on the parameter tier
      break;
  }
  // The host staging vectors die at the end of this call: wait for the copies.
  comm_stream_->synchronize();
}

ZeroEngine::~ZeroEngine() {
  // Let queued communication that still reads our buffers finish before they are freed. The
  // caller's compute streams are the caller's to drain (they may already be gone).
  try {
    if (comm_stream_) comm_stream_->synchronize();
    if (impl_->off.worker) impl_->off.worker->synchronize();
    if (impl_->off.transfer) impl_->off.transfer->synchronize();
  } catch (const std::exception& e) {
    spdlog::error("zero engine shutdown: {}", e.what());
  }
}

ZeroEngine::Group& ZeroEngine::group(std::size_t g) {
  STRATA_CHECK(g < groups_.size(), "param group {} of {}", g, groups_.size());
  return *groups_[g];
}

GroupViews ZeroEngine::views_of(std::size_t g, void* base, DType dtype) const {
  GroupViews v;
  for (const TensorSlot& s : groups_[g]->layout.slots()) {
    v.tensors.push_back(static_cast<char*>(base) + s.offset_elems * dtype_bytes(dtype));
  }
  return v;
}

void ZeroEngine::start_gather(std::size_t g, bool prefetch) {
  Group& G = group(g);
  ZeroOffload& off = impl_->off;
  const std::size_t total = G.layout.total_elems();
  const std::size_t wbytes = dtype_bytes(working_dtype_);
  const bool from_tier = off.params && G.plan.sharded_params;
  // An NVMe-resident shard needs a pinned slot; a prefetch does not wait for one.
  // Note [Deterministic prefetch]: every rank must issue the same gathers (collectives) in the same
  // order, so no decision may depend on timing: a pinned slot is waited for (the comm stream frees
  // slots on its own), and a prefetch that finds the device full first lets every queued free run
  // (after which the memory state is the same on every rank) before it gives up.
  std::shared_ptr<offload::BufferLease> slot;
  if (from_tier && off.param_tier == Tier::Nvme) {
    slot = std::make_shared<offload::BufferLease>(off.param_pool->acquire());
  }
  DeviceMemory gathered = allocate_device(total * wbytes, "param.gathered", g, prefetch);
  const void* shard_src = G.w_shard_ptr();
  if (from_tier) {
    DeviceMemory shard_dev;
    void* dst = gathered.data();
    if (G.layout.shard_count() > 1) {
      shard_dev = allocate_device(G.layout.shard_elems() * wbytes, "param.shard", g, prefetch);
      dst = shard_dev.data();
    }
    if (slot) {
      std::vector<offload::IoHandle> reads;
      for (std::size_t k = 0; k < G.plan.chunks.size(); ++k) {
        const StateChunk& c = G.plan.chunks[k];
        reads.push_back(off.store->swap().read(ZeroOffload::param_key(g, k),
                                               slot->span().subspan(c.begin * wbytes, c.elems * wbytes)));
        off.store->count_read(c.elems * wbytes);
      }
      comm_stream_->launch_host([reads] { offload::wait_all(reads); });
      comm_stream_->copy_h2d(dst, slot->data(), G.plan.state_elems * wbytes);
      off.copy_bytes.fetch_add(G.plan.state_elems * wbytes);
      comm_stream_->launch_host([slot]() mutable { slot.reset(); });
    } else {
      for (std::size_t k = 0; k < G.plan.chunks.size(); ++k) {
        const StateChunk& c = G.plan.chunks[k];
        off.copy_bytes.fetch_add(c.elems * wbytes);
        comm_stream_->copy_h2d(static_cast<char*>(dst) + c.begin * wbytes,
                               off.store->host(ZeroOffload::param_key(g, k), c.elems * wbytes).data(),
                               c.elems * wbytes);
      }
    }
    shard_src = dst;
    if (!shard_dev.empty()) {
      shard_comm_->all_gather(shard_src, gathered.data(), G.layout.shard_elems(), working_dtype_, *comm_stream_);
      comm_stream_->release_after(std::move(shard_dev));
    }
  } else if (G.layout.shard_count() == 1) {
    comm_stream_->copy_d2d(gathered.data(), shard_src, total * wbytes);
  } else {
    shard_comm_->all_gather(shard_src, gathered.data(), G.layout.shard_elems(), working_dtype_, *comm_stream_);
  }
  G.gathered = std::move(gathered);
  live_elems_ += total;
  comm_stream_->record(*G.gathered_event);
  ++gathers_;
}

// Device memory for the engine's own buffers. When the device is full, a demand allocation first
// gives back the gathered copies nobody holds (prefetched ahead, or kept for reuse), waits until
// every free queued on a stream has run (the host thread may be far ahead of the compute stream,
// whose queued releases are then still pending), and tries once more. A prefetch only waits for the
// queued frees, then gives up (Note [Deterministic prefetch]).
DeviceMemory ZeroEngine::allocate_device(std::size_t bytes, std::string_view tag, std::size_t keep_group,
                                         bool prefetch) {
  try {
    return device_.allocate(bytes, tag);
  } catch (const OutOfMemoryError&) {
  }
  std::vector<Stream*> streams = {comm_stream_.get()};
  if (impl_->off.worker) streams.push_back(impl_->off.worker.get());
  for (const auto& H : groups_) {
    Stream* used = H->last_use_stream;
    if (used != nullptr && std::find(streams.begin(), streams.end(), used) == streams.end()) streams.push_back(used);
  }
  if (prefetch) {  // Note [Deterministic prefetch]: wait for the queued frees, evict nothing
    for (Stream* s : streams) s->synchronize();
    return device_.allocate(bytes, tag);
  }
  for (std::size_t h = 0; h < groups_.size(); ++h) {
    Group& H = *groups_[h];
    if (h == keep_group || H.live > 0 || H.gathered.empty()) continue;
    live_elems_ -= H.layout.total_elems();
    Stream* s = H.last_use_stream != nullptr ? H.last_use_stream : comm_stream_.get();
    s->release_after(std::move(H.gathered));
  }
  for (Stream* s : streams) s->synchronize();
  return device_.allocate(bytes, tag);
}

void ZeroEngine::prefetch_after(std::size_t position) {
  std::size_t ahead = 0;
  for (std::size_t i = position; i < trace_.size(); ++i) {
    Group& G = group(trace_[i].group);
    if (!G.plan.sharded_params || !G.gathered.empty()) continue;
    const std::size_t total = G.layout.total_elems();
    if (ahead + total > config_.zero.prefetch_bucket_size_elems ||
        live_elems_ + total > config_.zero.max_live_parameters_elems) {
      break;
    }
    try {
      start_gather(trace_[i].group, /*prefetch=*/true);
    } catch (const OutOfMemoryError&) {
      break;  // prefetch is an optimization: the demand fetch will try again when it is needed
    }
    ahead += total;
    ++prefetched_;
  }
}

GroupViews ZeroEngine::acquire_params(std::size_t g, ParamPhase phase, Stream* stream) {
  STRATA_CHECK(stream != nullptr, "the ZeRO engine needs a compute stream (group {})", g);
  Group& G = group(g);
  recording_.push_back(TraceEntry{g, phase});
  if (trace_valid_) {
    if (trace_pos_ < trace_.size() && trace_[trace_pos_].group == g && trace_[trace_pos_].phase == phase) {
      ++trace_pos_;
    } else {
      spdlog::debug("prefetch trace: acquisition {} is group {} but the trace says otherwise; re-recording",
                    recording_.size() - 1, g);
      trace_valid_ = false;
    }
  }
  if (!G.plan.sharded_params) {
    if (impl_->weights_event_recorded) stream->wait(*impl_->weights_event);
    ++G.live;
    return views_of(g, G.w_full_ptr(), working_dtype_);
  }
  if (G.gathered.empty()) start_gather(g, /*prefetch=*/false);
  stream->wait(*G.gathered_event);
  ++G.live;
  G.last_use_stream = stream;
  if (trace_valid_) prefetch_after(trace_pos_);
  return views_of(g, G.gathered.data(), working_dtype_);
}

void ZeroEngine::release_params(std::size_t g, Stream* stream) {
  Group& G = group(g);
  STRATA_CHECK(G.live > 0, "release of group {} ({}) that is not acquired", g, G.layout.name());
  if (--G.live > 0 || !G.plan.sharded_params) return;
  G.last_use_stream = stream;
  // Keep the gathered weights when the trace says the group is needed again inside the window.
  if (trace_valid_) {
    std::size_t window = 0;
    for (std::size_t i = trace_pos_; i < trace_.size(); ++i) {
      if (trace_[i].group == g) return;
      window += group(trace_[i].group).layout.total_elems();
      if (window > config_.zero.prefetch_bucket_size_elems) break;
    }
  }
  live_elems_ -= G.layout.total_elems();
  stream->release_after(std::move(G.gathered));
}

GroupViews ZeroEngine::acquire_grads(std::size_t g, Stream* stream) {
  STRATA_CHECK(stream != nullptr, "the ZeRO engine needs a compute stream (group {})", g);
  STRATA_CHECK(micro_index_ >= 0, "acquire_grads outside begin_micro_batch/end_micro_batch");
  Group& G = group(g);
  STRATA_CHECK(!G.reduced_this_micro, "group {} ({}) gradients acquired after they were reduced", g,
               G.layout.name());
  const std::size_t bytes = G.layout.total_elems() * dtype_bytes(working_dtype_);
  if (G.micro_grad.empty()) {
    G.micro_grad = allocate_device(bytes, "grad.micro", g);
    stream->memset(G.micro_grad.data(), 0, bytes);
  }
  return views_of(g, G.micro_grad.data(), working_dtype_);
}

void ZeroEngine::grads_ready(std::size_t g, Stream* stream) {
  Group& G = group(g);
  ++G.ready_count;
  stream->record(*G.grad_event);
  if ((declared_ready_ || !first_micro_batch_ever_) && G.ready_count == ready_per_micro_[g]) reduce_micro_grads(g);
}

void ZeroEngine::begin_micro_batch() {
  STRATA_CHECK(micro_index_ < 0, "begin_micro_batch twice without end_micro_batch");
  micro_index_ = groups_.empty() ? 0 : groups_.front()->units;
  STRATA_CHECK(micro_index_ < accumulation_, "micro-batch {} of a step of {} (call step())", micro_index_ + 1,
               accumulation_);
}

void ZeroEngine::reduce_micro_grads(std::size_t g) {
  Group& G = group(g);
  const std::size_t wbytes = dtype_bytes(working_dtype_);
  const GroupLayout& L = G.layout;
  if (G.micro_grad.empty()) {
    // This group got no gradient this micro-batch: its unit gradient is zero, but it still takes
    // its place in the sum so every rank runs the same collectives in the same order.
    G.micro_grad = allocate_device(L.total_elems() * wbytes, "grad.micro", g);
    comm_stream_->memset(G.micro_grad.data(), 0, L.total_elems() * wbytes);
  } else {
    comm_stream_->wait(*G.grad_event);
  }
  DeviceMemory reduced = allocate_device(G.plan.grad_elems * wbytes, "grad.reduced", g);
  if (plan_.stage >= 2) {
    if (L.shard_count() == 1) {
      comm_stream_->copy_d2d(reduced.data(), G.micro_grad.data(), G.plan.grad_elems * wbytes);
    } else {
      shard_comm_->reduce_scatter(G.micro_grad.data(), reduced.data(), G.plan.grad_elems, working_dtype_, ReduceOp::Sum,
                                  *comm_stream_);
    }
    if (topo_.replica_count() > 1) {
      replica_comm_->all_reduce(reduced.data(), reduced.data(), G.plan.grad_elems, working_dtype_, ReduceOp::Sum,
                                *comm_stream_);
    }
  } else {
    world_.all_reduce(G.micro_grad.data(), reduced.data(), G.plan.grad_elems, working_dtype_, ReduceOp::Sum, *comm_stream_);
  }
  comm_stream_->release_after(std::move(G.micro_grad));
  if (impl_->off.optimizer) {
    offload_reduced(g, std::move(reduced));
  } else {
    combine_unit(g, std::move(reduced), G.plan.grad_elems);
  }
  G.reduced_this_micro = true;
}

// One micro-batch's reduced gradient joins the step's fp32 sum on the device, through the device
// front layer (engine/device_ops.h) on the communication stream.
void ZeroEngine::combine_unit(std::size_t g, DeviceMemory reduced, std::size_t elems) {
  Group& G = group(g);
  const DType dtype = working_dtype_;
  const void* src = reduced.data();
  if (!config_.strata.exact) {
    if (G.accum.empty()) {
      G.accum = device_.allocate(elems * sizeof(float), "grad.accum");
      device_ops::convert(*comm_stream_, src, dtype, G.accum.as<float>(), DType::F32, elems);
    } else {
      // accum = widen(reduced) + accum: the order is irrelevant in fast mode.
      device_ops::convert_add_left(*comm_stream_, src, dtype, G.accum.as<float>(), elems);
    }
  } else {
    // Binary counter (Note [Exact gradient sums]): unit a merges with the partial sums at the
    // levels of a's trailing one bits, older sums on the left, then lands one level up.
    const auto a = static_cast<unsigned>(G.units);
    const int merges = std::countr_one(a);
    DeviceMemory carry = device_.allocate(elems * sizeof(float), "grad.accum");
    device_ops::convert(*comm_stream_, src, dtype, carry.as<float>(), DType::F32, elems);
    for (int k = 0; k < merges; ++k) {
      DeviceMemory& left = G.levels[static_cast<std::size_t>(k)];
      device_ops::add_left(*comm_stream_, carry.as<float>(), left.as<float>(), elems);
      comm_stream_->release_after(std::move(left));
    }
    if (G.levels.size() <= static_cast<std::size_t>(merges)) G.levels.resize(static_cast<std::size_t>(merges) + 1);
    G.levels[static_cast<std::size_t>(merges)] = std::move(carry);
  }
  comm_stream_->release_after(std::move(reduced));
  ++G.units;
}

void ZeroEngine::end_micro_batch() {
  STRATA_CHECK(micro_index_ >= 0, "end_micro_batch without begin_micro_batch");
  // Groups not reduced yet (every group in the very first micro-batch, whose per-group counts are
  // being learned; groups without gradients) are reduced now, in group order on every rank.
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    Group& G = *groups_[g];
    if (declared_ready_ && G.ready_count != ready_per_micro_[g] && G.ready_count != 0) {
      throw InternalError(fmt::format("param group {} declares {} grads_ready calls per backward but got {}",
                                      G.layout.name(), ready_per_micro_[g], G.ready_count));
    }
    if (!G.reduced_this_micro) reduce_micro_grads(g);
    if (first_micro_batch_ever_ && !declared_ready_) ready_per_micro_[g] = G.ready_count;
    G.ready_count = 0;
    G.reduced_this_micro = false;
  }
  first_micro_batch_ever_ = false;
  micro_index_ = -1;
}

StepResult ZeroEngine::step(double lr) {
  STRATA_CHECK(micro_index_ < 0, "step() inside a micro-batch");
  for (auto& G : groups_) {
    STRATA_CHECK(G->units == accumulation_, "step() after {} of {} micro-batches of group {}", G->units, accumulation_,
                 G->layout.name());
  }
  // Host sync, on purpose: whether to skip, the clip coefficient and the loss scale are host
  // decisions that need every gradient reduced first.
  ZeroOffload& off = impl_->off;
  const bool overlapped = off.overlap_step;
  off.overlap_step = false;  // prepare_step() is per step
  if (overlapped && lr != off.overlap_lr) {
    throw InternalError(fmt::format("step({}) after prepare_step({}): the overlapped update already used the "
                                    "announced learning rate",
                                    lr, off.overlap_lr));
  }
  comm_stream_->synchronize();
  if (off.worker) off.worker->synchronize();

  const std::vector<float*> final_grads = fold_final_grads();
  const double sum_squares = global_sum_squares(final_grads);

  // The phase's decision is optim's (optim/optimizer_phase.h, the same code the CPU phase and
  // `strata bench adam` run): skip on a non-finite norm, else clip and unscale into grad_scale.
  optim::PhaseOptions phase_options;
  phase_options.max_grad_norm = config_.gradient_clipping;
  phase_options.grad_divisor = static_cast<double>(accumulation_) * topo_.world_size;
  const optim::PhaseResult phase =
      optim::decide_phase(optim::GradStats{sum_squares}, impl_->scaler.get(), phase_options);
  StepResult result;
  result.applied = phase.applied;
  result.grad_norm = phase.grad_norm;
  result.loss_scale = phase.loss_scale;
  result.lr = lr;
  if (!phase.applied) {
    if (off.optimizer) drop_offloaded_grads();
  } else if (off.optimizer) {
    if (!overlapped) {
      impl_->optimizer.set_lr(lr);
      run_offloaded_optimizer(phase.grad_scale);
    }
    impl_->optimizer.set_step_count(impl_->optimizer.step_count() + 1);
  } else {
    update_device_state(final_grads, lr, phase.grad_scale);
  }
  off.capture = nullptr;  // armed for this step only (Note [Checkpoint capture])
  if (result.applied) publish_weights();
  reset_after_step();
  return result;
}

// Each group's partial sums folded into one fp32 gradient on the device (exact: lowest level
// first, each higher level on the left; fast: the accumulator). Empty where the optimizer is
// offloaded (its tier formed the final gradient already).
std::vector<float*> ZeroEngine::fold_final_grads() {
  std::vector<float*> final_grads(groups_.size());
  if (impl_->off.optimizer) return final_grads;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    Group& G = *groups_[g];
    if (!config_.strata.exact) {
      final_grads[g] = G.accum.as<float>();
      continue;
    }
    float* acc = nullptr;
    for (auto& level : G.levels) {
      if (level.empty()) continue;
      if (acc == nullptr) {
        acc = level.as<float>();
      } else {
        device_ops::add_left(*comm_stream_, acc, level.as<float>(), G.plan.grad_elems);
      }
    }
    final_grads[g] = acc;
  }
  comm_stream_->synchronize();  // the norm below reads the folded sums' partials on the host
  return final_grads;
}

// Global sum of squares: one partial per optimizer block, summed over all blocks in model order.
// Ranks whose gradients are shards gather the partials of their shard group first.
double ZeroEngine::global_sum_squares(const std::vector<float*>& final_grads) {
  const ZeroOffload& off = impl_->off;
  double sum_squares = 0.0;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    Group& G = *groups_[g];
    // Offloaded: the partials of this rank's state range were taken when the final gradient was
    // formed; the shard group's ranks exchange them as at stage 2 (blocks never straddle shards, so
    // the concatenation is the same list of partials in the same order as the whole gradient's).
    const bool offloaded = off.optimizer;
    const std::size_t blocks = offloaded ? G.block_partials.size()
                                         : (G.plan.grad_elems + optim::kCpuBlockElems - 1) / optim::kCpuBlockElems;
    std::vector<double> partials(blocks);
    if (offloaded) {
      partials = G.block_partials;
    } else {
      device_ops::block_sum_squares(*comm_stream_, final_grads[g], G.plan.grad_elems, partials.data(), impl_->exec);
      comm_stream_->synchronize();  // host sync: the partials are exchanged and summed on the host
    }
    std::vector<double> all = partials;
    if ((plan_.stage >= 2 || offloaded) && G.layout.shard_count() > 1) {
      all.resize(blocks * static_cast<std::size_t>(G.layout.shard_count()));
      for (int r = 0; r < G.layout.shard_count(); ++r) {
        std::vector<double> part = partials;
        shard_comm_->broadcast_host_bytes(part.data(), part.size() * sizeof(double), r);
        std::copy(part.begin(), part.end(), all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * blocks));
      }
    }
    for (double p : all) sum_squares += p;
  }
  return sum_squares;
}

// The update of device-resident state, enqueued on the communication stream through the device
// front layer (publish_weights follows it there).
void ZeroEngine::update_device_state(const std::vector<float*>& final_grads, double lr, float grad_scale) {
  impl_->optimizer.set_lr(lr);
  std::vector<optim::OptimShard> shards;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    Group& G = *groups_[g];
    optim::OptimShard s;
    s.master = std::span<float>(G.master.as<float>(), G.plan.state_elems);
    s.moment1 = std::span<float>(G.moment1.as<float>(), G.plan.state_elems);
    if (!G.moment2.empty()) s.moment2 = std::span<float>(G.moment2.as<float>(), G.plan.state_elems);
    s.grad = optim::GradRef{final_grads[g] + G.plan.grad_offset, DType::F32};
    if (working_dtype_ != DType::F32) {
      void* out = G.plan.sharded_params ? G.w_shard.data()
                                        : G.w_full.as<char>() + G.plan.state_offset * dtype_bytes(working_dtype_);
      s.out = optim::LowPrecisionOut{out, working_dtype_};
    }
    shards.push_back(s);
  }
  const std::int64_t step = impl_->optimizer.step_count() + 1;
  device_ops::optimizer_update(*comm_stream_, impl_->optimizer, shards, grad_scale, step, impl_->exec);
  impl_->optimizer.set_step_count(step);
}

// Groups whose W is a full resident copy gather every shard's new values into it; later
// acquisitions wait for the event recorded after that.
void ZeroEngine::publish_weights() {
  const ZeroOffload& off = impl_->off;
  for (auto& G : groups_) {
    if (G->plan.sharded_params || plan_.stage == 0) continue;
    const std::size_t wbytes = dtype_bytes(working_dtype_);
    const void* mine = working_dtype_ == DType::F32 && !off.optimizer
                           ? G->master.data()
                           : G->w_full.as<char>() + G->plan.state_offset * wbytes;
    if (G->layout.shard_count() == 1) {
      if (mine != G->w_full.data()) comm_stream_->copy_d2d(G->w_full.data(), mine, G->plan.state_elems * wbytes);
    } else {
      shard_comm_->all_gather(mine, G->w_full.data(), G->layout.shard_elems(), working_dtype_, *comm_stream_);
    }
  }
  comm_stream_->record(*impl_->weights_event);
  impl_->weights_event_recorded = true;
}

// Ready for the next step: gradients dropped, gathered copies (now stale) freed, the trace kept
// or replaced, and the next step's first groups prefetched.
void ZeroEngine::reset_after_step() {
  for (auto& G : groups_) {
    for (auto& level : G->levels) comm_stream_->release_after(std::move(level));
    G->levels.clear();
    if (!G->accum.empty()) comm_stream_->release_after(std::move(G->accum));
    G->units = 0;
    if (!G->gathered.empty()) {
      STRATA_CHECK(G->live == 0, "step() while group {} is still acquired", G->layout.name());
      live_elems_ -= G->layout.total_elems();
      Stream* s = G->last_use_stream != nullptr ? G->last_use_stream : comm_stream_.get();
      s->release_after(std::move(G->gathered));
    }
  }
  if (!trace_valid_ || trace_pos_ != trace_.size() || recording_.size() != trace_.size()) {
    if (!trace_.empty()) spdlog::debug("prefetch trace replaced: {} acquisitions", recording_.size());
    trace_ = recording_;
  }
  recording_.clear();
  trace_valid_ = true;
  trace_pos_ = 0;
  // Start fetching the next step's first groups now (their weights are final): with parameters on
  // NVMe this hides the first reads behind the caller's work between steps.
  prefetch_after(0);
}

std::vector<float> ZeroEngine::gather_master(std::size_t g, std::size_t tensor) {
  Group& G = group(g);
  STRATA_CHECK(tensor < G.layout.slots().size(), "tensor {} of group {}", tensor, G.layout.name());
  const std::size_t total = G.layout.total_elems();
  std::vector<float> full(total);
  if (impl_->off.optimizer) {
    std::vector<float> mine = offloaded_master_range(g);
    if (G.layout.shard_count() == 1) {
      full = std::move(mine);
    } else {
      DeviceMemory src = device_.allocate(G.plan.state_elems * sizeof(float), "io.gather");
      DeviceMemory tmp = device_.allocate(total * sizeof(float), "io.gather");
      comm_stream_->copy_h2d(src.data(), mine.data(), G.plan.state_elems * sizeof(float));
      shard_comm_->all_gather(src.data(), tmp.data(), G.layout.shard_elems(), DType::F32, *comm_stream_);
      comm_stream_->copy_d2h(full.data(), tmp.data(), total * sizeof(float));
      comm_stream_->release_after(std::move(src));
      comm_stream_->release_after(std::move(tmp));
      comm_stream_->synchronize();  // `mine` is the source of the queued copy
    }
  } else if (plan_.stage == 0 || G.layout.shard_count() == 1) {
    comm_stream_->copy_d2h(full.data(), G.master.data(), total * sizeof(float));
  } else {
    DeviceMemory tmp = device_.allocate(total * sizeof(float), "io.gather");
    shard_comm_->all_gather(G.master.data(), tmp.data(), G.layout.shard_elems(), DType::F32, *comm_stream_);
    comm_stream_->copy_d2h(full.data(), tmp.data(), total * sizeof(float));
    comm_stream_->release_after(std::move(tmp));
  }
  comm_stream_->synchronize();
  const TensorSlot& s = G.layout.slots()[tensor];
  return std::vector<float>(full.begin() + static_cast<std::ptrdiff_t>(s.offset_elems),
                            full.begin() + static_cast<std::ptrdiff_t>(s.offset_elems + s.elems));
}

std::size_t ZeroEngine::model_state_device_bytes() const {
  // Frees queued with release_after count until they run.
  comm_stream_->synchronize();
  if (impl_->off.worker) impl_->off.worker->synchronize();
  std::size_t bytes = 0;
  for (const auto& [tag, b] : device_.memory_stats().bytes_by_tag) {
    if (tag == "param.gathered" || tag == "param.shard") continue;  // working copies, not state
    if (tag.rfind("param.", 0) == 0 || tag.rfind("optim.", 0) == 0 || tag.rfind("grad.", 0) == 0) bytes += b;
  }
  return bytes;
}

}  // namespace strata
