// The engine's device-op front layer (engine/device_ops.h): checks the arguments once, then hands
// each op to the backend dispatch shared with models/kernels/ops.cc (core/device/op_dispatch.h,
// Note [Op backends] in core/device/op_dispatch.h): on sim its CPU kernel (the `cpu` namespace here, or the optim/
// function it promises the bits of), enqueued as a sim kernel with its arguments captured by value; on cuda its
// launcher in engine/device_ops_cuda.h, enqueued on the stream's cudaStream_t.
#include "engine/device_ops.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "core/device/op_dispatch.h"
#include "core/dtype_bulk.h"
#include "core/error.h"
#include "core/tsan.h"
#include "engine/device_ops_cuda.h"
#include "optim/adam_cuda.h"
#include "optim/grad_stats.h"

namespace strata::device_ops {

namespace {

// ---- CPU kernels (what a sim stream runs) ------------------------------------------------------

// Arrays below one chunk run on the stream's worker alone; larger ones split into chunks of this
// many elements (256 KiB of fp32: the split costs nothing and balances over the workers).
constexpr std::size_t kChunkElems = std::size_t{64} << 10;

// fn(begin, end) over [0, n) in chunks, in parallel. Element-wise kernels only: the chunks are
// unordered. The tokens make the hand-over and the join visible to ThreadSanitizer (core/tsan.h).
template <typename Fn>
void parallel_chunks(std::size_t n, const Fn& fn) {
  if (n <= kChunkElems) {
    fn(std::size_t{0}, n);
    return;
  }
  int start = 0;
  int done = 0;
  tsan_release(&start);
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, kChunkElems), [&](const tbb::blocked_range<std::size_t>& r) {
    tsan_acquire(&start);
    fn(r.begin(), r.end());
    tsan_release(&done);
  });
  tsan_acquire(&done);
}

namespace cpu {

void add_left(float* dst, const float* left, std::size_t n) {
  parallel_chunks(n, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) dst[i] = left[i] + dst[i];
  });
}

void convert_add_left(const void* src, DType src_dtype, float* dst, std::size_t n) {
  if (src_dtype == DType::F32) {
    add_left(dst, static_cast<const float*>(src), n);  // widening fp32 is the identity
    return;
  }
  const SimdLevel level = simd_level();
  const std::size_t src_bytes = dtype_bytes(src_dtype);
  const auto* in = static_cast<const unsigned char*>(src);
  parallel_chunks(n, [&](std::size_t begin, std::size_t end) {
    // The widened values go through a tile on the worker's stack (8 KiB: it stays in L1), not a
    // temporary array of the whole size.
    constexpr std::size_t kTileElems = 2048;
    std::array<float, kTileElems> tile;
    for (std::size_t first = begin; first < end; first += kTileElems) {
      const std::size_t count = std::min(kTileElems, end - first);
      strata::convert(level, in + first * src_bytes, src_dtype, tile.data(), DType::F32, count);
      float* d = dst + first;
      for (std::size_t i = 0; i < count; ++i) d[i] = tile[i] + d[i];
    }
  });
}

void block_sum_squares(const void* grad, DType dtype, std::size_t n, double* out, const optim::CpuExec& exec) {
  const std::size_t blocks = sum_squares_blocks(n);
  // Each block is its own grad_stats call, so its partial is grad_stats' value by construction.
  const optim::CpuExec one_block{exec.simd, nullptr};
  auto run = [&] {
    int start = 0;
    int done = 0;
    tsan_release(&start);
    tbb::parallel_for(std::size_t{0}, blocks, [&](std::size_t b) {
      tsan_acquire(&start);
      const std::size_t begin = b * optim::kCpuBlockElems;
      const optim::GradSpan span{static_cast<const std::byte*>(grad) + begin * dtype_bytes(dtype), dtype,
                                 std::min(optim::kCpuBlockElems, n - begin)};
      out[b] = optim::grad_stats(std::span<const optim::GradSpan>(&span, 1), one_block).sum_squares;
      tsan_release(&done);
    });
    tsan_acquire(&done);
  };
  if (exec.arena != nullptr) {
    exec.arena->execute(run);
  } else {
    run();
  }
}

}  // namespace cpu

// ---- Dispatch ----------------------------------------------------------------------------------

