// The optimizer state on host memory or NVMe: set-up, the gradient sums on the worker stream, the
// chunked update and the overlapped update (engine/state_home_tiered.h).
#include "engine/state_home_tiered.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <tbb/parallel_for.h>

#include "core/dtype_bulk.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/units.h"
#include "engine/device_ops.h"
#include "engine/working_weights.h"
#include "plan/part_bytes.h"
#include "optim/grad_stats.h"

namespace strata {

namespace {

constexpr std::size_t kBlock = optim::kCpuBlockElems;

template <typename T>
T* as(std::span<std::byte> s) {
  return reinterpret_cast<T*>(s.data());
}

}  // namespace

// Builds what the plan's offload section asks for: the swap store (one file per NVMe directory),
// the host/NVMe array store, the pinned pools, the host thread and the transfer stream.
TieredStateHome::TieredStateHome(EngineContext& ctx, WorkingWeights& weights) : ctx_(ctx), weights_(weights) {
  const OffloadPlan& op = ctx_.plan.offload;
  params_ = ctx_.plan.params_offloaded();
  nstate_ = ctx_.plan.state_arrays;
  chunk_elems_ = op.chunk_elems;
  for (const GroupPlan& P : ctx_.plan.groups) {
    block_partials_.emplace_back(P.state_elems / kBlock, 0.0);
    exact_partials_.emplace_back(ctx_.exact() ? P.state_elems / kBlock : 0);
  }

  // Page-locked: the pinned pools, and of the host arrays only the parameters (the comm stream copies
  // them up); the optimizer's arrays are read and written by the CPU alone.
  HostMemoryPinner* pinner = op.pin_optimizer ? &ctx_.device : nullptr;
  if (op.swap_bytes > 0) {
    // Only the last component is made: a mistyped nvme_path must not grow a chain of directories.
    for (const auto& d : op.nvme_dirs) ensure_directory(d, "nvme_path directory");
    io_ = offload::make_io_engine(op.io);
    offload::SwapStoreOptions so;
    so.dirs = op.nvme_dirs;
    so.capacity_bytes = op.swap_capacity_bytes;
    so.file_name = op.swap_file_name;
    swap_ = std::make_unique<offload::SwapStore>(*io_, so);
  }
  store_ = std::make_unique<TierStore>(swap_.get(), op.pin_params ? &ctx_.device : nullptr);
  offload::BufferPoolOptions po;
  po.slot_count = op.slot_count;
  po.slot_bytes = op.slot_bytes;
  po.pinner = pinner;
  pool_ = std::make_unique<offload::BufferPool>(po, io_.get());
  if (op.param_slot_count > 0) {
    offload::BufferPoolOptions pp;
    pp.slot_count = op.param_slot_count;
    pp.slot_bytes = op.param_slot_bytes;
    pp.pinner = op.pin_params ? &ctx_.device : nullptr;
    param_pool_ = std::make_unique<offload::BufferPool>(pp, nullptr);
  }
  executor_ = std::make_unique<HostExecutor>("zero.offload", ctx_.config.strata.device.chaos_seed);
  transfer_ = ctx_.device.create_stream("zero.transfer");
  spdlog::debug("offload: optimizer on {} ({} of {} chunks on NVMe), params {} ({} chunks on NVMe), chunks of {} "
                "elements, {} pinned slots of {}, swap {}",
                home_name(op.optimizer), op.spilled_state_chunks, op.state_chunks,
                params_ ? home_name(op.params) : "on the device", op.spilled_param_chunks, op.chunk_elems,
                op.slot_count, format_bytes(op.slot_bytes), format_bytes(op.swap_bytes));
}

TieredStateHome::~TieredStateHome() {
  // Queued host work reads this home's arrays, and queued copies its slots: let them finish first.
  try {
    executor_->drain();
  } catch (const std::exception& e) {
    spdlog::error("zero engine shutdown: {}", e.what());
  }
  try {
    for (SlotInFlight& s : slots_in_flight_) s.copied->synchronize();
    transfer_->synchronize();
  } catch (const std::exception& e) {
    spdlog::error("zero engine shutdown: {}", e.what());
  }
}

void TieredStateHome::init_group(std::size_t g, const float* master_full, const void* working_full) {
  const GroupPlan& P = ctx_.group(g);
  const std::size_t wbytes = ctx_.wbytes();
  HostBuffer staging;
  // A chunk on its way to NVMe; its size is the plan's (see Note [Part bytes] in plan/part_bytes.h).
  if (swap_) staging = HostBuffer::allocate(init_chunk_staging_bytes(ctx_.plan));
  auto* stage = static_cast<std::byte*>(staging.data());
  for (std::size_t k = 0; k < P.chunks.size(); ++k) {
    const StateChunk& c = P.chunks[k];
    const std::size_t bytes = state_bytes(c.elems);
    const std::string key = state_key(g, k);
    const Home tier = state_tier(g, k);
    std::byte* dst = tier == Home::Host ? store_->host(key, bytes).data() : stage;
    std::memcpy(dst, master_full + P.state_offset + c.begin, 4 * c.elems);
    std::memset(dst + 4 * c.elems, 0, bytes - 4 * c.elems);
    if (tier == Home::Nvme) store_->write_now(key, staging.as<std::byte>(), bytes);
    if (params_ && P.sharded_params) {
      const std::size_t pbytes = wbytes * c.elems;
      const std::string pkey = param_key(g, k);
      const Home ptier = weights_tier(g, k);
      std::byte* pdst = ptier == Home::Host ? store_->host(pkey, pbytes, /*device_copies=*/true).data() : stage;
      std::memcpy(pdst, static_cast<const std::byte*>(working_full) + (P.state_offset + c.begin) * wbytes, pbytes);
      if (ptier == Home::Nvme) store_->write_now(pkey, staging.as<std::byte>(), pbytes);
    }
  }
}

// Note [Overlapped update]: Adam's update of a chunk needs the step's final gradient of that chunk
// and a few scalars: the learning rate, the step number and grad_scale = clip / (loss_scale *
// units). Without gradient clipping and without fp16 loss scaling, clip and loss_scale are 1, so
// nothing depends on the rest of the step, and the worker updates each chunk the moment its final
// gradient is formed, while backward still runs for earlier layers (LoHan/Fuyou's idea). The
// result is the same expression on the same numbers as the waiting path, so exact mode gives the
// same bits. The waiting path would skip a step whose gradient norm is not finite; an overlapped
// update cannot undo the chunks it already wrote, so a non-finite chunk gradient fails the step
// with an error that says so. With clipping or fp16 the engine waits (docs/GUIDE.md, "Offload:
// host memory and NVMe", says why).
bool TieredStateHome::prepare_step(double lr) {
  overlap_step_ = ctx_.config.strata.offload.overlap_optimizer && !(ctx_.config.gradient_clipping > 0) &&
                  ctx_.config.precision != Precision::Fp16;
  overlap_lr_ = lr;
  if (overlap_step_) ctx_.optimizer.set_lr(lr);
  return overlap_step_;
}

bool TieredStateHome::take_overlap(double lr) {
  const bool overlapped = overlap_step_;
  overlap_step_ = false;  // prepare_step() is per step
  if (overlapped && lr != overlap_lr_) {
    throw InternalError(fmt::format("step({}) after prepare_step({}): the overlapped update already used the "
                                    "announced learning rate",
                                    lr, overlap_lr_));
  }
  return overlapped;
}

// Note [Host-driven offload] (docs/DESIGN.md): the host thread waits on the event recorded after
// the reduction, copies the gradient down and combines it. The reduced buffer is freed by whichever
// thread drops the task (the executor's, once the task ran, failed or was skipped after an earlier
// failure; or this one, if submit refuses it), and only after the reduction writing it and every
// copy reading it have completed: no work names it after its free (Note [Released memory] in
// core/device/sim_allocator.h).
void TieredStateHome::add_unit(std::size_t g, DeviceMemory reduced, int unit) {
  std::shared_ptr<Event> reduced_event(ctx_.device.create_event());
  ctx_.comm.record(*reduced_event);
  const bool last = unit + 1 == ctx_.accumulation();
  const bool overlap = last && overlap_step_;
  Stream* transfer = transfer_.get();  // outlives the task: the destructor drains the executor first
  std::shared_ptr<DeviceMemory> held(new DeviceMemory(std::move(reduced)), [reduced_event, transfer](DeviceMemory* m) {
    try {
      reduced_event->synchronize();
      transfer->synchronize();
    } catch (const std::exception& e) {  // the stream's own error is reported where it is synchronized
      spdlog::debug("freeing a reduced gradient after a failed stream: {}", e.what());
    }
    delete m;
  });
  executor_->submit([this, g, held, reduced_event, unit, last, overlap] {
    reduced_event->synchronize();
    combine(g, held->data(), unit, last, overlap);
  });
}

// One micro-batch's reduced gradient of group g (device, working dtype) joins the step's sum on
// the optimizer tier, chunk by chunk, with the same operations in the same order as the device
// home (Note [Exact gradient sums] in engine/zero_engine.h): exact mode merges the binary counter's levels and, at the
// last unit, folds the remaining levels (lowest first, each higher one on the left) into the final
// gradient; fast mode adds into one accumulator.
void TieredStateHome::combine(std::size_t g, const void* reduced, int unit, bool last, bool overlap) {
  std::vector<ChunkJob> jobs;
  for (std::size_t k = 0; k < ctx_.group(g).chunks.size(); ++k) {
    jobs.push_back(combine_job(g, k, reduced, unit, last, overlap));
  }
  ChunkPipeline(*store_, *pool_).run(jobs);
}

ChunkJob TieredStateHome::combine_job(std::size_t g, std::size_t k, const void* reduced, int unit, bool last,
                                      bool overlap) {
  const GroupPlan& P = ctx_.group(g);
  const std::size_t wbytes = ctx_.wbytes();
  const DType wdtype = ctx_.working();
  const bool exact = ctx_.exact();
  const StateChunk c = P.chunks[k];
  const std::size_t n = c.elems;
  // The fields are engine/chunk_fields.h's (what `bench io --replay` runs too).
  CombineFields cf = combine_fields(ctx_.plan, g, k, unit, exact, overlap);
  STRATA_CHECK(last == (unit + 1 == ctx_.plan.accumulation), "unit {} of {}: last={}", unit, ctx_.plan.accumulation, last);
  ChunkJob job;
  job.fields = std::move(cf.fields);
  job.remove_after = std::move(cf.remove_after);
  const std::size_t i_stage = cf.stage, i_out = cf.out, i_tmp = cf.tmp, i_state = cf.state, i_w = cf.weights;
  const std::vector<std::size_t> i_adds = cf.adds;
  job.work = [=, this, &P](std::span<const std::span<std::byte>> f) {
    std::byte* stage = f[i_stage].data();
    transfer_->copy_d2h(stage, static_cast<const std::byte*>(reduced) + (P.grad_offset + c.begin) * wbytes, n * wbytes);
    transfer_->synchronize();
    copy_bytes_.fetch_add(n * wbytes);
    float* out = as<float>(f[i_out]);
    if (exact || unit == 0) {
      convert_parallel(stage, wdtype, out, DType::F32, n);
      for (std::size_t i : i_adds) device_ops::add_left_host(out, as<float>(f[i]), n);
    } else {
      float* t = as<float>(f[i_tmp]);
      convert_parallel(stage, wdtype, t, DType::F32, n);
      device_ops::add_left_host(out, t, n);  // out = t + out, as the device home
    }
    if (last) {
      final_chunk(g, c, out, overlap, overlap ? as<float>(f[i_state]) : nullptr,
                  overlap ? f[i_w].data() : nullptr);
    }
  };
  if (overlap) add_capture(job, g, k, i_state, state_bytes(n));
  return job;
}

optim::ExactSquares TieredStateHome::exact_squares(std::size_t g) {
  STRATA_CHECK(ctx_.exact(), "exact_squares outside exact mode");
  optim::ExactSquares sum;
  for (const optim::ExactSquares& p : exact_partials_[g]) sum.merge(p);
  return sum;
}

// The final gradient of chunk c is formed: its norm's part (exact mode: the exact sum, Note [Exact
// sum of squares]; otherwise the block partials), and with an overlapped step its update right away.
void TieredStateHome::final_chunk(std::size_t g, const StateChunk& c, const float* grad, bool overlap, float* state,
                                  std::byte* wout) {
  const std::size_t first_block = c.begin / kBlock;
  const std::size_t blocks = c.elems / kBlock;
  bool finite = true;
  if (ctx_.exact()) {
    optim::ExactSquares& sum = exact_partials_[g][first_block];
    sum = optim::exact_sum_squares(grad, DType::F32, c.elems, optim::CpuExec{ctx_.exec.simd, nullptr});
    finite = sum.finite();
  } else {
    std::vector<double>& partials = block_partials_[g];
    tbb::parallel_for(std::size_t{0}, blocks, [&](std::size_t b) {
      const optim::GradSpan span{grad + b * kBlock, DType::F32, kBlock};
      optim::CpuExec serial{ctx_.exec.simd, nullptr};
      partials[first_block + b] = optim::grad_stats(std::span<const optim::GradSpan>(&span, 1), serial).sum_squares;
    });
    double sum = 0;
    for (std::size_t b = 0; b < blocks; ++b) sum += partials[first_block + b];
    finite = std::isfinite(sum);
  }
  if (!overlap) return;
  const std::int64_t step = ctx_.optimizer.step_count() + 1;
  if (!finite) {
    throw Error(fmt::format("step {}: non-finite gradients in param group {} while the optimizer update was "
                            "overlapped with backward; the groups already updated cannot be rolled back. Set "
                            "gradient_clipping (or strata.offload.overlap_optimizer=false) to have such steps "
                            "skipped instead",
                            step, ctx_.group(g).layout.name()));
  }
  // step(): grad_scale = clip / (loss_scale * units), with clip and loss_scale 1 here.
  const double units = static_cast<double>(ctx_.accumulation()) * ctx_.plan.topo.world_size;
  update_chunk(g, c, state, grad, wout, static_cast<float>(1.0 / (1.0 * units)), step);
  overlapped_chunks_.fetch_add(1);
}

void TieredStateHome::update_chunk(std::size_t g, const StateChunk& c, float* state, const float* grad,
                                   std::byte* wout, float grad_scale, std::int64_t step) {
  const GroupPlan& P = ctx_.group(g);
  const std::size_t n = c.elems;
  const std::size_t wbytes = ctx_.wbytes();
  optim::OptimShard s;
  s.master = std::span<float>(state, n);
  s.moment1 = std::span<float>(state + n, n);
  if (nstate_ == 3) s.moment2 = std::span<float>(state + 2 * n, n);
  s.grad = optim::GradRef{grad, DType::F32};
  if (ctx_.working() != DType::F32) s.out = optim::LowPrecisionOut{wout, ctx_.working()};
  ctx_.optimizer.apply(std::span<const optim::OptimShard>(&s, 1), grad_scale, step, ctx_.exec);
  if (ctx_.working() == DType::F32) std::memcpy(wout, state, 4 * n);
  chunk_updates_.fetch_add(1);
  // Working weights that live on the device get the new values now.
  if (!(params_ && P.sharded_params)) {
    auto* dev = static_cast<std::byte*>(weights_.state_range(g));
    transfer_->copy_h2d(dev + c.begin * wbytes, wout, n * wbytes);
    transfer_->synchronize();
    copy_bytes_.fetch_add(n * wbytes);
  }
}

void TieredStateHome::update(double lr, float grad_scale, std::int64_t step) {
  ctx_.optimizer.set_lr(lr);
  std::vector<ChunkJob> jobs;
  for (std::size_t g = 0; g < ctx_.group_count(); ++g) {
    for (std::size_t k = 0; k < ctx_.group(g).chunks.size(); ++k) {
      const StateChunk c = ctx_.group(g).chunks[k];
      const std::size_t n = c.elems;
      UpdateFields uf = update_fields(ctx_.plan, g, k);
      ChunkJob job;
      job.fields = std::move(uf.fields);
      job.remove_after = std::move(uf.remove_after);
      job.work = [=, this](std::span<const std::span<std::byte>> f) {
        update_chunk(g, c, as<float>(f[0]), as<float>(f[1]), f[2].data(), grad_scale, step);
      };
      add_capture(job, g, k, 0, state_bytes(n));
      jobs.push_back(std::move(job));
    }
  }
  ChunkPipeline(*store_, *pool_).run(jobs);
}

void TieredStateHome::drop_grads() {
  for (std::size_t g = 0; g < ctx_.group_count(); ++g) {
    for (std::size_t k = 0; k < ctx_.group(g).chunks.size(); ++k) store_->remove(grad_key(g, k));
  }
}

// A slot whose copies up have completed goes back to the pool first; with none free, the host waits
// for the oldest copies in flight (see Note [Deterministic prefetch] in engine/param_fetcher.cc: a slot is waited for, never given
// up, so every rank issues the same gathers).
std::shared_ptr<offload::BufferLease> TieredStateHome::reserve_param_slot(std::size_t g) {
  if (!ctx_.plan.params_on_nvme(g)) return nullptr;
  while (!slots_in_flight_.empty() && slots_in_flight_.front().copied->query()) slots_in_flight_.pop_front();
  offload::BufferLease lease;
  while (!param_pool_->try_acquire(&lease)) {
    if (slots_in_flight_.empty()) return std::make_shared<offload::BufferLease>(param_pool_->acquire());
    slots_in_flight_.front().copied->synchronize();
    slots_in_flight_.pop_front();
  }
  return std::make_shared<offload::BufferLease>(std::move(lease));
}

// NVMe chunks are read into the group's slot and go up from there once the host has seen the reads
// complete (a stream never waits for I/O: see Note [Host-driven offload] in docs/DESIGN.md); host chunks go up from their
// host arrays. The slot returns with the event recorded after the copies.
void TieredStateHome::upload_params(std::size_t g, void* dst, std::shared_ptr<offload::BufferLease> slot) {
  const GroupPlan& P = ctx_.group(g);
  const std::size_t wbytes = ctx_.wbytes();
  Stream& comm = ctx_.comm;
  if (slot) {
    std::vector<offload::IoHandle> reads;
    for (std::size_t k = 0; k < P.chunks.size(); ++k) {
      const StateChunk& c = P.chunks[k];
      if (weights_tier(g, k) != Home::Nvme) continue;
      reads.push_back(store_->swap().read(param_key(g, k), slot->span().subspan(c.begin * wbytes, c.elems * wbytes)));
      store_->count_read(c.elems * wbytes);
    }
    offload::wait_all(reads);
  }
  auto* out = static_cast<std::byte*>(dst);
  for (std::size_t k = 0; k < P.chunks.size();) {
    const std::size_t begin = P.chunks[k].begin * wbytes;
    std::size_t bytes = P.chunks[k].elems * wbytes;
    if (weights_tier(g, k) == Home::Host) {
      comm.copy_h2d(out + begin, store_->host(param_key(g, k), bytes, /*device_copies=*/true).data(), bytes);
      ++k;
    } else {  // a run of NVMe chunks is contiguous in the slot: one copy
      while (++k < P.chunks.size() && weights_tier(g, k) == Home::Nvme) bytes += P.chunks[k].elems * wbytes;
      comm.copy_h2d(out + begin, slot->data() + begin, bytes);
    }
    copy_bytes_.fetch_add(bytes);
  }
  if (slot) {
    SlotInFlight s{ctx_.device.create_event(), std::move(slot)};
    comm.record(*s.copied);
    slots_in_flight_.push_back(std::move(s));
  }
}

StateHomeStats TieredStateHome::stats() const {
  StateHomeStats s;
  s.tiers = store_->stats();
  s.chunk_updates = chunk_updates_.load();
  s.overlapped_updates = overlapped_chunks_.load();
  s.copy_bytes = copy_bytes_.load();
  for (const auto* p : {pool_.get(), param_pool_.get()}) {
    if (p != nullptr) s.pinned_pool_bytes += p->slot_bytes() * p->slot_count();
  }
  return s;
}

std::unique_ptr<StateHome> make_device_state_home(EngineContext& ctx, WorkingWeights& weights);

std::unique_ptr<StateHome> make_state_home(EngineContext& ctx, WorkingWeights& weights) {
  if (ctx.plan.optimizer_offloaded()) return std::make_unique<TieredStateHome>(ctx, weights);
  return make_device_state_home(ctx, weights);
}

}  // namespace strata
