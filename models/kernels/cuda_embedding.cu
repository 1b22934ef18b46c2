// CUDA kernels of the token (+ learned position) embedding, forward and backward, over the whole
// table or a tensor rank's rows [vocab_begin, vocab_end) of it (ops.h's *_vocab_slice: a token
// outside them gives a zero row forward and adds nothing backward).
//
// Forward: one thread per output element. A negative token id (the CPU kernel's STRATA_CHECK)
// cannot be thrown for on the device; its output row becomes NaN. (The op is not told the vocab
// size, so ids past the table's end are the caller's contract, on the CPU as here.)
//
// Backward, deterministic without atomics and without knowing the vocab size: one block per token
// row r scans the token ids in row order (a tile of kScanThreads ids per step, matches found with a
// warp ballot). If an earlier row holds the same id, that row's block owns the id and block r
// exits; otherwise block r is the owner and adds dout of every row with that id into dwte, in row
// order, each thread over its own channels. Every dwte row is thus written by one block, in the
// token order of the CPU kernel (cpu_elementwise.cc), rounded to the element type after every add
// as there. dwpe: one thread per (position, channel) summing the batch in order. Rows with a
// negative id are skipped.
//
// Shared per-element math: to_f32 / from_f32 for every load and store (core/dtype.h); the op is
// additions only.
#include "models/kernels/cuda_common.cuh"

namespace strata::models::cuda {
namespace {

// Token ids scanned per step of the backward ownership scan; also the block size of that kernel.
constexpr int kScanThreads = 256;
// The whole table as a vocabulary slice: every token id.
constexpr std::int64_t kAllTokens = 0x7fffffffffffffffLL;

// A rank's rows [vocab_begin, vocab_end) of the table (the whole table: [0, max)); a token outside
// them gives zeros (embedding_forward_vocab_slice in ops.h).
template <typename T>
__global__ void embedding_forward_kernel(const std::int32_t* __restrict__ tokens, const T* __restrict__ wte,
                                         std::int64_t vocab_begin, std::int64_t vocab_end, const T* __restrict__ wpe,
                                         T* __restrict__ out, std::int64_t rows, std::int64_t seq,
                                         std::int64_t channels) {
  const std::int64_t n = rows * channels;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const std::int64_t r = e / channels, c = e % channels;
    const std::int64_t tok = tokens[r];
    if (tok < 0) {
      out[e] = from_f32<T>(bad_input_nan());
      continue;
    }
    float v = 0.0f;
    if (tok >= vocab_begin && tok < vocab_end) {
      v = to_f32(wte[(tok - vocab_begin) * channels + c]);
      if (wpe != nullptr) v += to_f32(wpe[(r % seq) * channels + c]);
    }
    out[e] = from_f32<T>(v);
  }
}

template <typename T>
__global__ void __launch_bounds__(kScanThreads)
    embedding_backward_wte_kernel(const std::int32_t* __restrict__ tokens, const T* __restrict__ dout,
                                  T* __restrict__ dwte, std::int64_t vocab_begin, std::int64_t vocab_end,
                                  std::int64_t rows, std::int64_t channels) {
  __shared__ unsigned match_masks[kScanThreads / 32];
  const std::int64_t own_row = blockIdx.x;
  const std::int32_t tok = tokens[own_row];
  if (tok < 0 || tok < vocab_begin || tok >= vocab_end) return;  // the block's decision is uniform
  T* dst = dwte + (static_cast<std::int64_t>(tok) - vocab_begin) * channels;
  for (std::int64_t t0 = 0; t0 < rows; t0 += kScanThreads) {
    const std::int64_t i = t0 + threadIdx.x;
    const bool hit = i < rows && tokens[i] == tok;
    const unsigned mask = __ballot_sync(0xffffffffu, hit);
    if ((threadIdx.x & 31) == 0) match_masks[threadIdx.x >> 5] = mask;
    __syncthreads();
    for (int w = 0; w < kScanThreads / 32; ++w) {
      unsigned bits = match_masks[w];
      while (bits != 0) {
        const std::int64_t row = t0 + w * 32 + (__ffs(static_cast<int>(bits)) - 1);
        bits &= bits - 1;
        // The first match is the earliest row with this id; every thread sees the same masks, so
        // the decision is uniform across the block.
        if (row < own_row) return;
        for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
          dst[c] = from_f32<T>(to_f32(dst[c]) + to_f32(dout[row * channels + c]));
        }
      }
    }
    __syncthreads();  // match_masks is rewritten by the next step
  }
}

template <typename T>
__global__ void embedding_backward_wpe_kernel(const T* __restrict__ dout, T* __restrict__ dwpe, std::int64_t batch,
                                              std::int64_t seq, std::int64_t channels) {
  const std::int64_t n = seq * channels;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const std::int64_t t = e / channels, c = e % channels;
    for (std::int64_t b = 0; b < batch; ++b) {
      dwpe[e] = from_f32<T>(to_f32(dwpe[e]) + to_f32(dout[(b * seq + t) * channels + c]));
    }
  }
}

}  // namespace

void embedding_forward_vocab_slice(const Launch& L, DType dtype, const std::int32_t* tokens, const void* wte_slice,
                                   std::int64_t vocab_begin, std::int64_t vocab_end, const void* wpe, void* out,
                                   std::int64_t batch, std::int64_t seq, std::int64_t channels) {
  const std::int64_t rows = batch * seq;
  if (rows <= 0 || channels <= 0) return;
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    embedding_forward_kernel<T><<<element_blocks(rows * channels), kBlockThreads, 0, scope.stream>>>(
        tokens, static_cast<const T*>(wte_slice), vocab_begin, vocab_end, static_cast<const T*>(wpe),
        static_cast<T*>(out), rows, seq, channels);
  });
  check_launch();
}

void embedding_forward(const Launch& L, DType dtype, const std::int32_t* tokens, const void* wte, const void* wpe,
                       void* out, std::int64_t batch, std::int64_t seq, std::int64_t channels) {
  embedding_forward_vocab_slice(L, dtype, tokens, wte, 0, kAllTokens, wpe, out, batch, seq, channels);
}

void embedding_backward(const Launch& L, DType dtype, const std::int32_t* tokens, const void* dout, void* dwte,
                        void* dwpe, std::int64_t batch, std::int64_t seq, std::int64_t channels) {
  embedding_backward_vocab_slice(L, dtype, tokens, dout, dwte, 0, kAllTokens, dwpe, batch, seq, channels);
}

void embedding_backward_vocab_slice(const Launch& L, DType dtype, const std::int32_t* tokens, const void* dout,
                                    void* dwte_slice, std::int64_t vocab_begin, std::int64_t vocab_end, void* dwpe,
                                    std::int64_t batch, std::int64_t seq, std::int64_t channels) {
  const std::int64_t rows = batch * seq;
  if (rows <= 0 || channels <= 0) return;
  STRATA_CHECK(rows <= 0x7fffffff, "embedding_backward: more token rows than one CUDA grid dimension holds");
  const StreamScope scope(L);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    embedding_backward_wte_kernel<T><<<static_cast<unsigned>(rows), kScanThreads, 0, scope.stream>>>(
        tokens, static_cast<const T*>(dout), static_cast<T*>(dwte_slice), vocab_begin, vocab_end, rows, channels);
    check_launch();
    if (dwpe != nullptr) {
      embedding_backward_wpe_kernel<T><<<element_blocks(seq * channels), kBlockThreads, 0, scope.stream>>>(
          static_cast<const T*>(dout), static_cast<T*>(dwpe), batch, seq, channels);
      check_launch();
    }
  });
}

}  // namespace strata::models::cuda
