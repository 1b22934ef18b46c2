// CPU kernels of the vocabulary-parallel cross-entropy (models/kernels/ops.h; Note
// [Vocabulary-parallel cross-entropy] in models/tensor_parallel.h). The vocabulary-parallel
// embedding is in cpu_elementwise.cc, beside the whole one it generalizes.
#include <algorithm>
#include <cmath>
#include <vector>

#include "models/kernels/cpu_common.h"
#include "models/kernels/cpu_kernels.h"
#include "models/kernels/op_math.h"

namespace strata::models::cpu {

namespace {

// First vocabulary row of global slice s of `slices` (Note [Tensor slices] in models/tensor_parallel.h).
std::int64_t slice_begin(std::int64_t vocab, std::int64_t slices, std::int64_t s) { return s * vocab / slices; }

bool in_range(std::int64_t tok, std::int64_t begin, std::int64_t end) { return tok >= begin && tok < end; }

}  // namespace

void cross_entropy_row_max(DType dtype, const void* logits_slice, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                           float* row_max) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(rows, 1, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        float m = -INFINITY;
        for (std::int64_t j = 0; j < cols; ++j) m = std::max(m, load<T>(logits_slice, r * ld + j));
        row_max[r] = m;
      }
    });
  });
}

void cross_entropy_slice_sums(DType dtype, const void* logits_slice, const std::int32_t* targets, std::int64_t rows,
                              std::int64_t ld, std::int64_t vocab, std::int64_t slices, std::int64_t first_slice,
                              std::int64_t local_slices, const float* row_max, double* sums, float* target_logit) {
  const std::int64_t vocab_begin = slice_begin(vocab, slices, first_slice);
  const std::int64_t vocab_end = slice_begin(vocab, slices, first_slice + local_slices);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(rows, 1, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t base = r * ld;
        for (std::int64_t l = 0; l < local_slices; ++l) {
          const std::int64_t b = slice_begin(vocab, slices, first_slice + l) - vocab_begin;
          const std::int64_t e = slice_begin(vocab, slices, first_slice + l + 1) - vocab_begin;
          double s = 0.0;  // Note [Long sums in double] (models/kernels/cpu_matmul.cc)
          for (std::int64_t j = b; j < e; ++j) s += math::shifted_exp(load<T>(logits_slice, base + j), row_max[r]);
          sums[r * local_slices + l] = s;
        }
        const std::int64_t target = targets[r];
        STRATA_CHECK(target < vocab, "target {} out of range (vocab {}) at row {}", target, vocab, r);
        target_logit[r] =
            in_range(target, vocab_begin, vocab_end) ? load<T>(logits_slice, base + target - vocab_begin) : 0.0f;
      }
    });
  });
}

void cross_entropy_finish(DType dtype, const void* logits_slice, const std::int32_t* targets, float* losses,
                          void* dlogits_slice, std::int64_t rows, std::int64_t ld, std::int64_t vocab,
                          std::int64_t slices, std::int64_t first_slice, std::int64_t local_slices,
                          const float* row_max, const double* all_sums, const float* target_logit, float grad_scale) {
  STRATA_CHECK(local_slices >= 1 && slices % local_slices == 0, "{} local slices of {}", local_slices, slices);
  const std::int64_t ranks = slices / local_slices;
  const std::int64_t vocab_begin = slice_begin(vocab, slices, first_slice);
  const std::int64_t cols = slice_begin(vocab, slices, first_slice + local_slices) - vocab_begin;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(rows, 1, [&](std::int64_t r0, std::int64_t r1) {
      std::vector<double> t(static_cast<std::size_t>(slices));
      for (std::int64_t r = r0; r < r1; ++r) {
        // Slice s = rank * local_slices + l, in global order; then the pairwise tree of
        // tree_reduce_host (comm/communicator.h), so any split into ranks adds alike.
        for (std::int64_t k = 0; k < ranks; ++k) {
          for (std::int64_t l = 0; l < local_slices; ++l) {
            t[static_cast<std::size_t>(k * local_slices + l)] = all_sums[(k * rows + r) * local_slices + l];
          }
        }
        for (std::int64_t stride = 1; stride < slices; stride *= 2) {
          for (std::int64_t i = 0; i + stride < slices; i += 2 * stride) {
            t[static_cast<std::size_t>(i)] += t[static_cast<std::size_t>(i + stride)];
          }
        }
        const float sum = static_cast<float>(t[0]);
        const std::int64_t target = targets[r];
        const bool ignored = target < 0;
        losses[r] = ignored ? 0.0f : math::cross_entropy_loss(row_max[r], sum, target_logit[r]);
        if (dlogits_slice == nullptr) continue;
        const float inv_sum = 1.0f / sum;
        const float scale = ignored ? 0.0f : grad_scale;
        for (std::int64_t j = 0; j < cols; ++j) {
          store<T>(dlogits_slice, r * ld + j,
                   math::cross_entropy_dlogit(load<T>(logits_slice, r * ld + j), row_max[r], inv_sum,
                                              j + vocab_begin == target, scale));
        }
      }
    });
  });
}

}  // namespace strata::models::cpu
