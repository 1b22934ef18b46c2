// The optimizer state on the device (engine/state_home.h): fp32 master and moments of this rank's
// state range in device memory, the step's gradient sum formed there (the binary counter of Note
// [Exact gradient sums] in exact mode, one accumulator otherwise), the norm's block partials and
// the update enqueued as device ops (engine/device_ops.h) on the communication stream.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/host_buffer.h"
#include "engine/device_ops.h"
#include "engine/state_home.h"
#include "engine/working_weights.h"
#include "plan/part_bytes.h"

namespace strata {

namespace {

class DeviceStateHome final : public StateHome {
 public:
  DeviceStateHome(EngineContext& ctx, WorkingWeights& weights)
      : ctx_(ctx), weights_(weights), groups_(ctx.group_count()) {
    allocate_norms();
  }

  // Note [Gradient buffers kept across steps]: the step's gradient (one unit: the reduction itself,
  // Note [One unit's gradient as it is]; fast mode: the fp32 accumulator) has the same size every
  // step, so it is allocated once, beside the state, and reused: allocated and freed per step, those
  // buffers would interleave with the micro-batch's transient ones and fragment the device
  // (docs/MEASUREMENTS.md, "Device memory: buffers kept across steps"). The comm stream writes them
  // (the reduction, the widening) and reads them (norm, update) in order, so reuse needs no other
  // synchronization. Exact mode's binary-counter levels are a pool of grad_partials buffers (the
  // most a step holds at once, with the one being formed), taken and given back on the comm stream,
  // since a level allocated per unit fragments a device capped at the plan.
  // The sizes are the plan's (see Note [Part bytes] in plan/part_bytes.h).
  void init_group(std::size_t g, const float* master_full, const void* /*working_full*/) override {
    Group& G = groups_[g];
    const GroupPlan& P = ctx_.group(g);
    const std::size_t bytes = device_state_array_bytes(ctx_.plan, g);
    G.master = ctx_.device.allocate(bytes, "optim.master");
    ctx_.comm.copy_h2d(G.master.data(), master_full + P.state_offset, bytes);
    G.moment1 = ctx_.device.allocate(bytes, "optim.moments");
    ctx_.comm.memset(G.moment1.data(), 0, bytes);
    if (ctx_.plan.state_arrays == 3) {
      G.moment2 = ctx_.device.allocate(bytes, "optim.moments");
      ctx_.comm.memset(G.moment2.data(), 0, bytes);
    }
    const DeviceGradBuffers grads = device_grad_buffers(ctx_.plan, g);
    if (ctx_.accumulation() == 1) {
      G.direct = ctx_.device.allocate(grads.bytes, grads.tag);
    } else if (!ctx_.exact()) {
      G.accum = ctx_.device.allocate(grads.bytes, grads.tag);
    } else {
      for (int i = 0; i < grads.count; ++i) G.spare.push_back(ctx_.device.allocate(grads.bytes, grads.tag));
    }
  }

  void* reduction_target(std::size_t g) override { return groups_[g].direct.empty() ? nullptr : groups_[g].direct.data(); }

  float* device_master(std::size_t g) const override { return groups_[g].master.as<float>(); }

  bool prepare_step(double /*lr*/) override { return false; }
  bool take_overlap(double /*lr*/) override { return false; }

