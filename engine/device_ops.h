// The engine's math on device memory, through one front layer: widening and narrowing of
// gradients, the left-operand adds of the exact gradient sums, the per-block sums of squares of
// the global norm, and the optimizer update of device-resident state. The ZeRO engine calls these
// instead of running host code on DeviceMemory, so that it can drive a cuda device as well as the
// sim one (issue 14, item 3).
//
// Every op is enqueued on a Stream and returns at once; it runs when the stream reaches it, in
// stream order with the stream's other work. Pointers are device memory of the stream's device
// unless an argument says otherwise, and must stay valid until the stream has passed the op (an
// event, Stream::synchronize, Stream::release_after). Zero elements enqueue nothing. The backend is
// chosen by stream.device().kind() (core/device/op_dispatch.h, Note [Op backends] in core/device/op_dispatch.h, shared
// with models/kernels/ops.cc):
//  * sim: the CPU kernel, enqueued as a sim kernel (core/device/sim_kernel.h: it runs on the
//    stream's worker; its arguments are captured by value). An exception it throws becomes the
//    stream's sticky error.
//  * cuda: a CUDA launch on the stream's cudaStream_t (engine/device_ops_cuda.cu). An op with no
//    CUDA kernel yet throws DeviceError at enqueue time, naming the op. In a build without the
//    CUDA backend every op on a cuda stream throws DeviceError saying so.
// Argument errors (shard sizes, null pointers) are reported at enqueue time on both backends,
// never later through the stream.
//
// Bits: each op's comment names the host (CPU) function whose bits it gives. On sim it is that very
// function (or the same per-element expression); on cuda the kernels run the same STRATA_HD
// element math (core/dtype.h, optim/optim_math.h), so finite results have the same bits; only the
// payload of a NaN may differ (a GPU writes the canonical NaN).
//
// Compiled in CI with nvcc (warnings as errors); tests/engine/device_ops_cuda_test.cc (label gpu)
// runs the CUDA paths where a GPU is usable (README, "How the CUDA path is verified").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/device/device.h"
#include "core/dtype.h"
#include "optim/cpu_exec.h"
#include "optim/exact_squares.h"
#include "optim/grad_stats.h"
#include "optim/optimizer.h"

