// CUDA kernels of layer norm and RMS norm, forward and backward.
//
// Row statistics: one block per row; each thread sums a strided slice of the row in order and
// block_sum (cuda_common.cuh) combines the slices in a fixed tree, so a row's result is the same
// every run. Weight and bias gradients are reductions across rows. In fp32 (exact mode's precision)
// one thread per column walks every row in order with a running fp32 sum that starts from the
// existing gradient, exactly the order of the CPU kernel (cpu_norm.cc), so accumulating over
// several calls equals one call; in bf16/fp16 32 warps split the rows and their partials are added
// in warp order (fixed, not the CPU's). No atomics. The column kernel runs after the row kernel,
// as on the CPU.
//
// Shared per-element math (also called by cpu_norm.cc): math::norm_rstd, math::layernorm_apply,
// math::layernorm_xhat, math::layernorm_dx, math::rmsnorm_apply, math::rmsnorm_xhat,
// math::rmsnorm_dot_term, math::rmsnorm_dx, math::rmsnorm_dweight_term (op_math.h); to_f32 /
// from_f32 for every load and store (core/dtype.h).
#include <type_traits>

#include "models/kernels/cuda_common.cuh"
#include "models/kernels/op_math.h"

namespace strata::models::cuda {
namespace {

// Threads per column-reduction block.
constexpr int kColumnThreads = 64;  // fewer columns per block: more blocks over the SMs
constexpr int kColumnLoads = 16;    // rows loaded ahead of the in-order sums

template <typename T>
__global__ void layernorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                         const T* __restrict__ bias, T* __restrict__ out, float* __restrict__ mean,
                                         float* __restrict__ rstd, std::int64_t cols, float eps) {
  __shared__ float scratch[32];
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * cols;
  float sum = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += to_f32(x[base + c]);
  const float m = block_sum(sum, scratch) / static_cast<float>(cols);
  float var = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = to_f32(x[base + c]) - m;
    var += d * d;
  }
  const float s = math::norm_rstd(block_sum(var, scratch), static_cast<float>(cols), eps);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[base + c] = from_f32<T>(math::layernorm_apply(to_f32(x[base + c]), m, s, to_f32(weight[c]), to_f32(bias[c])));
  }
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = s;
  }
}

template <typename T>
__global__ void layernorm_backward_dx_kernel(const T* __restrict__ dout, const T* __restrict__ x,
                                             const T* __restrict__ weight, const float* __restrict__ mean,
                                             const float* __restrict__ rstd, T* __restrict__ dx, std::int64_t cols,
                                             bool accumulate) {
  __shared__ float scratch[32];
  const std::int64_t r = blockIdx.x;
  const std::int64_t base = r * cols;
  const float m = mean[r], s = rstd[r];
  float g_sum = 0.0f, g_xhat_sum = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xhat = math::layernorm_xhat(to_f32(x[base + c]), m, s);
    const float g = to_f32(dout[base + c]) * to_f32(weight[c]);
    g_sum += g;
    g_xhat_sum += g * xhat;
  }
  const float g_mean = block_sum(g_sum, scratch) / static_cast<float>(cols);
  const float g_xhat_mean = block_sum(g_xhat_sum, scratch) / static_cast<float>(cols);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xhat = math::layernorm_xhat(to_f32(x[base + c]), m, s);
    const float g = to_f32(dout[base + c]) * to_f32(weight[c]);
    float v = math::layernorm_dx(g, xhat, g_mean, g_xhat_mean, s);
    if (accumulate) v += to_f32(dx[base + c]);
    dx[base + c] = from_f32<T>(v);
  }
}

// One thread per column: dweight[c] += sum_r dout * xhat, dbias[c] += sum_r dout, rows in order.
template <typename T>
__global__ void layernorm_backward_params_kernel(const T* __restrict__ dout, const T* __restrict__ x,
                                                 const float* __restrict__ mean, const float* __restrict__ rstd,
                                                 T* __restrict__ dweight, T* __restrict__ dbias, std::int64_t rows,
                                                 std::int64_t cols) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float dw = to_f32(dweight[c]), db = to_f32(dbias[c]);
  std::int64_t r = 0;
  for (; r + kColumnLoads <= rows; r += kColumnLoads) {  // loads ahead, sums in row order
    float xv[kColumnLoads], dv[kColumnLoads];
#pragma unroll
    for (int u = 0; u < kColumnLoads; ++u) {
      xv[u] = to_f32(x[(r + u) * cols + c]);
      dv[u] = to_f32(dout[(r + u) * cols + c]);
    }
#pragma unroll
    for (int u = 0; u < kColumnLoads; ++u) {
      const float xhat = math::layernorm_xhat(xv[u], mean[r + u], rstd[r + u]);
      dw += dv[u] * xhat;
      db += dv[u];
    }
  }
  for (; r < rows; ++r) {
    const float xhat = math::layernorm_xhat(to_f32(x[r * cols + c]), mean[r], rstd[r]);
    const float d = to_f32(dout[r * cols + c]);
    dw += d * xhat;
    db += d;
  }
  dweight[c] = from_f32<T>(dw);
  dbias[c] = from_f32<T>(db);
}

