// ZeroEngine on host and NVMe tiers: set-up, gradient combines on the worker stream, the chunked
// optimizer step and the overlapped update (engine/zero_engine.h, Note [Offload]).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <tbb/parallel_for.h>

#include "core/dtype_bulk.h"
#include "core/error.h"
#include "core/units.h"
#include "engine/zero_engine.h"
#include "engine/zero_engine_internal.h"
#include "optim/grad_stats.h"

namespace strata {

namespace {

constexpr std::size_t kBlock = optim::kCpuBlockElems;
constexpr std::size_t kNone = static_cast<std::size_t>(-1);

std::size_t add_field(ChunkJob& job, std::string key, Tier tier, std::size_t bytes, ChunkField::Kind kind) {
  job.fields.push_back(ChunkField{std::move(key), tier, bytes, kind});
  return job.fields.size() - 1;
}

template <typename T>
T* as(std::span<std::byte> s) {
  return reinterpret_cast<T*>(s.data());
}

}  // namespace

// Note [Overlapped update]: Adam's update of a chunk needs the step's final gradient of that chunk
// and a few scalars: the learning rate, the step number and grad_scale = clip / (loss_scale *
// units). Without gradient clipping and without fp16 loss scaling, clip and loss_scale are 1, so
// nothing depends on the rest of the step, and the worker updates each chunk the moment its final
// gradient is formed, while backward still runs for earlier layers (LoHan/Fuyou's idea). The
// result is the same expression on the same numbers as the waiting path, so exact mode gives the
// same bits. The waiting path would skip a step whose gradient norm is not finite; an overlapped
// update cannot undo the chunks it already wrote, so a non-finite chunk gradient fails the step
// with an error that says so. With clipping or fp16 the engine waits (the README says why).

// Note [Checkpoint capture]: a checkpoint of NVMe-resident state would read every chunk back from
// the swap file (Note [Checkpoint copy] in engine/zero_engine_state.cc), but the step before it
// already holds each chunk in a pinned slot right after the optimizer updated it. When the trainer
// knows a checkpoint follows the step (an interval in steps, the last step), it arms the step with
// capture_next_step: each update job then hands its new state to the checkpoint's sink before the
// slot's write-behind goes out, and the slot returns to the pool only when both writes completed.
// The checkpoint costs one write of the state, overlapped with backward where the update is, and
// no read. Bits are the same as a copy after the step: the bytes are the ones written to the tier.
namespace {
void add_capture(ZeroOffload& off, ChunkJob& job, std::size_t g, std::size_t k, std::size_t field, std::size_t bytes) {
  if (!off.capture) return;
  const std::size_t index = off.capture_first[g] + k;
  job.also = [&off, index, field, bytes](std::span<const std::span<std::byte>> f, offload::IoCallback done) {
    const std::size_t padded = offload::SwapStore::padded(bytes);
    std::byte* data = f[field].data();
    std::memset(data + bytes, 0, padded - bytes);  // a slot's stale tail; host arrays' padding is zero already
    off.captured.fetch_add(1);
    return off.capture(index, std::span<const std::byte>(data, padded), std::move(done));
  };
}
}  // namespace

bool ZeroEngine::capture_next_step(StateCaptureSink sink) {
  check_between_steps("capture_next_step");
  ZeroOffload& off = impl_->off;
  if (!sink || !off.optimizer) {
    off.capture = nullptr;  // disarms; captured_pieces() keeps what the last step handed out
    return false;
  }
  off.capture_first.assign(groups_.size(), 0);
  std::size_t pieces = 0;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    off.capture_first[g] = pieces;
    pieces += groups_[g]->plan.chunks.size();
  }
  off.captured = 0;
  off.capture = std::move(sink);
  return true;
}

std::size_t ZeroEngine::captured_pieces() const { return impl_->off.captured.load(); }