namespace strata::device_ops {

// dst = src converted from src_dtype to dst_dtype, n_elems elements (round to nearest even; same
// dtype is a copy). Source and destination must not overlap.
// Bits: core/dtype_bulk.h convert (= the scalar functions of core/dtype.h per element).
// sim: convert_parallel. cuda: core/dtype_convert.h cuda::convert_async.
void convert(Stream& stream, const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n_elems);

// dst[i] = left[i] + dst[i]: fp32, element by element. The operand order is the contract of the
// exact gradient sums (Note [Exact gradient sums] in engine/zero_engine.h): the left operand is
// the older partial sum. dst and left must not overlap.
// Bits: one fp32 add per element, so any split over threads or GPU threads gives the same bits.
// sim: the CPU loop over oneTBB chunks. cuda: a grid-stride kernel.
void add_left(Stream& stream, float* dst, const float* left, std::size_t n_elems);
// The same on host arrays, on the calling thread: the CPU kernel above, which the host/NVMe state
// home's sums run too (one loop for both homes).
void add_left_host(float* dst, const float* left, std::size_t n_elems);

// dst[i] = widen(src[i]) + dst[i], with src in src_dtype (fp32, bf16 or fp16): convert into an fp32
// temporary t, then add_left(dst, t), fused into one pass with no temporary buffer.
// Bits: those of convert(src -> t, F32) followed by add_left(dst, t) (widening is exact).
// sim: CPU chunks (core/dtype_bulk.h convert into a stack tile, then the add). cuda: one kernel.
void convert_add_left(Stream& stream, const void* src, DType src_dtype, float* dst, std::size_t n_elems);

// How many blocks block_sum_squares writes for n_elems gradients: ceil(n_elems / kCpuBlockElems)
// (one definition, optim/grad_stats.h).
using optim::sum_squares_blocks;

// out[b] = the sum of squares, in double, of the gradients of block b (grad_dtype: fp32, bf16
// or fp16, widened exactly): the elements [b * kCpuBlockElems, min((b + 1) * kCpuBlockElems,
// n_elems)) of `grad` (the last block may be partial). `out` is DEVICE memory of
// sum_squares_blocks(n_elems) doubles, written when the stream reaches the op; the caller copies it
// out (Stream::copy_d2h, into pinned memory on cuda: a copy into pageable memory blocks the caller
// until the stream gets there). The op allocates nothing: its buffer is the caller's, sized by the
// plan (see Note [Part bytes] in plan/part_bytes.h), so that what a step allocates on the device is the
// same on every backend.
// Bits: out[b] == optim::grad_stats({GradSpan{block b, grad_dtype, len}}, any exec).sum_squares
// (for a 16-bit gradient: the same as for its fp32 widening), i.e.
// optim/cpu_kernels.h's 16-lane rule (element i to lane i % 16, lanes summed 0..15); adding the
// partials in block order gives grad_stats over the whole buffer.
// sim: grad_stats per block, blocks in parallel (in exec.arena when set; it must outlive the op).
// cuda: a kernel that runs the same lane rule in double, one thread per lane.
void block_sum_squares(Stream& stream, const void* grad, DType grad_dtype, std::size_t n_elems, double* out,
                       const optim::CpuExec& exec = optim::default_cpu_exec());

// The exact sum of squares (optim/exact_squares.h, Note [Exact sum of squares] in optim/exact_squares.h) of n_elems
// gradients of grad_dtype (fp32, bf16 or fp16, widened exactly), the norm of exact mode. `out` is
// DEVICE memory of exact_sum_squares_parts(n_elems) accumulators, one per run of
// optim::kExactMaxAdds elements (one definition, optim/exact_squares.h), written when the stream
// reaches the op; the caller copies them out and merges them (as for block_sum_squares, the buffer
// is the caller's). Bits: the merged sum equals optim::exact_sum_squares over the same values, and
// so any other split of them merged.
// sim: optim::exact_sum_squares per part. cuda: the parts zeroed on the stream, then a kernel
// adding each square's pieces into them with integer atomics (their order cannot matter).
using optim::exact_sum_squares_parts;
void exact_sum_squares(Stream& stream, const void* grad, DType grad_dtype, std::size_t n_elems,
                       optim::ExactSquares* out, const optim::CpuExec& exec = optim::default_cpu_exec());

// One optimizer update of device-resident shards as step number `step` (from 1): master weights,
// moments, the gradient (fp32, bf16 or fp16; multiplied by grad_scale) and, where shard.out is
// set, the bf16/fp16 copy of the new weights. The step counter of `group` is not touched (the
// caller advances it, as with ParamGroup::apply). The group's optimizer and hyper-parameters are
// copied at enqueue time: set_lr after this call does not change the update already enqueued.
// The shard list is copied too; the buffers it points to are what must stay valid.
// Bits: group.apply(shards, grad_scale, step, exec) on the same data.
// sim: group.apply on the stream's worker (in exec.arena when set; it must outlive the op).
// cuda: AdamW/Adam via optim/adam_cuda.h adam_step_cuda (one launch per gradient and output
// dtype); SGD and Lion have no CUDA kernel yet: DeviceError.
// Throws ConfigError (at enqueue) when a shard's buffers disagree in size, a gradient pointer is
// null, or a low-precision copy is asked for in fp32, as ParamGroup::apply would.
void optimizer_update(Stream& stream, const optim::ParamGroup& group,
                      std::span<const optim::OptimShard> device_shards, float grad_scale, std::int64_t step,
                      const optim::CpuExec& exec = optim::default_cpu_exec());

}  // namespace strata::device_ops