template <typename T>
__global__ void rmsnorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out,
                                       float* __restrict__ rstd, std::int64_t cols, float eps) {
  __shared__ float scratch[32];
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * cols;
  float ss = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = to_f32(x[base + c]);
    ss += v * v;
  }
  const float s = math::norm_rstd(block_sum(ss, scratch), static_cast<float>(cols), eps);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[base + c] = from_f32<T>(math::rmsnorm_apply(to_f32(x[base + c]), s, to_f32(weight[c])));
  }
  if (threadIdx.x == 0) rstd[blockIdx.x] = s;
}

template <typename T>
__global__ void rmsnorm_backward_dx_kernel(const T* __restrict__ dout, const T* __restrict__ x,
                                           const T* __restrict__ weight, const float* __restrict__ rstd,
                                           T* __restrict__ dx, std::int64_t cols, bool accumulate) {
  __shared__ float scratch[32];
  const std::int64_t r = blockIdx.x;
  const std::int64_t base = r * cols;
  const float s = rstd[r];
  float dot = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    dot += math::rmsnorm_dot_term(to_f32(dout[base + c]), to_f32(weight[c]), to_f32(x[base + c]), s);
  }
  const float dot_mean = block_sum(dot, scratch) / static_cast<float>(cols);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xhat = math::rmsnorm_xhat(to_f32(x[base + c]), s);
    float v = math::rmsnorm_dx(to_f32(dout[base + c]), to_f32(weight[c]), xhat, dot_mean, s);
    if (accumulate) v += to_f32(dx[base + c]);
    dx[base + c] = from_f32<T>(v);
  }
}

template <typename T>
__global__ void rmsnorm_backward_weight_kernel(const T* __restrict__ dout, const T* __restrict__ x,
                                               const float* __restrict__ rstd, T* __restrict__ dweight,
                                               std::int64_t rows, std::int64_t cols) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float dw = to_f32(dweight[c]);
  std::int64_t r = 0;
  for (; r + kColumnLoads <= rows; r += kColumnLoads) {  // loads ahead, sums in row order
    float xv[kColumnLoads], dv[kColumnLoads];
#pragma unroll
    for (int u = 0; u < kColumnLoads; ++u) {
      xv[u] = to_f32(x[(r + u) * cols + c]);
      dv[u] = to_f32(dout[(r + u) * cols + c]);
    }
#pragma unroll
    for (int u = 0; u < kColumnLoads; ++u) dw += math::rmsnorm_dweight_term(dv[u], xv[u], rstd[r + u]);
  }
  for (; r < rows; ++r) {
    dw += math::rmsnorm_dweight_term(to_f32(dout[r * cols + c]), to_f32(x[r * cols + c]), rstd[r]);
  }
  dweight[c] = from_f32<T>(dw);
}

// bf16/fp16: the parameter gradients over 32 warps of strided rows (sum_warp_partials,
// cuda_common.cuh), added onto the gradients last.
template <typename T>
__global__ void __launch_bounds__(kSplitWarps * 32)
    layernorm_backward_params_split_kernel(const T* __restrict__ dout, const T* __restrict__ x,
                                           const float* __restrict__ mean, const float* __restrict__ rstd,
                                           T* __restrict__ dweight, T* __restrict__ dbias, std::int64_t rows,
                                           std::int64_t cols) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * 32 + static_cast<int>(threadIdx.x) % 32;
  float acc[2] = {0.0f, 0.0f};  // dweight, dbias
  if (c < cols) {
#pragma unroll 4
    for (std::int64_t r = warp; r < rows; r += kSplitWarps) {
      const float d = to_f32(dout[r * cols + c]);
      acc[0] += d * math::layernorm_xhat(to_f32(x[r * cols + c]), mean[r], rstd[r]);
      acc[1] += d;
    }
  }
  if (!sum_warp_partials(acc) || c >= cols) return;
  dweight[c] = from_f32<T>(to_f32(dweight[c]) + acc[0]);
  dbias[c] = from_f32<T>(to_f32(dbias[c]) + acc[1]);
}

