// The op-set front layer (models/kernels/ops.h): gives each op as its CPU kernel and its CUDA
// launcher (models/kernels/cuda_kernels.h: cuBLAS for matmul, Strata's kernels in
// models/kernels/*.cu for the rest) to the backend dispatch shared with engine/device_ops.cc
// (core/device/op_dispatch.h, Note [Op backends] in core/device/op_dispatch.h): the CPU kernel inline or enqueued on a
// sim stream, the launcher on the stream's cudaStream_t. Arguments are captured by value: on a stream
// the kernel runs later, after the caller returned.
#include "models/kernels/ops.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "core/device/op_dispatch.h"
#include "core/error.h"
#include "models/kernels/cpu_kernels.h"
#include "models/kernels/cuda_kernels.h"

namespace strata::models {

namespace {

enum class UsesCublas { No, Yes };

#if defined(STRATA_HAVE_CUDA)
// Where a CUDA op enqueues: the stream (checked by the dispatch) and, for the ops that use cuBLAS,
// the handles bound to it.
cuda::Launch cuda_launch(const KernelContext& ctx, const char* op, void* native, UsesCublas uses_cublas) {
  // KernelContext::cublas carries a CublasHandles (models/kernels/cuda_kernels.h) on cuda.
  auto* handles = static_cast<CublasHandles*>(ctx.cublas);
  if (uses_cublas == UsesCublas::Yes) {
    if (handles == nullptr) {
      throw DeviceError(
          fmt::format("model op '{}' on a cuda device needs KernelContext::cublas: a "
                      "models::CublasHandles made for stream '{}' (models/kernels/cuda_kernels.h)",
                      op, ctx.stream->name()));
    }
    if (handles->stream() != native) {
      throw DeviceError(
          fmt::format("model op '{}': KernelContext::cublas is bound to another stream than '{}'; "
                      "make one CublasHandles per stream (they share no workspace)",
                      op, ctx.stream->name()));
    }
  }
  return cuda::Launch{native, handles};
}
#endif

// The op's backend is picked in core/device/op_dispatch.h (Note [Op backends] in core/device/op_dispatch.h); on a sim
// stream with a modeled rate, its host kernel then sleeps out its FLOPs (Note [Modeled compute] in
// models/kernels/ops.h).
template <typename HostFn, typename CudaFn>
void launch_op(const KernelContext& ctx, const char* op, HostFn&& host, CudaFn&& device,
               [[maybe_unused]] UsesCublas uses_cublas, double flops) {
  const OpSite site{ctx.kind, ctx.stream, "model op", op};
  auto on_cuda = [&](auto native) { device(cuda_launch(ctx, op, native, uses_cublas)); };
  if (ctx.kind == DeviceKind::Sim && ctx.stream != nullptr && ctx.modeled_flops_per_s > 0 && flops > 0) {
    const auto modeled = std::chrono::duration<double>(flops / ctx.modeled_flops_per_s);
    run_on_backend(
        site,
        [fn = std::forward<HostFn>(host), modeled] {
          const auto done = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(modeled);
          fn();
          std::this_thread::sleep_until(done);
        },
        on_cuda);
    return;
  }
  run_on_backend(site, std::forward<HostFn>(host), on_cuda);
}

// Every op goes through here: with a profile (and a stream), bracketed by two events.
template <typename HostFn, typename CudaFn>
void launch(const KernelContext& ctx, const char* op, HostFn&& host, CudaFn&& device,
            UsesCublas uses_cublas = UsesCublas::No, double flops = 0) {
  if (ctx.profile == nullptr || ctx.stream == nullptr) {
    launch_op(ctx, op, std::forward<HostFn>(host), std::forward<CudaFn>(device), uses_cublas, flops);
    return;
  }
  Device& dev = ctx.stream->device();
  auto start = dev.create_event(), end = dev.create_event();
  ctx.stream->record(*start);
  launch_op(ctx, op, std::forward<HostFn>(host), std::forward<CudaFn>(device), uses_cublas, flops);
  ctx.stream->record(*end);
  ctx.profile->add(op, std::move(start), std::move(end));
}

// b h s^2 d: a causal attention's products of s x s x d (half the square, 2 FLOPs per multiply-add).
double attention_flops_unit(const AttentionShape& s) {
  return static_cast<double>(s.batch) * static_cast<double>(s.q_heads) * static_cast<double>(s.seq) *
         static_cast<double>(s.seq) * static_cast<double>(s.head_dim);
}

}  // namespace

void OpProfile::add(const char* op, std::unique_ptr<Event> start, std::unique_ptr<Event> end) {
  pending_.push_back(Pending{op, std::move(start), std::move(end)});
}

std::vector<OpProfile::Row> OpProfile::report() {
  for (Pending& p : pending_) {
    p.end->synchronize();
    const double ms = p.end->elapsed_ms_since(*p.start);
    auto row = std::find_if(rows_.begin(), rows_.end(), [&](const Row& r) { return r.op == p.op; });
    if (row == rows_.end()) row = rows_.insert(rows_.end(), Row{p.op, 0, 0});
    row->calls += 1;
    row->ms += ms;
  }
  pending_.clear();
  std::vector<Row> out = std::move(rows_);
  rows_.clear();
  std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  return out;
}

void matmul(const KernelContext& ctx, const MatmulArgs& args) {
  const double flops = 2.0 * static_cast<double>(args.m) * static_cast<double>(args.n) * static_cast<double>(args.k) *
                       static_cast<double>(args.batch);
  launch(
      ctx, "matmul", [args] { cpu::matmul(args); }, [args](const auto& L) { cuda::matmul(L, args); }, UsesCublas::Yes,
      flops);
}

void bias_grad(const KernelContext& ctx, DType dtype, const void* dout, std::int64_t rows, std::int64_t cols,
               std::int64_t ld, void* dbias) {
  launch(
      ctx, "bias_grad", [=] { cpu::bias_grad(dtype, dout, rows, cols, ld, dbias); },
      [=](const auto& L) { cuda::bias_grad(L, dtype, dout, rows, cols, ld, dbias); });
}

void layernorm_forward(const KernelContext& ctx, DType dtype, const void* x, const void* weight, const void* bias,
                       void* out, float* mean, float* rstd, std::int64_t rows, std::int64_t cols, float eps) {
  launch(
      ctx, "layernorm_forward",
      [=] { cpu::layernorm_forward(dtype, x, weight, bias, out, mean, rstd, rows, cols, eps); },
      [=](const auto& L) { cuda::layernorm_forward(L, dtype, x, weight, bias, out, mean, rstd, rows, cols, eps); });
}

void layernorm_backward(const KernelContext& ctx, DType dtype, const void* dout, const void* x, const void* weight,
                        const float* mean, const float* rstd, void* dx, void* dweight, void* dbias, std::int64_t rows,
                        std::int64_t cols, Accumulate accumulate_dx) {
  launch(
      ctx, "layernorm_backward",
      [=] {
        cpu::layernorm_backward(dtype, dout, x, weight, mean, rstd, dx, dweight, dbias, rows, cols, accumulate_dx);
      },
      [=](const auto& L) {
        cuda::layernorm_backward(L, dtype, dout, x, weight, mean, rstd, dx, dweight, dbias, rows, cols, accumulate_dx);
      });
}

void rmsnorm_forward(const KernelContext& ctx, DType dtype, const void* x, const void* weight, void* out, float* rstd,
                     std::int64_t rows, std::int64_t cols, float eps) {
  launch(
      ctx, "rmsnorm_forward", [=] { cpu::rmsnorm_forward(dtype, x, weight, out, rstd, rows, cols, eps); },
      [=](const auto& L) { cuda::rmsnorm_forward(L, dtype, x, weight, out, rstd, rows, cols, eps); });
}

void rmsnorm_backward(const KernelContext& ctx, DType dtype, const void* dout, const void* x, const void* weight,
                      const float* rstd, void* dx, void* dweight, std::int64_t rows, std::int64_t cols,
                      Accumulate accumulate_dx) {
  launch(
      ctx, "rmsnorm_backward",
      [=] { cpu::rmsnorm_backward(dtype, dout, x, weight, rstd, dx, dweight, rows, cols, accumulate_dx); },
      [=](const auto& L) {
        cuda::rmsnorm_backward(L, dtype, dout, x, weight, rstd, dx, dweight, rows, cols, accumulate_dx);
      });
}

void gelu_forward(const KernelContext& ctx, DType dtype, const void* x, void* out, std::int64_t n) {
  launch(
      ctx, "gelu_forward", [=] { cpu::gelu_forward(dtype, x, out, n); },
      [=](const auto& L) { cuda::gelu_forward(L, dtype, x, out, n); });
}

void gelu_backward(const KernelContext& ctx, DType dtype, const void* x, const void* dout, void* dx, std::int64_t n) {
  launch(
      ctx, "gelu_backward", [=] { cpu::gelu_backward(dtype, x, dout, dx, n); },
      [=](const auto& L) { cuda::gelu_backward(L, dtype, x, dout, dx, n); });
}

void swiglu_forward(const KernelContext& ctx, DType dtype, const void* gate_up, void* out, std::int64_t rows,
                    std::int64_t hidden) {
  launch(
      ctx, "swiglu_forward", [=] { cpu::swiglu_forward(dtype, gate_up, out, rows, hidden); },
      [=](const auto& L) { cuda::swiglu_forward(L, dtype, gate_up, out, rows, hidden); });
}

void swiglu_backward(const KernelContext& ctx, DType dtype, const void* gate_up, const void* dout, void* dgate_up,
                     std::int64_t rows, std::int64_t hidden) {
  launch(
      ctx, "swiglu_backward", [=] { cpu::swiglu_backward(dtype, gate_up, dout, dgate_up, rows, hidden); },
      [=](const auto& L) { cuda::swiglu_backward(L, dtype, gate_up, dout, dgate_up, rows, hidden); });
}

void attention_forward(const KernelContext& ctx, DType dtype, const AttentionShape& shape, const void* q, const void* k,
                       const void* v, void* out, float* lse) {
  launch(
      ctx, "attention_forward", [=] { cpu::attention_forward(dtype, shape, q, k, v, out, lse); },
      [=](const auto& L) { cuda::attention_forward(L, dtype, shape, q, k, v, out, lse); }, UsesCublas::No,
      2 * attention_flops_unit(shape));
}

void attention_backward(const KernelContext& ctx, DType dtype, const AttentionShape& shape, const void* q,
                        const void* k, const void* v, const void* out, const float* lse, const void* dout, void* dq,
                        void* dk, void* dv) {
  launch(
      ctx, "attention_backward", [=] { cpu::attention_backward(dtype, shape, q, k, v, out, lse, dout, dq, dk, dv); },
      [=](const auto& L) { cuda::attention_backward(L, dtype, shape, q, k, v, out, lse, dout, dq, dk, dv); },
      UsesCublas::No, 5 * attention_flops_unit(shape));
}

void attention_cached(const KernelContext& ctx, DType dtype, const CachedAttentionShape& shape, const void* q,
                      const void* k_cache, const void* v_cache, void* out) {
  // q_rows x kv_len x heads x head_dim products, twice (scores and values), 2 FLOPs each.
  const double flops = 4.0 * static_cast<double>(shape.q_rows) * static_cast<double>(shape.kv_len) *
                       static_cast<double>(shape.q_heads) * static_cast<double>(shape.head_dim);
  launch(
      ctx, "attention_cached", [=] { cpu::attention_cached(dtype, shape, q, k_cache, v_cache, out); },
      [=](const auto& L) { cuda::attention_cached(L, dtype, shape, q, k_cache, v_cache, out); }, UsesCublas::No,
      flops);
}

void rope(const KernelContext& ctx, DType dtype, void* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
          std::int64_t head_dim, std::int64_t row_stride, const RopeSpec& spec, RopeDirection direction) {
  launch(
      ctx, "rope", [=] { cpu::rope(dtype, x, batch, seq, heads, head_dim, row_stride, spec, direction); },
      [=](const auto& L) { cuda::rope(L, dtype, x, batch, seq, heads, head_dim, row_stride, spec, direction); });
}

void rope_at(const KernelContext& ctx, DType dtype, void* x, std::int64_t rows, std::int64_t first_position,
             std::int64_t heads, std::int64_t head_dim, std::int64_t row_stride, const RopeSpec& spec) {
  STRATA_CHECK(rows >= 0 && first_position >= 0, "rope_at {} rows from position {}", rows, first_position);
  launch(
      ctx, "rope_at",
      [=] { cpu::rope(dtype, x, 1, rows, heads, head_dim, row_stride, spec, RopeDirection::Forward, first_position); },
      [=](const auto& L) {
        cuda::rope(L, dtype, x, 1, rows, heads, head_dim, row_stride, spec, RopeDirection::Forward, first_position);
      });
}

void embedding_forward(const KernelContext& ctx, DType dtype, const std::int32_t* tokens, const void* wte,
                       const void* wpe, void* out, std::int64_t batch, std::int64_t seq, std::int64_t channels) {
  launch(
      ctx, "embedding_forward", [=] { cpu::embedding_forward(dtype, tokens, wte, wpe, out, batch, seq, channels); },
      [=](const auto& L) { cuda::embedding_forward(L, dtype, tokens, wte, wpe, out, batch, seq, channels); });
}

void embedding_backward(const KernelContext& ctx, DType dtype, const std::int32_t* tokens, const void* dout, void* dwte,
                        void* dwpe, std::int64_t batch, std::int64_t seq, std::int64_t channels) {
  launch(
      ctx, "embedding_backward",
      [=] { cpu::embedding_backward(dtype, tokens, dout, dwte, dwpe, batch, seq, channels); },
      [=](const auto& L) { cuda::embedding_backward(L, dtype, tokens, dout, dwte, dwpe, batch, seq, channels); });
}

void cross_entropy(const KernelContext& ctx, DType dtype, const void* logits, const std::int32_t* targets,
                   float* losses, void* dlogits, std::int64_t rows, std::int64_t vocab, std::int64_t ld,
                   float grad_scale) {
  launch(
      ctx, "cross_entropy",
      [=] { cpu::cross_entropy(dtype, logits, targets, losses, dlogits, rows, vocab, ld, grad_scale); },
      [=](const auto& L) {
        cuda::cross_entropy(L, dtype, logits, targets, losses, dlogits, rows, vocab, ld, grad_scale);
      });
}

void embedding_forward_vocab_slice(const KernelContext& ctx, DType dtype, const std::int32_t* tokens,
                                   const void* wte_slice, std::int64_t vocab_begin, std::int64_t vocab_end,
                                   const void* wpe, void* out, std::int64_t batch, std::int64_t seq,
                                   std::int64_t channels) {
  launch(
      ctx, "embedding_forward_vocab_slice",
      [=] {
        cpu::embedding_forward_vocab_slice(dtype, tokens, wte_slice, vocab_begin, vocab_end, wpe, out, batch, seq,
                                           channels);
      },
      [=](const auto& L) {
        cuda::embedding_forward_vocab_slice(L, dtype, tokens, wte_slice, vocab_begin, vocab_end, wpe, out, batch, seq,
                                            channels);
      });
}

void embedding_backward_vocab_slice(const KernelContext& ctx, DType dtype, const std::int32_t* tokens,
                                    const void* dout, void* dwte_slice, std::int64_t vocab_begin,
                                    std::int64_t vocab_end, void* dwpe, std::int64_t batch, std::int64_t seq,
                                    std::int64_t channels) {
  launch(
      ctx, "embedding_backward_vocab_slice",
      [=] {
        cpu::embedding_backward_vocab_slice(dtype, tokens, dout, dwte_slice, vocab_begin, vocab_end, dwpe, batch, seq,
                                            channels);
      },
      [=](const auto& L) {
        cuda::embedding_backward_vocab_slice(L, dtype, tokens, dout, dwte_slice, vocab_begin, vocab_end, dwpe, batch,
                                             seq, channels);
      });
}

void cross_entropy_row_max(const KernelContext& ctx, DType dtype, const void* logits_slice, std::int64_t rows,
                           std::int64_t cols, std::int64_t ld, float* row_max) {
  launch(
      ctx, "cross_entropy_row_max", [=] { cpu::cross_entropy_row_max(dtype, logits_slice, rows, cols, ld, row_max); },
      [=](const auto& L) { cuda::cross_entropy_row_max(L, dtype, logits_slice, rows, cols, ld, row_max); });
}

void cross_entropy_slice_sums(const KernelContext& ctx, DType dtype, const void* logits_slice,
                              const std::int32_t* targets, std::int64_t rows, std::int64_t ld, std::int64_t vocab,
                              std::int64_t slices, std::int64_t first_slice, std::int64_t local_slices,
                              const float* row_max, double* sums, float* target_logit) {
  launch(
      ctx, "cross_entropy_slice_sums",
      [=] {
        cpu::cross_entropy_slice_sums(dtype, logits_slice, targets, rows, ld, vocab, slices, first_slice, local_slices,
                                      row_max, sums, target_logit);
      },
      [=](const auto& L) {
        cuda::cross_entropy_slice_sums(L, dtype, logits_slice, targets, rows, ld, vocab, slices, first_slice,
                                       local_slices, row_max, sums, target_logit);
      });
}

void cross_entropy_finish(const KernelContext& ctx, DType dtype, const void* logits_slice, const std::int32_t* targets,
                          float* losses, void* dlogits_slice, std::int64_t rows, std::int64_t ld, std::int64_t vocab,
                          std::int64_t slices, std::int64_t first_slice, std::int64_t local_slices,
                          const float* row_max, const double* all_sums, const float* target_logit, float grad_scale) {
  launch(
      ctx, "cross_entropy_finish",
      [=] {
        cpu::cross_entropy_finish(dtype, logits_slice, targets, losses, dlogits_slice, rows, ld, vocab, slices,
                                  first_slice, local_slices, row_max, all_sums, target_logit, grad_scale);
      },
      [=](const auto& L) {
        cuda::cross_entropy_finish(L, dtype, logits_slice, targets, losses, dlogits_slice, rows, ld, vocab, slices,
                                   first_slice, local_slices, row_max, all_sums, target_logit, grad_scale);
      });
}

void residual_add(const KernelContext& ctx, DType dtype, const void* a, const void* b, void* out, std::int64_t n) {
  launch(
      ctx, "residual_add", [=] { cpu::residual_add(dtype, a, b, out, n); },
      [=](const auto& L) { cuda::residual_add(L, dtype, a, b, out, n); });
}

void cast(const KernelContext& ctx, DType src_dtype, const void* src, DType dst_dtype, void* dst, std::int64_t n) {
  launch(
      ctx, "cast", [=] { cpu::cast(src_dtype, src, dst_dtype, dst, n); },
      [=](const auto& L) { cuda::cast(L, src_dtype, src, dst_dtype, dst, n); });
}

}  // namespace strata::models