// Every op goes through here: its backend is picked in core/device/op_dispatch.h (Note [Op backends] in
// core/device/op_dispatch.h).
template <typename HostFn, typename CudaFn>
void launch(Stream& stream, const char* op, HostFn&& host, CudaFn&& device) {
  run_on_backend(OpSite{stream.device().kind(), &stream, "device op", op}, std::forward<HostFn>(host),
                 std::forward<CudaFn>(device));
}

void check_pointers(const char* op, std::size_t n, std::initializer_list<const void*> pointers) {
  if (n == 0) return;
  for (const void* p : pointers) {
    STRATA_CHECK(p != nullptr, "device op '{}' got a null pointer for {} elements", op, n);
  }
}

// ---- optimizer_update's checks -----------------------------------------------------------------

bool is_adam(optim::OptimizerKind kind) {
  return kind == optim::OptimizerKind::AdamW || kind == optim::OptimizerKind::Adam;
}

// The checks ParamGroup::apply makes (optim/optimizer.cc), made here at enqueue time so that a bad
// shard is an exception from this call, not a sticky error of the stream later.
void check_shards(const optim::ParamGroup& group, std::span<const optim::OptimShard> shards) {
  const optim::OptimizerKind kind = group.kind();
  // sgd_step decides on the float momentum it runs with; so does this check.
  const bool sgd_without_buffer =
      kind == optim::OptimizerKind::Sgd && static_cast<float>(group.sgd_params().momentum) == 0.0f;
  const bool needs_moment1 = !sgd_without_buffer;
  const bool needs_moment2 = is_adam(kind);
  const std::string_view name = optim::optimizer_name(kind);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const optim::OptimShard& s = shards[i];
    const std::size_t n = s.master.size();
    auto where = [&] {
      return fmt::format("optimizer_update of param group '{}': {} shard {}", group.name(), name, i);
    };
    if (needs_moment1 && s.moment1.size() != n) {
      throw ConfigError(fmt::format("{}: moment1 has {} elements but master has {}; give both the same size", where(),
                                    s.moment1.size(), n));
    }
    if (needs_moment2 && s.moment2.size() != n) {
      throw ConfigError(fmt::format("{}: moment2 has {} elements but master has {}; give both the same size", where(),
                                    s.moment2.size(), n));
    }
    if (n > 0 && s.grad.data == nullptr) {
      throw ConfigError(fmt::format("{}: the gradient pointer is null for {} elements", where(), n));
    }
    if (s.out.data != nullptr && s.out.dtype == DType::F32) {
      throw ConfigError(fmt::format("{}: the low-precision copy must be bf16 or fp16, not fp32 (fp32 weights are "
                                    "the master buffer itself)",
                                    where()));
    }
  }
}

// AdamW/Adam on cuda: adam_step_cuda takes one gradient dtype and one output dtype per call, so
// the shards go out in one launch per (gradient dtype, output dtype) pair, in a fixed order. The
// update is element-wise, so the split does not change any bits. (Reached only from a cuda lambda,
// which a build without CUDA never instantiates: hence maybe_unused.)
[[maybe_unused]] void adam_update_cuda(const optim::ParamGroup& group, std::span<const optim::OptimShard> shards,
                                       float grad_scale, std::int64_t step, void* native) {
  const optim::AdamStepConsts consts = optim::make_adam_consts(group.adam_params(), step, grad_scale);
  const optim::WeightDecayMode mode = group.adam_params().weight_decay_mode;
  for (DType grad_dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (DType out_dtype : {DType::BF16, DType::F16}) {
      std::vector<optim::DeviceAdamTensor> tensors;
      for (const optim::OptimShard& s : shards) {
        // A shard without a copy rides along with the bf16 launch of its gradient dtype.
        const DType shard_out = s.out.data != nullptr ? s.out.dtype : DType::BF16;
        if (s.master.empty() || s.grad.dtype != grad_dtype || shard_out != out_dtype) continue;
        tensors.push_back(optim::DeviceAdamTensor{s.master.data(), s.moment1.data(), s.moment2.data(), s.grad.data,
                                                  s.out.data, s.master.size()});
      }
      if (!tensors.empty()) optim::adam_step_cuda(consts, mode, grad_dtype, out_dtype, tensors, native);
    }
  }
}

}  // namespace

// ---- The ops -----------------------------------------------------------------------------------

void convert(Stream& stream, const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n_elems) {
  if (n_elems == 0) return;
  check_pointers("convert", n_elems, {src, dst});
  launch(
      stream, "convert", [=] { convert_parallel(src, src_dtype, dst, dst_dtype, n_elems); },
      [=](auto native) { cuda::convert(src, src_dtype, dst, dst_dtype, n_elems, native); });
}