// Builds what the plan's offload section asks for: the swap store (one file per NVMe directory),
// the host/NVMe array store, the pinned pools and the two host-side streams.
void ZeroEngine::setup_offload() {
  ZeroOffload& off = impl_->off;
  const OffloadPlan& op = plan_.offload;
  off.optimizer = true;
  off.opt_tier = op.optimizer == Home::Nvme ? Tier::Nvme : Tier::Host;
  off.params = plan_.params_offloaded();
  off.param_tier = op.params == Home::Nvme ? Tier::Nvme : Tier::Host;
  off.nstate = plan_.state_arrays;
  off.chunk_elems = op.chunk_elems;
  for (auto& G : groups_) G->block_partials.assign(G->plan.state_elems / kBlock, 0.0);

  HostMemoryPinner* pinner = op.pin_optimizer ? &device_ : nullptr;
  if (op.swap_bytes > 0) {
    for (const auto& d : op.nvme_dirs) {
      std::error_code ec;  // a directory that cannot be created is reported by the swap store below
      std::filesystem::create_directories(d, ec);
    }
    off.io = offload::make_io_engine(op.io);
    offload::SwapStoreOptions so;
    so.dirs = op.nvme_dirs;
    so.capacity_bytes = op.swap_capacity_bytes;
    so.file_name = op.swap_file_name;
    off.swap = std::make_unique<offload::SwapStore>(*off.io, so);
  }
  off.store = std::make_unique<TierStore>(off.swap.get(), pinner);
  offload::BufferPoolOptions po;
  po.slot_count = op.slot_count;
  po.slot_bytes = op.slot_bytes;
  po.pinner = pinner;
  off.pool = std::make_unique<offload::BufferPool>(po, off.io.get());
  if (op.param_slot_count > 0) {
    offload::BufferPoolOptions pp;
    pp.slot_count = op.param_slot_count;
    pp.slot_bytes = op.param_slot_bytes;
    pp.pinner = op.pin_params ? &device_ : nullptr;
    off.param_pool = std::make_unique<offload::BufferPool>(pp, nullptr);
  }
  off.worker = device_.create_stream("zero.offload");
  off.transfer = device_.create_stream("zero.transfer");
  spdlog::debug("offload: optimizer on {}, params {}, chunks of {} elements, {} pinned slots of {}, swap {}",
                tier_name(off.opt_tier), off.params ? tier_name(off.param_tier) : "on the device", op.chunk_elems,
                op.slot_count, format_bytes(op.slot_bytes), format_bytes(op.swap_bytes));
}

void ZeroEngine::init_offloaded_group(std::size_t g, const float* master_full, const void* working_full) {
  Group& G = group(g);
  ZeroOffload& off = impl_->off;
  const std::size_t wbytes = dtype_bytes(working_dtype_);
  const auto nstate = static_cast<std::size_t>(off.nstate);
  HostBuffer staging;
  if (off.opt_tier == Tier::Nvme || (off.params && off.param_tier == Tier::Nvme)) {
    staging = HostBuffer::allocate(offload::SwapStore::padded(std::max(nstate * 4, wbytes) * off.chunk_elems));
  }
  auto* stage = static_cast<std::byte*>(staging.data());
  for (std::size_t k = 0; k < G.plan.chunks.size(); ++k) {
    const StateChunk& c = G.plan.chunks[k];
    const std::size_t bytes = nstate * 4 * c.elems;
    const std::string key = ZeroOffload::state_key(g, k);
    std::byte* dst = off.opt_tier == Tier::Host ? off.store->host(key, bytes).data() : stage;
    std::memcpy(dst, master_full + G.plan.state_offset + c.begin, 4 * c.elems);
    std::memset(dst + 4 * c.elems, 0, (nstate - 1) * 4 * c.elems);
    if (off.opt_tier == Tier::Nvme) off.store->write_now(key, staging.as<std::byte>(), bytes);
    if (off.params && G.plan.sharded_params) {
      const std::size_t pbytes = wbytes * c.elems;
      const std::string pkey = ZeroOffload::param_key(g, k);
      std::byte* pdst = off.param_tier == Tier::Host ? off.store->host(pkey, pbytes).data() : stage;
      std::memcpy(pdst, static_cast<const std::byte*>(working_full) + (G.plan.state_offset + c.begin) * wbytes, pbytes);
      if (off.param_tier == Tier::Nvme) off.store->write_now(pkey, staging.as<std::byte>(), pbytes);
    }
  }
}