template <typename T>
__global__ void __launch_bounds__(kSplitWarps * 32)
    rmsnorm_backward_weight_split_kernel(const T* __restrict__ dout, const T* __restrict__ x,
                                         const float* __restrict__ rstd, T* __restrict__ dweight, std::int64_t rows,
                                         std::int64_t cols) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * 32 + static_cast<int>(threadIdx.x) % 32;
  float acc[1] = {0.0f};
  if (c < cols) {
#pragma unroll 4
    for (std::int64_t r = warp; r < rows; r += kSplitWarps) {
      acc[0] += math::rmsnorm_dweight_term(to_f32(dout[r * cols + c]), to_f32(x[r * cols + c]), rstd[r]);
    }
  }
  if (!sum_warp_partials(acc) || c >= cols) return;
  dweight[c] = from_f32<T>(to_f32(dweight[c]) + acc[0]);
}

unsigned column_blocks(std::int64_t cols) {
  return static_cast<unsigned>((cols + kColumnThreads - 1) / kColumnThreads);
}

void check_rows(std::int64_t rows) {
  STRATA_CHECK(rows <= 0x7fffffff, "norm op: more rows than one CUDA grid dimension holds (2^31 - 1)");
}

}  // namespace

void layernorm_forward(const Launch& L, DType dtype, const void* x, const void* weight, const void* bias, void* out,
                       float* mean, float* rstd, std::int64_t rows, std::int64_t cols, float eps) {
  if (rows <= 0 || cols <= 0) return;
  check_rows(rows);
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    layernorm_forward_kernel<T><<<static_cast<unsigned>(rows), kBlockThreads, 0, scope.stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias), static_cast<T*>(out),
        mean, rstd, cols, eps);
  });
  check_launch();
}

void layernorm_backward(const Launch& L, DType dtype, const void* dout, const void* x, const void* weight,
                        const float* mean, const float* rstd, void* dx, void* dweight, void* dbias,
                        std::int64_t rows, std::int64_t cols, Accumulate accumulate_dx) {
  if (rows <= 0 || cols <= 0) return;
  check_rows(rows);
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    layernorm_backward_dx_kernel<T><<<static_cast<unsigned>(rows), kBlockThreads, 0, scope.stream>>>(
        static_cast<const T*>(dout), static_cast<const T*>(x), static_cast<const T*>(weight), mean, rstd,
        static_cast<T*>(dx), cols, accumulate_dx == Accumulate::Yes);
    check_launch();
    if constexpr (std::is_same_v<T, float>) {
      layernorm_backward_params_kernel<T><<<column_blocks(cols), kColumnThreads, 0, scope.stream>>>(
          static_cast<const T*>(dout), static_cast<const T*>(x), mean, rstd, static_cast<T*>(dweight),
          static_cast<T*>(dbias), rows, cols);
    } else {
      layernorm_backward_params_split_kernel<T><<<split_blocks(cols), kSplitWarps * 32, 0, scope.stream>>>(
          static_cast<const T*>(dout), static_cast<const T*>(x), mean, rstd, static_cast<T*>(dweight),
          static_cast<T*>(dbias), rows, cols);
    }
    check_launch();
  });
}

void rmsnorm_forward(const Launch& L, DType dtype, const void* x, const void* weight, void* out, float* rstd,
                     std::int64_t rows, std::int64_t cols, float eps) {
  if (rows <= 0 || cols <= 0) return;
  check_rows(rows);
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_forward_kernel<T><<<static_cast<unsigned>(rows), kBlockThreads, 0, scope.stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<T*>(out), rstd, cols, eps);
  });
  check_launch();
}

void rmsnorm_backward(const Launch& L, DType dtype, const void* dout, const void* x, const void* weight,
                      const float* rstd, void* dx, void* dweight, std::int64_t rows, std::int64_t cols,
                      Accumulate accumulate_dx) {
  if (rows <= 0 || cols <= 0) return;
  check_rows(rows);
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_backward_dx_kernel<T><<<static_cast<unsigned>(rows), kBlockThreads, 0, scope.stream>>>(
        static_cast<const T*>(dout), static_cast<const T*>(x), static_cast<const T*>(weight), rstd,
        static_cast<T*>(dx), cols, accumulate_dx == Accumulate::Yes);
    check_launch();
    if constexpr (std::is_same_v<T, float>) {
      rmsnorm_backward_weight_kernel<T><<<column_blocks(cols), kColumnThreads, 0, scope.stream>>>(
          static_cast<const T*>(dout), static_cast<const T*>(x), rstd, static_cast<T*>(dweight), rows, cols);
    } else {
      rmsnorm_backward_weight_split_kernel<T><<<split_blocks(cols), kSplitWarps * 32, 0, scope.stream>>>(
          static_cast<const T*>(dout), static_cast<const T*>(x), rstd, static_cast<T*>(dweight), rows, cols);
    }
    check_launch();
  });
}

}  // namespace strata::models::cuda