  // One micro-batch's reduced gradient joins the step's fp32 sum on the device, through the device
  // front layer on the communication stream.
  // Note [One unit's gradient as it is]: with one micro-batch per step the sum is that gradient
  // widened, and widening is exact, so the norm and the optimizer read the reduced gradient in the
  // working dtype directly (optim::GradRef carries the dtype): the same bits, without an fp32 copy
  // (4 bytes per parameter at the step's peak).
  void add_unit(std::size_t g, DeviceMemory reduced, int unit) override {
    Group& G = groups_[g];
    const std::size_t elems = ctx_.group(g).grad_elems;
    const DType dtype = ctx_.working();
    const void* src = reduced.data();
    Stream& comm = ctx_.comm;
    if (ctx_.accumulation() == 1) {
      STRATA_CHECK(unit == 0 && reduced.empty(), "group {}: a unit not reduced into the step's gradient", g);
      return;  // the reduction wrote G.direct (reduction_target)
    }
    if (!ctx_.exact()) {
      if (unit == 0) {
        device_ops::convert(comm, src, dtype, G.accum.as<float>(), DType::F32, elems);
      } else {
        // accum = widen(reduced) + accum: the order is irrelevant in fast mode.
        device_ops::convert_add_left(comm, src, dtype, G.accum.as<float>(), elems);
      }
    } else {
      const auto merges = static_cast<std::size_t>(counter_merges(unit));
      STRATA_CHECK(!G.spare.empty(), "group {}: more binary-counter levels than the plan's {}", g,
                   ctx_.plan.grad_partials);
      DeviceMemory carry = std::move(G.spare.back());
      G.spare.pop_back();
      device_ops::convert(comm, src, dtype, carry.as<float>(), DType::F32, elems);
      for (std::size_t k = 0; k < merges; ++k) {
        device_ops::add_left(comm, carry.as<float>(), G.levels[k].as<float>(), elems);
        G.spare.push_back(std::move(G.levels[k]));  // reused after this add, in the comm stream's order
      }
      if (G.levels.size() <= merges) G.levels.resize(merges + 1);
      G.levels[merges] = std::move(carry);
    }
    comm.release_after(std::move(reduced));
  }

  // Each group's partial sums folded into one fp32 gradient (exact: lowest level first, each higher
  // level on the left; fast: the accumulator), then every group's norm part (Note [One wait for the
  // norm]).
  void finish_grads() override {
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      Group& G = groups_[g];
      G.final_dtype = ctx_.plan.final_grad_dtype();
      if (ctx_.accumulation() == 1) {
        G.final_grad = G.direct.data();
        continue;
      }
      if (!ctx_.exact()) {
        G.final_grad = G.accum.as<float>();
        continue;
      }
      float* acc = nullptr;
      for (auto& level : G.levels) {
        if (level.empty()) continue;
        if (acc == nullptr) {
          acc = level.as<float>();
        } else {
          device_ops::add_left(ctx_.comm, acc, level.as<float>(), ctx_.group(g).grad_elems);
        }
      }
      G.final_grad = acc;
    }
    enqueue_norms();
    ctx_.comm.synchronize();
  }

  std::vector<double> block_partials(std::size_t g) override {
    STRATA_CHECK(!ctx_.exact(), "group {}: block partials in exact mode (its norm is the exact sum)", g);
    const double* first = norm_slice<double>(norms_.data(), g);
    return std::vector<double>(first, first + device_ops::sum_squares_blocks(ctx_.group(g).grad_elems));
  }

  bool partials_are_shards() const override { return ctx_.plan.stage >= 2; }

  optim::ExactSquares exact_squares(std::size_t g) override {
    STRATA_CHECK(ctx_.exact(), "group {}: exact_squares outside exact mode", g);
    const optim::ExactSquares* first = norm_slice<optim::ExactSquares>(norms_.data(), g);
    optim::ExactSquares sum;
    for (std::size_t p = 0; p < device_ops::exact_sum_squares_parts(ctx_.group(g).grad_elems); ++p) sum.merge(first[p]);
    return sum;
  }

  // The update, enqueued on the communication stream (the weights' publishing follows it there).
  void update(double lr, float grad_scale, std::int64_t step) override {
    ctx_.optimizer.set_lr(lr);
    std::vector<optim::OptimShard> shards;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      Group& G = groups_[g];
      const GroupPlan& P = ctx_.group(g);
      optim::OptimShard s;
      s.master = std::span<float>(G.master.as<float>(), P.state_elems);
      s.moment1 = std::span<float>(G.moment1.as<float>(), P.state_elems);
      if (!G.moment2.empty()) s.moment2 = std::span<float>(G.moment2.as<float>(), P.state_elems);
      s.grad = optim::GradRef{static_cast<const std::byte*>(G.final_grad) + P.grad_offset * dtype_bytes(G.final_dtype),
                              G.final_dtype};
      if (ctx_.working() != DType::F32) s.out = optim::LowPrecisionOut{weights_.state_range(g), ctx_.working()};
      shards.push_back(s);
    }
    device_ops::optimizer_update(ctx_.comm, ctx_.optimizer, shards, grad_scale, step, ctx_.exec);
  }