void ZeroEngine::prepare_step(double lr) {
  STRATA_CHECK(micro_index_ < 0 && (groups_.empty() || groups_.front()->units == 0),
               "prepare_step() must come before the step's first micro-batch");
  ZeroOffload& off = impl_->off;
  off.overlap_step = off.optimizer && config_.strata.offload.overlap_optimizer && !(config_.gradient_clipping > 0) &&
                     !impl_->scaler;
  off.overlap_lr = lr;
  if (off.overlap_step) impl_->optimizer.set_lr(lr);
}

void ZeroEngine::offload_reduced(std::size_t g, DeviceMemory reduced) {
  Group& G = group(g);
  ZeroOffload& off = impl_->off;
  std::shared_ptr<Event> ready(device_.create_event());
  comm_stream_->record(*ready);
  off.worker->wait(*ready);
  const int unit = G.units;
  const bool last = unit + 1 == accumulation_;
  const bool overlap = last && off.overlap_step;
  const void* src = reduced.data();
  off.worker->launch_host([this, g, src, unit, last, overlap, ready] { offload_combine(g, src, unit, last, overlap); });
  off.worker->release_after(std::move(reduced));
  ++G.units;
}

// One micro-batch's reduced gradient of group g (device, working dtype) joins the step's sum on
// the optimizer tier, chunk by chunk, with the same operations in the same order as the device
// path (Note [Exact gradient sums]): exact mode merges the binary counter's levels and, at the last
// unit, folds the remaining levels (lowest first, each higher one on the left) into the final
// gradient; fast mode adds into one accumulator.
void ZeroEngine::offload_combine(std::size_t g, const void* reduced, int unit, bool last, bool overlap) {
  Group& G = *groups_[g];
  ZeroOffload& off = impl_->off;
  const std::size_t wbytes = dtype_bytes(working_dtype_);
  const DType wdtype = working_dtype_;
  const bool exact = config_.strata.exact;
  const auto a = static_cast<unsigned>(unit);
  const int merges = exact ? std::countr_one(a) : 0;
  std::vector<int> highers;
  if (exact && last) {
    for (int level = merges + 1; level < 32; ++level) {
      if (((static_cast<unsigned>(accumulation_) >> level) & 1u) != 0) highers.push_back(level);
    }
  }
  const double units = static_cast<double>(accumulation_) * topo_.world_size;
  const auto grad_scale = static_cast<float>(1.0 / (1.0 * units));  // step(): clip / (loss_scale * units)
  const std::int64_t step_no = impl_->optimizer.step_count() + 1;
  const Tier tier = off.opt_tier;

  std::vector<ChunkJob> jobs;
  for (std::size_t k = 0; k < G.plan.chunks.size(); ++k) {
    const StateChunk c = G.plan.chunks[k];
    const std::size_t n = c.elems;
    ChunkJob job;
    const std::size_t i_stage = add_field(job, "", Tier::Host, n * wbytes, ChunkField::Scratch);
    std::vector<std::size_t> i_adds;
    std::size_t i_out = kNone, i_tmp = kNone;
    if (exact) {
      std::vector<int> adds;
      for (int level = 0; level < merges; ++level) adds.push_back(level);
      adds.insert(adds.end(), highers.begin(), highers.end());
      for (int level : adds) {
        const std::string key = ZeroOffload::level_key(g, level, k);
        i_adds.push_back(add_field(job, key, tier, 4 * n, ChunkField::Read));
        job.remove_after.push_back(key);
      }
      if (overlap) {
        i_out = add_field(job, "", Tier::Host, 4 * n, ChunkField::Scratch);
      } else {
        i_out = add_field(job, last ? ZeroOffload::grad_key(g, k) : ZeroOffload::level_key(g, merges, k), tier, 4 * n,
                          ChunkField::Write);
      }
    } else if (unit == 0) {
      i_out = overlap ? add_field(job, "", Tier::Host, 4 * n, ChunkField::Scratch)
                      : add_field(job, ZeroOffload::grad_key(g, k), tier, 4 * n, ChunkField::Write);
    } else {
      i_out = add_field(job, ZeroOffload::grad_key(g, k), tier, 4 * n, overlap ? ChunkField::Read : ChunkField::Update);
      if (overlap) job.remove_after.push_back(ZeroOffload::grad_key(g, k));
      i_tmp = add_field(job, "", Tier::Host, 4 * n, ChunkField::Scratch);
    }
    std::size_t i_state = kNone, i_w = kNone;
    if (overlap) {
      i_state = add_field(job, ZeroOffload::state_key(g, k), tier, static_cast<std::size_t>(off.nstate) * 4 * n,
                          ChunkField::Update);
      i_w = (off.params && G.plan.sharded_params)
                ? add_field(job, ZeroOffload::param_key(g, k), off.param_tier, n * wbytes, ChunkField::Write)
                : add_field(job, "", Tier::Host, n * wbytes, ChunkField::Scratch);
    }
    job.work = [=, this, &G, &off](std::span<const std::span<std::byte>> f) {
      std::byte* stage = f[i_stage].data();
      off.transfer->copy_d2h(stage, static_cast<const std::byte*>(reduced) + (G.plan.grad_offset + c.begin) * wbytes,
                             n * wbytes);
      off.transfer->synchronize();
      off.copy_bytes.fetch_add(n * wbytes);
      float* out = as<float>(f[i_out]);
      if (exact || unit == 0) {
        convert_parallel(stage, wdtype, out, DType::F32, n);
        for (std::size_t i : i_adds) add_left(out, as<float>(f[i]), n);
      } else {
        float* t = as<float>(f[i_tmp]);
        convert_parallel(stage, wdtype, t, DType::F32, n);
        add_left(out, t, n);  // out = t + out, as the device path
      }
      if (!last) return;
      const std::size_t first_block = c.begin / kBlock;
      tbb::parallel_for(std::size_t{0}, n / kBlock, [&](std::size_t b) {
        const optim::GradSpan span{out + b * kBlock, DType::F32, kBlock};
        optim::CpuExec serial{impl_->exec.simd, nullptr};
        G.block_partials[first_block + b] =
            optim::grad_stats(std::span<const optim::GradSpan>(&span, 1), serial).sum_squares;
      });
      if (!overlap) return;
      double sum = 0;
      for (std::size_t b = 0; b < n / kBlock; ++b) sum += G.block_partials[first_block + b];
      if (!std::isfinite(sum)) {
        throw Error(fmt::format("step {}: non-finite gradients in param group {} while the optimizer update was "
                                "overlapped with backward; the groups already updated cannot be rolled back. Set "
                                "gradient_clipping (or strata.offload.overlap_optimizer=false) to have such steps "
                                "skipped instead",
                                step_no, G.layout.name()));
      }
      update_chunk(g, c, as<float>(f[i_state]), out, f[i_w].data(), grad_scale, step_no);
      off.overlapped_chunks.fetch_add(1);
    };
    if (overlap) add_capture(off, job, g, k, i_state, static_cast<std::size_t>(off.nstate) * 4 * n);
    jobs.push_back(std::move(job));
  }
  ChunkPipeline(*off.store, *off.pool).run(jobs);
}

