// The linear-layer ops on CUDA: matmul through cuBLAS (cublasGemmStridedBatchedEx / cublasGemmEx,
// CUBLAS_COMPUTE_32F, fp32/bf16/fp16 operands) and the bias gradient (a fixed-order column sum:
// serial in row order for fp32, split over 32 warps for bf16/fp16).
//
// Row-major to cuBLAS: a row-major C[m,n] is the column-major C^T[n,m], and C^T = op(B)^T op(A)^T,
// so cuBLAS gets (B, A) in that order with m and n swapped and each operand's own transpose flag.
//
// Semantics are those of the CPU kernel (cpu_matmul.cc), step for step:
//  * bias: C = (beta == 0 ? 0 : beta * C) + bias first (bias_prep_kernel), then the product
//    accumulates with beta = 1. For fp32 that is the CPU's arithmetic exactly; for bf16/fp16 with
//    beta != 0 the prepared C is rounded to the element type once more than on the CPU (which keeps
//    it in fp32 scratch). The decoder's linear layers use beta 0 with a bias, where bias is exact.
//  * stride_c 0 with batch > 1: one gemm per item with beta 1, in item order, bias on the first
//    item only; a strided-batched gemm would let items race on the one C.
//  * k == 0: C = 0 when beta is 0, C untouched otherwise (plus the bias), as on the CPU.
// cuBLAS gemms are bit-reproducible run to run on one GPU model given a private workspace per
// stream (CublasHandles provides it) and no reduced-precision split-K reductions (disallowed in
// cublas_handles_cuda.cc).
//
// Shared per-element math: to_f32 / from_f32 (core/dtype.h) in the bias and bias-gradient kernels.
#include <cublas_v2.h>

#include <climits>
#include <type_traits>

#include "models/kernels/cuda_common.cuh"

namespace strata::models::cuda {
namespace {

constexpr int kColumnThreads = 64;  // fewer columns per block: more blocks over the SMs
constexpr int kColumnLoads = 16;    // rows loaded ahead of the in-order sum

// C[item, r, c] = (beta == 0 ? 0 : beta * C) + (bias ? bias[c] : 0) over `items` Cs at stride_c.
template <typename T>
__global__ void bias_prep_kernel(T* c, std::int64_t ldc, std::int64_t stride_c, std::int64_t items, std::int64_t m,
                                 std::int64_t n, const T* __restrict__ bias, float beta) {
  const std::int64_t total = items * m * n;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t col = e % n, row = (e / n) % m, item = e / (m * n);
    T* p = c + item * stride_c + row * ldc + col;
    const float scaled = beta == 0.0f ? 0.0f : beta * to_f32(*p);
    *p = from_f32<T>(bias != nullptr ? scaled + to_f32(bias[col]) : scaled);
  }
}

// One thread per column: dbias[c] += sum_r dout[r, c] in row order (the CPU kernel's order: calls
// over consecutive rows add up to one call over all of them, bit for bit). The sum is serial, so its
// speed is the loads in flight: they are issued kColumnLoads rows at a time, then added in order.
template <typename T>
__global__ void bias_grad_kernel(const T* __restrict__ dout, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                                 T* __restrict__ dbias) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = to_f32(dbias[c]);
  std::int64_t r = 0;
  for (; r + kColumnLoads <= rows; r += kColumnLoads) {
    float v[kColumnLoads];
#pragma unroll
    for (int u = 0; u < kColumnLoads; ++u) v[u] = to_f32(dout[(r + u) * ld + c]);
#pragma unroll
    for (int u = 0; u < kColumnLoads; ++u) acc += v[u];
  }
  for (; r < rows; ++r) acc += to_f32(dout[r * ld + c]);
  dbias[c] = from_f32<T>(acc);
}

// bf16/fp16: dbias over 32 warps of strided rows (sum_warp_partials, cuda_common.cuh), added onto
// dbias last: calls over consecutive rows no longer add up to one call's bits, a promise only exact
// mode needs. rows / kSplitWarps sequential loads per thread instead of rows.
template <typename T>
__global__ void __launch_bounds__(kSplitWarps * 32)
    bias_grad_split_kernel(const T* __restrict__ dout, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                           T* __restrict__ dbias) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * 32 + static_cast<int>(threadIdx.x) % 32;
  float acc[1] = {0.0f};
  if (c < cols) {
#pragma unroll 8
    for (std::int64_t r = warp; r < rows; r += kSplitWarps) acc[0] += to_f32(dout[r * ld + c]);
  }
  if (!sum_warp_partials(acc) || c >= cols) return;
  dbias[c] = from_f32<T>(to_f32(dbias[c]) + acc[0]);
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
  }
  STRATA_CHECK(false, "unknown dtype for cuBLAS");
  return CUDA_R_32F;
}

