// CPU matmul (OpenBLAS cblas_sgemm) and fused softmax + cross-entropy.
//
// fp32 goes straight to sgemm. bf16/fp16 operands are widened into fp32 scratch, multiplied with
// sgemm and rounded back (fp32 accumulation, as the op set promises). Batched calls loop over the
// items in order, one multithreaded sgemm each: OpenBLAS splits a gemm over rows/columns of C, never
// over k, so each call's result is the same for any OpenBLAS thread count.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/kernels/cpu_common.h"
#include "models/kernels/cpu_kernels.h"
#include "models/kernels/op_math.h"

namespace strata::models::cpu {

namespace {

// Copies a rows x cols block (leading dimension ld) of T into dense fp32 (leading dimension cols).
template <typename T>
void widen(const void* src, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::vector<float>& dst) {
  dst.resize(static_cast<std::size_t>(rows * cols));
  parallel_rows(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) dst[static_cast<std::size_t>(r * cols + c)] = load<T>(src, r * ld + c);
    }
  });
}

void sgemm_rows(const MatmulArgs& a, const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float* C,
                std::int64_t ldc, const float* bias_f32, float beta) {
  if (bias_f32 != nullptr) {
    // C = bias (beta 0) or C += bias, then the product accumulates on top.
    for (std::int64_t r = 0; r < a.m; ++r) {
      for (std::int64_t c = 0; c < a.n; ++c) {
        C[r * ldc + c] = (beta == 0.0f ? 0.0f : beta * C[r * ldc + c]) + bias_f32[c];
      }
    }
    beta = 1.0f;
  }
  if (a.k == 0) {
    if (beta == 0.0f) {
      for (std::int64_t r = 0; r < a.m; ++r) std::fill(C + r * ldc, C + r * ldc + a.n, 0.0f);
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, a.trans_a == Trans::Yes ? CblasTrans : CblasNoTrans,
              a.trans_b == Trans::Yes ? CblasTrans : CblasNoTrans, static_cast<blasint>(a.m),
              static_cast<blasint>(a.n), static_cast<blasint>(a.k), a.alpha, A, static_cast<blasint>(lda), B,
              static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}

}  // namespace

void matmul(const MatmulArgs& a) {
  STRATA_CHECK(a.m >= 0 && a.n >= 0 && a.k >= 0 && a.batch >= 1, "bad matmul shape m={} n={} k={} batch={}", a.m, a.n,
               a.k, a.batch);
  STRATA_CHECK(a.batch == 1 || a.stride_c != 0 || a.beta == 1.0f,
               "batched matmul into one C (stride_c 0) must accumulate (beta 1)");
  if (a.m == 0 || a.n == 0) return;
  // Operand extents as stored: op(A) is m x k, so A is stored m x k (No) or k x m (Yes).
  const std::int64_t a_rows = a.trans_a == Trans::No ? a.m : a.k;
  const std::int64_t a_cols = a.trans_a == Trans::No ? a.k : a.m;
  const std::int64_t b_rows = a.trans_b == Trans::No ? a.k : a.n;
  const std::int64_t b_cols = a.trans_b == Trans::No ? a.n : a.k;
  dispatch_dtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const std::size_t esize = sizeof(T);
    std::vector<float> bias_f32;
    if (a.bias != nullptr) {
      bias_f32.resize(static_cast<std::size_t>(a.n));
      for (std::int64_t c = 0; c < a.n; ++c) bias_f32[static_cast<std::size_t>(c)] = load<T>(a.bias, c);
    }
    const float* bias = a.bias != nullptr ? bias_f32.data() : nullptr;
    std::vector<float> wa, wb, wc;
    for (std::int64_t item = 0; item < a.batch; ++item) {
      const auto* A = static_cast<const char*>(a.a) + static_cast<std::size_t>(item * a.stride_a) * esize;
      const auto* B = static_cast<const char*>(a.b) + static_cast<std::size_t>(item * a.stride_b) * esize;
      auto* C = static_cast<char*>(a.c) + static_cast<std::size_t>(item * a.stride_c) * esize;
      // Bias is added once per distinct C: with stride_c 0 only on the first item.
      const float* item_bias = (a.stride_c == 0 && item > 0) ? nullptr : bias;
      if constexpr (std::is_same_v<T, float>) {
        sgemm_rows(a, reinterpret_cast<const float*>(A), a.lda, reinterpret_cast<const float*>(B), a.ldb,
                   reinterpret_cast<float*>(C), a.ldc, item_bias, a.beta);
      } else {
        widen<T>(A, a_rows, a_cols, a.lda, wa);
        widen<T>(B, b_rows, b_cols, a.ldb, wb);
        if (a.beta != 0.0f) {
          widen<T>(C, a.m, a.n, a.ldc, wc);
        } else {
          wc.assign(static_cast<std::size_t>(a.m * a.n), 0.0f);
        }
        sgemm_rows(a, wa.data(), a_cols, wb.data(), b_cols, wc.data(), a.n, item_bias, a.beta);
        parallel_rows(a.m, 16, [&](std::int64_t r0, std::int64_t r1) {
          for (std::int64_t r = r0; r < r1; ++r) {
            for (std::int64_t c = 0; c < a.n; ++c) store<T>(C, r * a.ldc + c, wc[static_cast<std::size_t>(r * a.n + c)]);
          }
        });
      }
    }
  });
}

void cross_entropy(DType dtype, const void* logits, const std::int32_t* targets, float* losses, void* dlogits,
                   std::int64_t rows, std::int64_t vocab, std::int64_t ld, float grad_scale) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(rows, 1, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t base = r * ld;
        const std::int32_t target = targets[r];
        STRATA_CHECK(target < vocab, "target {} out of range (vocab {}) at row {}", target, vocab, r);
        float row_max = -INFINITY;
        for (std::int64_t j = 0; j < vocab; ++j) row_max = std::max(row_max, load<T>(logits, base + j));
        // Note [Long sums in double]: the row's sum of exponentials runs over the whole vocabulary
        // (50257 terms for GPT-2); added one by one in fp32 its rounding grew to a relative error of
        // 3.6e-6 in the loss of a GPT-2 124M with spread-out logits, 14x PyTorch's fp32 (whose
        // vectorized sums round less). Accumulated in double it is 6e-9 (tools/numerics/
        // gpt2_reference.py; docs/MEASUREMENTS.md). The terms stay fp32 (math::shifted_exp, shared
        // with CUDA), so only the accumulation changes; its cost is nothing beside the matmul.
        double sum_exp = 0.0;
        for (std::int64_t j = 0; j < vocab; ++j) sum_exp += math::shifted_exp(load<T>(logits, base + j), row_max);
        const float sum = static_cast<float>(sum_exp);
        const bool ignored = target < 0;
        losses[r] = ignored ? 0.0f : math::cross_entropy_loss(row_max, sum, load<T>(logits, base + target));
        if (dlogits == nullptr) continue;
        const float inv_sum = 1.0f / sum;
        const float scale = ignored ? 0.0f : grad_scale;
        for (std::int64_t j = 0; j < vocab; ++j) {
          store<T>(dlogits, base + j,
                   math::cross_entropy_dlogit(load<T>(logits, base + j), row_max, inv_sum, j == target, scale));
        }
      }
    });
  });
}

}  // namespace strata::models::cpu