void add_left_host(float* dst, const float* left, std::size_t n_elems) { cpu::add_left(dst, left, n_elems); }

void add_left(Stream& stream, float* dst, const float* left, std::size_t n_elems) {
  if (n_elems == 0) return;
  check_pointers("add_left", n_elems, {dst, left});
  launch(
      stream, "add_left", [=] { cpu::add_left(dst, left, n_elems); },
      [=](auto native) { cuda::add_left(dst, left, n_elems, native); });
}

void convert_add_left(Stream& stream, const void* src, DType src_dtype, float* dst, std::size_t n_elems) {
  if (n_elems == 0) return;
  check_pointers("convert_add_left", n_elems, {src, dst});
  launch(
      stream, "convert_add_left", [=] { cpu::convert_add_left(src, src_dtype, dst, n_elems); },
      [=](auto native) { cuda::convert_add_left(src, src_dtype, dst, n_elems, native); });
}

void block_sum_squares(Stream& stream, const void* grad, DType grad_dtype, std::size_t n_elems, double* out,
                       const optim::CpuExec& exec) {
  if (n_elems == 0) return;
  check_pointers("block_sum_squares", n_elems, {grad, out});
  launch(
      stream, "block_sum_squares", [=] { cpu::block_sum_squares(grad, grad_dtype, n_elems, out, exec); },
      [=](auto native) { cuda::block_sum_squares(grad, grad_dtype, n_elems, optim::kCpuBlockElems, out, native); });
}

void exact_sum_squares(Stream& stream, const void* grad, DType grad_dtype, std::size_t n_elems,
                       optim::ExactSquares* out, const optim::CpuExec& exec) {
  if (n_elems == 0) return;
  check_pointers("exact_sum_squares", n_elems, {grad, out});
  const std::size_t parts = exact_sum_squares_parts(n_elems);
  launch(
      stream, "exact_sum_squares",
      [=] {
        for (std::size_t p = 0; p < parts; ++p) {
          const std::size_t begin = p * optim::kExactMaxAdds;
          const std::size_t n = std::min<std::size_t>(optim::kExactMaxAdds, n_elems - begin);
          out[p] = optim::exact_sum_squares(static_cast<const std::byte*>(grad) + begin * dtype_bytes(grad_dtype),
                                            grad_dtype, n, exec);
        }
      },
      [&stream, grad, grad_dtype, n_elems, out, parts](auto native) {
        // The kernel adds into the parts' words: they start from zero, in stream order.
        stream.memset(out, 0, parts * sizeof(optim::ExactSquares));
        cuda::exact_sum_squares(grad, grad_dtype, n_elems, reinterpret_cast<std::uint64_t*>(out), native);
      });
}

void optimizer_update(Stream& stream, const optim::ParamGroup& group,
                      std::span<const optim::OptimShard> device_shards, float grad_scale, std::int64_t step,
                      const optim::CpuExec& exec) {
  STRATA_CHECK(step >= 1, "optimizer_update of param group '{}' as step {} (steps count from 1)", group.name(), step);
  if (stream.device().kind() == DeviceKind::Cuda && !is_adam(group.kind())) {
    throw DeviceError(fmt::format("device op 'optimizer_update': {} (param group '{}') is not wired for cuda yet; only "
                                  "AdamW and Adam have a CUDA kernel (optim/adam_cuda.h). Use AdamW/Adam, or the sim "
                                  "device",
                                  optim::optimizer_name(group.kind()), group.name()));
  }
  check_shards(group, device_shards);
  bool any_elems = false;
  for (const optim::OptimShard& s : device_shards) any_elems = any_elems || !s.master.empty();
  if (!any_elems) return;
  std::vector<optim::OptimShard> shards(device_shards.begin(), device_shards.end());
  launch(
      stream, "optimizer_update",
      // A copy of the group: set_lr or a checkpoint restore on the caller's thread cannot race
      // with the update, and the update uses the hyper-parameters of the moment it was enqueued.
      [group, shards, grad_scale, step, exec] { group.apply(shards, grad_scale, step, exec); },
      [&group, &shards, grad_scale, step](auto native) { adam_update_cuda(group, shards, grad_scale, step, native); });
}

}  // namespace strata::device_ops