  void drop_grads() override {}

  void end_step() override {
    for (Group& G : groups_) {
      for (auto& level : G.levels) {
        if (!level.empty()) G.spare.push_back(std::move(level));
      }
      G.levels.clear();
      G.final_grad = nullptr;  // G.direct and G.accum stay for the next step
    }
  }

  std::vector<StateChunkInfo> pieces() const override {
    std::vector<StateChunkInfo> out;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const std::size_t n = ctx_.group(g).state_elems;
      for (std::size_t b = 0; b < n; b += kStatePieceElems) out.push_back({g, b, std::min(kStatePieceElems, n - b)});
    }
    return out;
  }

  std::size_t export_depth() const override { return 4; }

  // Device state goes through a host staging buffer filled by one copy per array.
  StatePiece fetch_piece(std::size_t /*index*/, const StateChunkInfo& c, std::vector<HostBuffer>& spare) override {
    const Group& G = groups_[c.group];
    const auto nstate = static_cast<std::size_t>(ctx_.plan.state_arrays);
    StatePiece p;
    p.meaningful = nstate * 4 * c.elems;
    const std::size_t padded = offload::SwapStore::padded(p.meaningful);
    if (!spare.empty() && spare.back().size_bytes() >= padded) {
      p.staging = std::move(spare.back());
      spare.pop_back();
    } else {
      const std::size_t largest = std::min(kStatePieceElems, ctx_.group(c.group).state_elems);
      p.staging = HostBuffer::allocate(offload::SwapStore::padded(nstate * 4 * largest));
    }
    p.bytes = std::span<std::byte>(p.staging.as<std::byte>().data(), padded);
    const DeviceMemory* arrays[] = {&G.master, &G.moment1, &G.moment2};
    for (std::size_t a = 0; a < nstate; ++a) {
      ctx_.comm.copy_d2h(p.bytes.data() + a * c.elems * 4, arrays[a]->as<float>() + c.begin_elems, c.elems * 4);
    }
    ctx_.comm.synchronize();
    std::memset(p.bytes.data() + p.meaningful, 0, padded - p.meaningful);
    return p;
  }

  void import_state(const StateSource& source) override;

  std::vector<float> master_range(std::size_t g) override {
    std::vector<float> out(ctx_.group(g).state_elems);
    ctx_.comm.copy_d2h(out.data(), groups_[g].master.data(), out.size() * sizeof(float));
    ctx_.comm.synchronize();
    return out;
  }

  bool arm_capture(StateCaptureSink /*sink*/) override { return false; }
  void disarm_capture() override {}
  std::size_t captured_pieces() const override { return 0; }

  StateHomeStats stats() const override { return {}; }

 private:
  struct Group {
    DeviceMemory master;
    DeviceMemory moment1;
    DeviceMemory moment2;
    std::vector<DeviceMemory> levels;  // exact: binary-counter partial sums (fp32, grad_elems)
    std::vector<DeviceMemory> spare;   // exact: the levels' buffers not in use (kept across steps)
    DeviceMemory accum;                // fast, several units: one fp32 accumulator (kept across steps)
    DeviceMemory direct;               // one unit per step: its reduced gradient, working dtype (kept)
    const void* final_grad = nullptr;  // between finish_grads and end_step
    DType final_dtype = DType::F32;
  };

  // Note [One wait for the norm]: step() needs every group's part of the norm on the host (exact
  // mode: its exact sum, otherwise its block partials) to decide the clip. Enqueued one group at a
  // time, each waited for by itself, the host and the communication stream woke each other once per
  // group (on the sim device some 40 us a wait, docs/MEASUREMENTS.md, "Device memory: buffers kept
  // across steps"; on a GPU, a stream synchronization per group). So every group's norm op writes
  // its slice of one device buffer ("norm.partials"), one copy brings them all into one pinned host
  // buffer (the copy stays asynchronous on cuda), and finish_grads waits once for all of them. Both
  // buffers are allocated with the state home, at the plan's size (see Note [Part bytes] in
  // plan/part_bytes.h: norm_partials_bytes), and reused every step: the norm allocates nothing per
  // step, on cuda as on sim, so a device capped at the plan holds it. The host buffer is page-locked
  // before any step's work is queued: once a step runs, streams are running and on cuda the pin may
  // wait for all of them (Note [Pinning while streams run] in core/device/sim_device.cc).
  void allocate_norms() {
    const std::uint64_t bytes = device_norm_bytes(ctx_.plan);
    if (bytes > 0) norm_partials_ = ctx_.device.allocate(bytes, "norm.partials");
    for (std::size_t g = 0; g < groups_.size(); ++g) norm_offsets_.push_back(norm_partials_offset(ctx_.plan, g));
    HostBufferOptions o;
    o.pinner = &ctx_.device;
    norms_ = HostBuffer::allocate(std::max<std::uint64_t>(bytes, 1), o);
  }

  // Group g's slice of the norm's device buffer, or of its host copy.
  template <typename T>
  T* norm_slice(void* base, std::size_t g) const {
    return reinterpret_cast<T*>(static_cast<std::byte*>(base) + norm_offsets_[g]);
  }

  void enqueue_norms() {
    const bool exact = ctx_.exact();
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const std::size_t n = ctx_.group(g).grad_elems;
      const Group& G = groups_[g];
      if (exact) {
        device_ops::exact_sum_squares(ctx_.comm, G.final_grad, G.final_dtype, n,
                                      norm_slice<optim::ExactSquares>(norm_partials_.data(), g), ctx_.exec);
      } else {
        device_ops::block_sum_squares(ctx_.comm, G.final_grad, G.final_dtype, n,
                                      norm_slice<double>(norm_partials_.data(), g), ctx_.exec);
      }
    }
    if (const std::uint64_t bytes = norm_partials_total(ctx_.plan); bytes > 0) {
      ctx_.comm.copy_d2h(norms_.data(), norm_partials_.data(), bytes);
    }
  }

  EngineContext& ctx_;
  WorkingWeights& weights_;
  std::vector<Group> groups_;
  DeviceMemory norm_partials_;  // see Note [One wait for the norm]: every group's slice, written on the device
  HostBuffer norms_;            // and copied here once per step
  std::vector<std::uint64_t> norm_offsets_;  // group g's slice begins here, in both
};

