// CPU kernels of the element and row ops without reductions over the hidden size: GELU, SwiGLU,
// residual add, casts, rotary embeddings, embedding lookup and its gradient, bias gradient.
#include <cmath>
#include <limits>
#include <vector>

#include "models/kernels/cpu_common.h"
#include "models/kernels/cpu_kernels.h"
#include "models/kernels/op_math.h"

namespace strata::models::cpu {

namespace {
constexpr std::int64_t kElemGrain = 16384;
}

void gelu_forward(DType dtype, const void* x, void* out, std::int64_t n) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(n, kElemGrain, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) store<T>(out, i, math::gelu_tanh(load<T>(x, i)));
    });
  });
}

void gelu_backward(DType dtype, const void* x, const void* dout, void* dx, std::int64_t n) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(n, kElemGrain, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) {
        store<T>(dx, i, load<T>(dout, i) * math::gelu_tanh_grad(load<T>(x, i)));
      }
    });
  });
}

void swiglu_forward(DType dtype, const void* gate_up, void* out, std::int64_t rows, std::int64_t hidden) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(rows, 1, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t in = r * 2 * hidden;
        for (std::int64_t j = 0; j < hidden; ++j) {
          store<T>(out, r * hidden + j, math::swiglu(load<T>(gate_up, in + j), load<T>(gate_up, in + hidden + j)));
        }
      }
    });
  });
}

void swiglu_backward(DType dtype, const void* gate_up, const void* dout, void* dgate_up, std::int64_t rows,
                     std::int64_t hidden) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(rows, 1, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t in = r * 2 * hidden;
        for (std::int64_t j = 0; j < hidden; ++j) {
          const float g = load<T>(gate_up, in + j);
          const float u = load<T>(gate_up, in + hidden + j);
          const float d = load<T>(dout, r * hidden + j);
          store<T>(dgate_up, in + j, math::swiglu_dgate(g, u, d));
          store<T>(dgate_up, in + hidden + j, math::swiglu_dup(g, d));
        }
      }
    });
  });
}

void residual_add(DType dtype, const void* a, const void* b, void* out, std::int64_t n) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(n, kElemGrain, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) store<T>(out, i, load<T>(a, i) + load<T>(b, i));
    });
  });
}

void cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, std::int64_t n) {
  dispatch_dtype(src_dtype, [&](auto src_tag) {
    using S = decltype(src_tag);
    dispatch_dtype(dst_dtype, [&](auto dst_tag) {
      using D = decltype(dst_tag);
      parallel_rows(n, kElemGrain, [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) store<D>(dst, i, load<S>(src, i));
      });
    });
  });
}

void rope(DType dtype, void* x, std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
          std::int64_t row_stride, const RopeSpec& spec, RopeDirection direction, std::int64_t first_position) {
  STRATA_CHECK(head_dim % 2 == 0, "rope needs an even head_dim, got {}", head_dim);
  const std::int64_t half = head_dim / 2;
  // cos/sin table [seq, half], computed once per call with the shared per-element math.
  std::vector<float> cos_t(static_cast<std::size_t>(seq * half)), sin_t(cos_t.size());
  for (std::int64_t t = 0; t < seq; ++t) {
    for (std::int64_t i = 0; i < half; ++i) {
      const float angle = math::rope_angle(first_position + t, static_cast<int>(i), static_cast<int>(head_dim), spec);
      const auto at = static_cast<std::size_t>(t * half + i);
      math::rope_cos_sin(angle, &cos_t[at], &sin_t[at]);
    }
  }
  const float sign = direction == RopeDirection::Forward ? 1.0f : -1.0f;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(batch * seq, 1, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t t = r % seq;
        for (std::int64_t h = 0; h < heads; ++h) {
          const std::int64_t base = r * row_stride + h * head_dim;
          for (std::int64_t i = 0; i < half; ++i) {
            float o1, o2;
            math::rope_rotate(load<T>(x, base + i), load<T>(x, base + i + half), cos_t[static_cast<std::size_t>(t * half + i)],
                              sign * sin_t[static_cast<std::size_t>(t * half + i)], &o1, &o2);
            store<T>(x, base + i, o1);
            store<T>(x, base + i + half, o2);
          }
        }
      }
    });
  });
}