cublasOperation_t cublas_op(Trans t) { return t == Trans::Yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

bool fits_int(std::int64_t v) { return v >= 0 && v <= INT_MAX; }

// Enqueues C = (bias ? ... : beta * C) for the `items` Cs (see bias_prep_kernel).
void prepare_c(const MatmulArgs& a, std::int64_t items, float beta, cudaStream_t stream) {
  dispatch_dtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    bias_prep_kernel<T><<<element_blocks(items * a.m * a.n), kBlockThreads, 0, stream>>>(
        static_cast<T*>(a.c), a.ldc, a.stride_c, items, a.m, a.n, static_cast<const T*>(a.bias), beta);
  });
  check_launch();
}

// `items` gemms from item `first` on, C at stride_c (0 only with items == 1).
void gemm(cublasHandle_t handle, const MatmulArgs& a, std::int64_t first, std::int64_t items, float beta) {
  const cudaDataType_t type = cuda_type(a.dtype);
  const std::size_t esize = dtype_bytes(a.dtype);
  const auto* A = static_cast<const char*>(a.a) + static_cast<std::size_t>(first * a.stride_a) * esize;
  const auto* B = static_cast<const char*>(a.b) + static_cast<std::size_t>(first * a.stride_b) * esize;
  auto* C = static_cast<char*>(a.c) + static_cast<std::size_t>(first * a.stride_c) * esize;
  const float alpha = a.alpha;
  STRATA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, cublas_op(a.trans_b), cublas_op(a.trans_a), static_cast<int>(a.n), static_cast<int>(a.m),
      static_cast<int>(a.k), &alpha, B, type, static_cast<int>(a.ldb), a.stride_b, A, type, static_cast<int>(a.lda),
      a.stride_a, &beta, C, type, static_cast<int>(a.ldc), a.stride_c, static_cast<int>(items), CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void matmul(const Launch& L, const MatmulArgs& a) {
  STRATA_CHECK(a.m >= 0 && a.n >= 0 && a.k >= 0 && a.batch >= 1, "bad matmul shape");
  STRATA_CHECK(a.batch == 1 || a.stride_c != 0 || a.beta == 1.0f,
               "batched matmul into one C (stride_c 0) must accumulate (beta 1)");
  STRATA_CHECK(L.cublas != nullptr, "matmul on CUDA without CublasHandles (ops.cc checks this)");
  if (a.m == 0 || a.n == 0) return;
  STRATA_CHECK(fits_int(a.m) && fits_int(a.n) && fits_int(a.k) && fits_int(a.lda) && fits_int(a.ldb) &&
                   fits_int(a.ldc) && fits_int(a.batch),
               "matmul dimensions, leading dimensions and batch must fit cuBLAS's int");
  const StreamScope scope(L);
  auto* handle = static_cast<cublasHandle_t>(L.cublas->handle());
  const bool one_c = a.stride_c == 0 && a.batch > 1;
  const bool has_bias = a.bias != nullptr;
  // Items that get the bias (or the k == 0 treatment): every C, or the one shared C once.
  const std::int64_t distinct_c = one_c ? 1 : a.batch;

  if (a.k == 0) {
    if (has_bias || a.beta == 0.0f) prepare_c(a, distinct_c, a.beta, scope.stream);
    return;
  }
  float beta = a.beta;
  if (has_bias) {
    prepare_c(a, distinct_c, a.beta, scope.stream);
    beta = 1.0f;
  }
  if (!one_c) {
    gemm(handle, a, 0, a.batch, beta);
    return;
  }
  for (std::int64_t item = 0; item < a.batch; ++item) gemm(handle, a, item, 1, beta);
}

void bias_grad(const Launch& L, DType dtype, const void* dout, std::int64_t rows, std::int64_t cols, std::int64_t ld,
               void* dbias) {
  if (rows <= 0 || cols <= 0) return;
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>) {
      bias_grad_kernel<T><<<static_cast<unsigned>((cols + kColumnThreads - 1) / kColumnThreads), kColumnThreads, 0,
                            scope.stream>>>(static_cast<const T*>(dout), rows, cols, ld, static_cast<T*>(dbias));
    } else {
      bias_grad_split_kernel<T><<<split_blocks(cols), kSplitWarps * 32, 0, scope.stream>>>(
          static_cast<const T*>(dout), rows, cols, ld, static_cast<T*>(dbias));
    }
  });
  check_launch();
}

}  // namespace strata::models::cuda
