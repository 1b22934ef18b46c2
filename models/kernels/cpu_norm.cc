// CPU kernels of layer norm and RMS norm, forward and backward. Rows are independent tasks; the
// weight/bias gradients are reductions across rows and run in column blocks in row order (see
// cpu_common.h), so they are deterministic and accumulate across calls like one call.
#include <cmath>
#include <vector>

#include "models/kernels/cpu_common.h"
#include "models/kernels/cpu_kernels.h"
#include "models/kernels/op_math.h"

namespace strata::models::cpu {

void layernorm_forward(DType dtype, const void* x, const void* weight, const void* bias, void* out, float* mean,
                       float* rstd, std::int64_t rows, std::int64_t cols, float eps) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(rows, 1, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t base = r * cols;
        float sum = 0.0f;
        for (std::int64_t c = 0; c < cols; ++c) sum += load<T>(x, base + c);
        const float m = sum / static_cast<float>(cols);
        float var = 0.0f;
        for (std::int64_t c = 0; c < cols; ++c) {
          const float d = load<T>(x, base + c) - m;
          var += d * d;
        }
        const float s = math::norm_rstd(var, static_cast<float>(cols), eps);
        for (std::int64_t c = 0; c < cols; ++c) {
          store<T>(out, base + c, math::layernorm_apply(load<T>(x, base + c), m, s, load<T>(weight, c), load<T>(bias, c)));
        }
        mean[r] = m;
        rstd[r] = s;
      }
    });
  });
}

void layernorm_backward(DType dtype, const void* dout, const void* x, const void* weight, const float* mean,
                        const float* rstd, void* dx, void* dweight, void* dbias, std::int64_t rows, std::int64_t cols,
                        Accumulate accumulate_dx) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(rows, 1, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t base = r * cols;
        float dnorm_mean = 0.0f, dnorm_xhat_mean = 0.0f;
        for (std::int64_t c = 0; c < cols; ++c) {
          const float xhat = math::layernorm_xhat(load<T>(x, base + c), mean[r], rstd[r]);
          const float dnorm = load<T>(dout, base + c) * load<T>(weight, c);
          dnorm_mean += dnorm;
          dnorm_xhat_mean += dnorm * xhat;
        }
        dnorm_mean /= static_cast<float>(cols);
        dnorm_xhat_mean /= static_cast<float>(cols);
        for (std::int64_t c = 0; c < cols; ++c) {
          const float xhat = math::layernorm_xhat(load<T>(x, base + c), mean[r], rstd[r]);
          const float dnorm = load<T>(dout, base + c) * load<T>(weight, c);
          float g = math::layernorm_dx(dnorm, xhat, dnorm_mean, dnorm_xhat_mean, rstd[r]);
          if (accumulate_dx == Accumulate::Yes) g += load<T>(dx, base + c);
          store<T>(dx, base + c, g);
        }
      }
    });
    parallel_column_blocks(cols, [&](std::int64_t c0, std::int64_t c1) {
      float dw[kColumnBlock], db[kColumnBlock];
      for (std::int64_t c = c0; c < c1; ++c) {
        dw[c - c0] = load<T>(dweight, c);
        db[c - c0] = load<T>(dbias, c);
      }
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) {
          const float xhat = math::layernorm_xhat(load<T>(x, r * cols + c), mean[r], rstd[r]);
          const float d = load<T>(dout, r * cols + c);
          dw[c - c0] += d * xhat;
          db[c - c0] += d;
        }
      }
      for (std::int64_t c = c0; c < c1; ++c) {
        store<T>(dweight, c, dw[c - c0]);
        store<T>(dbias, c, db[c - c0]);
      }
    });
  });
}

void rmsnorm_forward(DType dtype, const void* x, const void* weight, void* out, float* rstd, std::int64_t rows,
                     std::int64_t cols, float eps) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(rows, 1, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t base = r * cols;
        float ss = 0.0f;
        for (std::int64_t c = 0; c < cols; ++c) {
          const float v = load<T>(x, base + c);
          ss += v * v;
        }
        const float s = math::norm_rstd(ss, static_cast<float>(cols), eps);
        for (std::int64_t c = 0; c < cols; ++c) {
          store<T>(out, base + c, math::rmsnorm_apply(load<T>(x, base + c), s, load<T>(weight, c)));
        }
        rstd[r] = s;
      }
    });
  });
}

void rmsnorm_backward(DType dtype, const void* dout, const void* x, const void* weight, const float* rstd, void* dx,
                      void* dweight, std::int64_t rows, std::int64_t cols, Accumulate accumulate_dx) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(rows, 1, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t base = r * cols;
        // y = x * s * w, s = (mean(x^2) + eps)^-1/2:  dx = s * (g - xhat * mean(g * xhat)), g = dout * w.
        float dot = 0.0f;
        for (std::int64_t c = 0; c < cols; ++c) {
          dot += math::rmsnorm_dot_term(load<T>(dout, base + c), load<T>(weight, c), load<T>(x, base + c), rstd[r]);
        }
        dot /= static_cast<float>(cols);
        for (std::int64_t c = 0; c < cols; ++c) {
          const float xhat = math::rmsnorm_xhat(load<T>(x, base + c), rstd[r]);
          float g = math::rmsnorm_dx(load<T>(dout, base + c), load<T>(weight, c), xhat, dot, rstd[r]);
          if (accumulate_dx == Accumulate::Yes) g += load<T>(dx, base + c);
          store<T>(dx, base + c, g);
        }
      }
    });
    parallel_column_blocks(cols, [&](std::int64_t c0, std::int64_t c1) {
      float dw[kColumnBlock];
      for (std::int64_t c = c0; c < c1; ++c) dw[c - c0] = load<T>(dweight, c);
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) {
          dw[c - c0] += math::rmsnorm_dweight_term(load<T>(dout, r * cols + c), load<T>(x, r * cols + c), rstd[r]);
        }
      }
      for (std::int64_t c = c0; c < c1; ++c) store<T>(dweight, c, dw[c - c0]);
    });
  });
}

}  // namespace strata::models::cpu