void embedding_forward_vocab_slice(DType dtype, const std::int32_t* tokens, const void* wte_slice,
                                   std::int64_t vocab_begin, std::int64_t vocab_end, const void* wpe, void* out,
                                   std::int64_t batch, std::int64_t seq, std::int64_t channels) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(batch * seq, 1, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t tok = tokens[r];
        STRATA_CHECK(tok >= 0, "negative token id {} at row {}", tok, r);
        const std::int64_t t = r % seq;
        const bool mine = (tok >= vocab_begin && tok < vocab_end);
        for (std::int64_t c = 0; c < channels; ++c) {
          float v = 0.0f;
          if (mine) {
            v = load<T>(wte_slice, (tok - vocab_begin) * channels + c);
            if (wpe != nullptr) v += load<T>(wpe, t * channels + c);
          }
          store<T>(out, r * channels + c, v);
        }
      }
    });
  });
}

void embedding_backward_vocab_slice(DType dtype, const std::int32_t* tokens, const void* dout, void* dwte_slice,
                                    std::int64_t vocab_begin, std::int64_t vocab_end, void* dwpe, std::int64_t batch,
                                    std::int64_t seq, std::int64_t channels) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    // dwte: column blocks walk the tokens in order, so repeated tokens sum in a fixed order.
    parallel_column_blocks(channels, [&](std::int64_t c0, std::int64_t c1) {
      for (std::int64_t r = 0; r < batch * seq; ++r) {
        const std::int64_t tok = tokens[r];
        if (!(tok >= vocab_begin && tok < vocab_end)) continue;
        const std::int64_t row = (tok - vocab_begin) * channels;
        for (std::int64_t c = c0; c < c1; ++c) {
          store<T>(dwte_slice, row + c, load<T>(dwte_slice, row + c) + load<T>(dout, r * channels + c));
        }
      }
    });
  });
  if (dwpe != nullptr) embedding_backward_positions(dtype, dout, dwpe, batch, seq, channels);
}

// The whole vocabulary is the slice [0, every token id).
constexpr std::int64_t kAllTokens = std::numeric_limits<std::int64_t>::max();

void embedding_forward(DType dtype, const std::int32_t* tokens, const void* wte, const void* wpe, void* out,
                       std::int64_t batch, std::int64_t seq, std::int64_t channels) {
  embedding_forward_vocab_slice(dtype, tokens, wte, 0, kAllTokens, wpe, out, batch, seq, channels);
}

void embedding_backward(DType dtype, const std::int32_t* tokens, const void* dout, void* dwte, void* dwpe,
                        std::int64_t batch, std::int64_t seq, std::int64_t channels) {
  embedding_backward_vocab_slice(dtype, tokens, dout, dwte, 0, kAllTokens, dwpe, batch, seq, channels);
}

void embedding_backward_positions(DType dtype, const void* dout, void* dwpe, std::int64_t batch, std::int64_t seq,
                                  std::int64_t channels) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_rows(seq, 1, [&](std::int64_t t0, std::int64_t t1) {
      for (std::int64_t t = t0; t < t1; ++t) {
        for (std::int64_t b = 0; b < batch; ++b) {
          const std::int64_t r = b * seq + t;
          for (std::int64_t c = 0; c < channels; ++c) {
            store<T>(dwpe, t * channels + c, load<T>(dwpe, t * channels + c) + load<T>(dout, r * channels + c));
          }
        }
      }
    });
  });
}

void bias_grad(DType dtype, const void* dout, std::int64_t rows, std::int64_t cols, std::int64_t ld, void* dbias) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_column_blocks(cols, [&](std::int64_t c0, std::int64_t c1) {
      float acc[kColumnBlock];
      for (std::int64_t c = c0; c < c1; ++c) acc[c - c0] = load<T>(dbias, c);
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) acc[c - c0] += load<T>(dout, r * ld + c);
      }
      for (std::int64_t c = c0; c < c1; ++c) store<T>(dbias, c, acc[c - c0]);
    });
  });
}

}  // namespace strata::models::cpu