void ZeroEngine::update_chunk(std::size_t g, const StateChunk& c, float* state, const float* grad, std::byte* wout,
                              float grad_scale, std::int64_t step) {
  Group& G = *groups_[g];
  ZeroOffload& off = impl_->off;
  const std::size_t n = c.elems;
  const std::size_t wbytes = dtype_bytes(working_dtype_);
  optim::OptimShard s;
  s.master = std::span<float>(state, n);
  s.moment1 = std::span<float>(state + n, n);
  if (off.nstate == 3) s.moment2 = std::span<float>(state + 2 * n, n);
  s.grad = optim::GradRef{grad, DType::F32};
  if (working_dtype_ != DType::F32) s.out = optim::LowPrecisionOut{wout, working_dtype_};
  impl_->optimizer.apply(std::span<const optim::OptimShard>(&s, 1), grad_scale, step, impl_->exec);
  if (working_dtype_ == DType::F32) std::memcpy(wout, state, 4 * n);
  off.chunk_updates.fetch_add(1);
  // Working weights that live on the device get the new values now.
  void* dev = nullptr;
  if (G.plan.sharded_params && !off.params) {
    dev = G.w_shard.as<std::byte>() + c.begin * wbytes;
  } else if (!G.plan.sharded_params) {
    dev = G.w_full.as<std::byte>() + (G.plan.state_offset + c.begin) * wbytes;
  }
  if (dev != nullptr) {
    off.transfer->copy_h2d(dev, wout, n * wbytes);
    off.transfer->synchronize();
    off.copy_bytes.fetch_add(n * wbytes);
  }
}