// Master and moments piece by piece from `source`, and W over the state range from the new master
// (the optimizer's rounding) where the device keeps a separate copy.
void DeviceStateHome::import_state(const StateSource& source) {
  const std::size_t wbytes = ctx_.wbytes();
  std::vector<float> piece;
  WorkingCopy w;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    Group& G = groups_[g];
    const std::size_t n_state = ctx_.group(g).state_elems;
    DeviceMemory* arrays[] = {&G.master, &G.moment1, &G.moment2};
    piece.resize(std::min(kStatePieceElems, n_state));
    auto* wdst = static_cast<std::byte*>(weights_.state_range(g));
    for (int a = 0; a < ctx_.plan.state_arrays; ++a) {
      auto* dst = arrays[a]->as<float>();
      for (std::size_t b = 0; b < n_state; b += kStatePieceElems) {
        const std::size_t n = std::min(kStatePieceElems, n_state - b);
        source(g, a, b, std::span<float>(piece.data(), n));
        ctx_.comm.copy_h2d(dst + b, piece.data(), n * sizeof(float));
        if (a == 0 && wdst != nullptr) {
          ctx_.comm.copy_h2d(wdst + b * wbytes, w.convert(piece.data(), ctx_.working(), n), n * wbytes);
        }
        ctx_.comm.synchronize();  // the staging is refilled by the next piece
      }
    }
  }
}

}  // namespace

std::unique_ptr<StateHome> make_device_state_home(EngineContext& ctx, WorkingWeights& weights) {
  return std::make_unique<DeviceStateHome>(ctx, weights);
}

}  // namespace strata
