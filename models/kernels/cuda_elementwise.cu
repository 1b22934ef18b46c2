// CUDA kernels of the element ops: GELU (tanh) and SwiGLU forward/backward, residual add, dtype
// casts and rotary embeddings. One thread per output element (grid-stride), fp32 arithmetic.
//
// Shared per-element math (the functions models/kernels/cpu_elementwise.cc calls too):
// math::gelu_tanh, math::gelu_tanh_grad, math::swiglu, math::swiglu_dgate, math::swiglu_dup,
// math::rope_cos_sin, math::rope_rotate (op_math.h), math::rope_angle (rope_spec.h); to_f32 / from_f32 for every
// load and store (core/dtype.h). Casts go through core/dtype_convert.h's convert_async, which is
// built on the same to_f32 / from_f32 (a same-dtype cast is a device copy).
#include "models/kernels/cuda_common.cuh"

#include "core/dtype_convert.h"
#include "models/kernels/op_math.h"

namespace strata::models::cuda {
namespace {

template <typename T>
__global__ void gelu_forward_kernel(const T* __restrict__ x, T* __restrict__ out, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = from_f32<T>(math::gelu_tanh(to_f32(x[i])));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(const T* __restrict__ x, const T* __restrict__ dout, T* __restrict__ dx,
                                     std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dx[i] = from_f32<T>(to_f32(dout[i]) * math::gelu_tanh_grad(to_f32(x[i])));
  }
}

// One thread per (row, j < hidden); gate at row*2*hidden + j, up at + hidden.
template <typename T>
__global__ void swiglu_forward_kernel(const T* __restrict__ gate_up, T* __restrict__ out, std::int64_t rows,
                                      std::int64_t hidden) {
  const std::int64_t n = rows * hidden;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t r = i / hidden, j = i % hidden;
    const std::int64_t in = r * 2 * hidden;
    out[i] = from_f32<T>(math::swiglu(to_f32(gate_up[in + j]), to_f32(gate_up[in + hidden + j])));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* __restrict__ gate_up, const T* __restrict__ dout,
                                       T* __restrict__ dgate_up, std::int64_t rows, std::int64_t hidden) {
  const std::int64_t n = rows * hidden;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t r = i / hidden, j = i % hidden;
    const std::int64_t in = r * 2 * hidden;
    const float g = to_f32(gate_up[in + j]);
    const float u = to_f32(gate_up[in + hidden + j]);
    const float d = to_f32(dout[i]);
    dgate_up[in + j] = from_f32<T>(math::swiglu_dgate(g, u, d));
    dgate_up[in + hidden + j] = from_f32<T>(math::swiglu_dup(g, d));
  }
}

// `out` may alias `a` or `b`: each element is read and written by one thread, so no __restrict__.
template <typename T>
__global__ void residual_add_kernel(const T* a, const T* b, T* out, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
  }
}

// In place; one thread per (row, head, pair i < head_dim/2). The angle and its cosine and sine
// are recomputed per element with the CPU kernel's functions (the CPU tabulates them per call).
template <typename T>
__global__ void rope_kernel(T* x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                            std::int64_t row_stride, RopeSpec spec, float sign, std::int64_t first_position) {
  const std::int64_t half = head_dim / 2;
  const std::int64_t n = rows * heads * half;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const std::int64_t i = e % half;
    const std::int64_t h = (e / half) % heads;
    const std::int64_t r = e / (half * heads);
    const std::int64_t t = first_position + r % seq;
    const float angle = math::rope_angle(t, static_cast<int>(i), static_cast<int>(head_dim), spec);
    float cos_a = 0.0f, sin_a = 0.0f;
    math::rope_cos_sin(angle, &cos_a, &sin_a);
    const std::int64_t base = r * row_stride + h * head_dim;
    float o1 = 0.0f, o2 = 0.0f;
    math::rope_rotate(to_f32(x[base + i]), to_f32(x[base + i + half]), cos_a, sign * sin_a, &o1, &o2);
    x[base + i] = from_f32<T>(o1);
    x[base + i + half] = from_f32<T>(o2);
  }
}

}  // namespace

void gelu_forward(const Launch& L, DType dtype, const void* x, void* out, std::int64_t n) {
  if (n <= 0) return;
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    gelu_forward_kernel<T><<<element_blocks(n), kBlockThreads, 0, scope.stream>>>(static_cast<const T*>(x),
                                                                                  static_cast<T*>(out), n);
  });
  check_launch();
}

void gelu_backward(const Launch& L, DType dtype, const void* x, const void* dout, void* dx, std::int64_t n) {
  if (n <= 0) return;
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    gelu_backward_kernel<T><<<element_blocks(n), kBlockThreads, 0, scope.stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dout), static_cast<T*>(dx), n);
  });
  check_launch();
}

void swiglu_forward(const Launch& L, DType dtype, const void* gate_up, void* out, std::int64_t rows,
                    std::int64_t hidden) {
  if (rows <= 0 || hidden <= 0) return;
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    swiglu_forward_kernel<T><<<element_blocks(rows * hidden), kBlockThreads, 0, scope.stream>>>(
        static_cast<const T*>(gate_up), static_cast<T*>(out), rows, hidden);
  });
  check_launch();
}

void swiglu_backward(const Launch& L, DType dtype, const void* gate_up, const void* dout, void* dgate_up,
                     std::int64_t rows, std::int64_t hidden) {
  if (rows <= 0 || hidden <= 0) return;
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    swiglu_backward_kernel<T><<<element_blocks(rows * hidden), kBlockThreads, 0, scope.stream>>>(
        static_cast<const T*>(gate_up), static_cast<const T*>(dout), static_cast<T*>(dgate_up), rows, hidden);
  });
  check_launch();
}

void residual_add(const Launch& L, DType dtype, const void* a, const void* b, void* out, std::int64_t n) {
  if (n <= 0) return;
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    residual_add_kernel<T><<<element_blocks(n), kBlockThreads, 0, scope.stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n);
  });
  check_launch();
}

void cast(const Launch& L, DType src_dtype, const void* src, DType dst_dtype, void* dst, std::int64_t n) {
  if (n <= 0) return;
  const StreamScope scope(L);
  ::strata::cuda::convert_async(src, src_dtype, dst, dst_dtype, static_cast<std::size_t>(n), scope.stream);
}

void rope(const Launch& L, DType dtype, void* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
          std::int64_t head_dim, std::int64_t row_stride, const RopeSpec& spec, RopeDirection direction,
          std::int64_t first_position) {
  STRATA_CHECK(head_dim % 2 == 0, "rope needs an even head_dim");
  const std::int64_t n = batch * seq * heads * (head_dim / 2);
  if (n <= 0) return;
  const float sign = direction == RopeDirection::Forward ? 1.0f : -1.0f;
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<element_blocks(n), kBlockThreads, 0, scope.stream>>>(static_cast<T*>(x), batch * seq, seq,
                                                                          heads, head_dim, row_stride, spec, sign,
                                                                          first_position);
  });
  check_launch();
}

}  // namespace strata::models::cuda