void ZeroEngine::run_offloaded_optimizer(float grad_scale) {
  ZeroOffload& off = impl_->off;
  const std::size_t wbytes = dtype_bytes(working_dtype_);
  const std::int64_t step_no = impl_->optimizer.step_count() + 1;
  std::vector<ChunkJob> jobs;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    Group& G = *groups_[g];
    for (std::size_t k = 0; k < G.plan.chunks.size(); ++k) {
      const StateChunk c = G.plan.chunks[k];
      const std::size_t n = c.elems;
      ChunkJob job;
      add_field(job, ZeroOffload::state_key(g, k), off.opt_tier, static_cast<std::size_t>(off.nstate) * 4 * n,
                ChunkField::Update);
      add_field(job, ZeroOffload::grad_key(g, k), off.opt_tier, 4 * n, ChunkField::Read);
      job.remove_after.push_back(ZeroOffload::grad_key(g, k));
      if (off.params && G.plan.sharded_params) {
        add_field(job, ZeroOffload::param_key(g, k), off.param_tier, n * wbytes, ChunkField::Write);
      } else {
        add_field(job, "", Tier::Host, n * wbytes, ChunkField::Scratch);
      }
      job.work = [=, this](std::span<const std::span<std::byte>> f) {
        update_chunk(g, c, as<float>(f[0]), as<float>(f[1]), f[2].data(), grad_scale, step_no);
      };
      add_capture(off, job, g, k, 0, static_cast<std::size_t>(off.nstate) * 4 * n);
      jobs.push_back(std::move(job));
    }
  }
  ChunkPipeline(*off.store, *off.pool).run(jobs);
}

void ZeroEngine::drop_offloaded_grads() {
  ZeroOffload& off = impl_->off;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (std::size_t k = 0; k < groups_[g]->plan.chunks.size(); ++k) off.store->remove(ZeroOffload::grad_key(g, k));
  }
}

std::vector<float> ZeroEngine::offloaded_master_range(std::size_t g) {
  Group& G = group(g);
  ZeroOffload& off = impl_->off;
  if (off.worker) off.worker->synchronize();
  const auto nstate = static_cast<std::size_t>(off.nstate);
  std::vector<float> out(G.plan.state_elems);
  HostBuffer staging;
  if (off.opt_tier == Tier::Nvme) staging = HostBuffer::allocate(offload::SwapStore::padded(nstate * 4 * off.chunk_elems));
  for (std::size_t k = 0; k < G.plan.chunks.size(); ++k) {
    const StateChunk& c = G.plan.chunks[k];
    const std::string key = ZeroOffload::state_key(g, k);
    const std::byte* src = nullptr;
    if (off.opt_tier == Tier::Host) {
      src = off.store->host(key, nstate * 4 * c.elems).data();
    } else {
      off.store->read_now(key, staging.as<std::byte>());
      src = static_cast<const std::byte*>(staging.data());
    }
    std::memcpy(out.data() + c.begin, src, 4 * c.elems);
  }
  return out;
}

bool ZeroEngine::optimizer_offloaded() const { return impl_->off.optimizer; }
bool ZeroEngine::params_offloaded() const { return impl_->off.params; }
TierIoStats ZeroEngine::tier_stats() const { return impl_->off.store ? impl_->off.store->stats() : TierIoStats{}; }
std::uint64_t ZeroEngine::chunk_updates() const { return impl_->off.chunk_updates.load(); }
std::uint64_t ZeroEngine::overlapped_chunk_updates() const { return impl_->off.overlapped_chunks.load(); }
std::uint64_t ZeroEngine::offload_copy_bytes() const { return impl_->off.copy_bytes.load(); }

std::size_t ZeroEngine::pinned_pool_bytes() const {
  const ZeroOffload& off = impl_->off;
  std::size_t bytes = 0;
  for (const auto* p : {off.pool.get(), off.param_pool.get()}) {
    if (p != nullptr) bytes += p->slot_bytes() * p->slot_count();
  }
  return bytes;
}

}  // namespace strata
