// The decoder's forward over a KV cache (models/kv_decoder.h, Note [KV cache] in models/kv_decoder.h): the buffers, the
// q/k/v linears writing into the cache, and one append through embedding, blocks and head.
#include "models/kv_decoder.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>

#include <fmt/format.h>

#include "core/error.h"
#include "models/decoder_params.h"
#include "models/kernels/ops.h"
#include "models/tiling.h"

namespace strata::models {

namespace {

void* at(void* p, std::int64_t elems, DType dt) {
  return static_cast<char*>(p) + static_cast<std::size_t>(elems) * dtype_bytes(dt);
}
const void* at(const void* p, std::int64_t elems, DType dt) {
  return static_cast<const char*>(p) + static_cast<std::size_t>(elems) * dtype_bytes(dt);
}

// Output columns [col0, col1) of a linear go to y (column col0 at y[0], row stride ld).
struct Segment {
  std::int64_t col0 = 0, col1 = 0;
  void* y = nullptr;
  std::int64_t ld = 0;
};

// y = x W^T + b over `rows` rows, in the training decoder's fixed row chunks of W (Note
// [Tile-invariant linear layers] in models/tiling.h), each chunk's columns written where their
// segment says: the same matmul per output element as the full forward's, on fewer rows of x.
void linear_into(const KernelContext& ctx, DType dt, const void* x, std::int64_t ldx, std::int64_t rows,
                 const void* w, const void* bias, const StageLinear& lin, std::int64_t chunks,
                 std::initializer_list<Segment> segments) {
  for (std::int64_t ch = 0; ch < chunks; ++ch) {
    const RowRange r = chunk_rows(lin.out, chunks, ch);
    for (const Segment& s : segments) {
      const std::int64_t lo = std::max(r.begin, s.col0), hi = std::min(r.end, s.col1);
      if (lo >= hi) continue;
      MatmulArgs a{dt, Trans::No, Trans::Yes, rows, hi - lo, lin.in, x, ldx, 0, at(w, lo * lin.in, dt), lin.in, 0,
                   at(s.y, lo - s.col0, dt), s.ld, 0, 1};
      a.bias = bias == nullptr ? nullptr : at(bias, lo, dt);
      matmul(ctx, a);
    }
  }
}

// Lays out (or only measures, with base == nullptr) buffers in one allocation, 256-byte aligned.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <typename T = void>
  T* take(std::size_t bytes) {
    void* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += (bytes + 255) / 256 * 256;
    return static_cast<T*>(p);
  }
  std::size_t used() const { return used_; }

 private:
  char* base_;
  std::size_t used_ = 0;
};

}  // namespace

struct KvDecoder::Buffers {
  DeviceMemory device_mem, logits_mem;
  HostBuffer host_mem, logits_host_mem;
  std::int32_t* tokens = nullptr;
  void *x = nullptr, *norm = nullptr, *tmp = nullptr, *q = nullptr, *att = nullptr, *ff_in = nullptr,
       *ff_act = nullptr;
  float *mean = nullptr, *rstd = nullptr;
  std::vector<void*> k_cache, v_cache;
  std::int64_t logit_rows = 0;
  void* logits = nullptr;          // [logit_rows, vocab] in the model's dtype
  float* logits_f32 = nullptr;     // the same as fp32 (== logits for fp32 models)
  std::vector<std::int32_t> host_tokens;
};

static void carve(const ModelConfig& c, std::int64_t capacity, KvDecoder::Buffers* b, Carver& cv) {
  const std::size_t e = dtype_bytes(c.dtype);
  const auto n = static_cast<std::size_t>(capacity);
  const auto C = static_cast<std::size_t>(c.d_model), F = static_cast<std::size_t>(c.ffn_hidden);
  const auto att_w = static_cast<std::size_t>(c.attn_width());
  const auto kv_w = static_cast<std::size_t>(c.n_kv_heads * c.head_dim());
  const std::size_t ff_in_w = c.arch == Architecture::Gpt2 ? F : 2 * F;
  b->tokens = cv.take<std::int32_t>(n * 4);
  b->x = cv.take(n * C * e);
  b->norm = cv.take(n * C * e);
  b->tmp = cv.take(n * C * e);
  b->q = cv.take(n * att_w * e);
  b->att = cv.take(n * att_w * e);
  b->ff_in = cv.take(n * ff_in_w * e);
  b->ff_act = cv.take(n * F * e);
  b->mean = cv.take<float>(n * 4);
  b->rstd = cv.take<float>(n * 4);
  b->k_cache.clear();
  b->v_cache.clear();
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    b->k_cache.push_back(cv.take(n * kv_w * e));
    b->v_cache.push_back(cv.take(n * kv_w * e));
  }
}

// One row's logits in the model's dtype, and as fp32 unless that is the model's dtype.
static std::size_t logit_row_bytes(const ModelConfig& c) {
  const auto V = static_cast<std::size_t>(c.vocab_size);
  return V * dtype_bytes(c.dtype) + (c.dtype == DType::F32 ? 0 : V * 4) + 512;
}

std::size_t KvDecoder::cache_bytes(const ModelConfig& config, std::int64_t capacity) {
  return 2 * static_cast<std::size_t>(config.n_layers * capacity * config.n_kv_heads * config.head_dim()) *
         dtype_bytes(config.dtype);
}

std::size_t KvDecoder::device_bytes(const ModelConfig& config, std::int64_t capacity) {
  Buffers b;
  Carver cv(nullptr);
  carve(config, capacity, &b, cv);
  return cv.used() + logit_row_bytes(config);
}

KvDecoder::KvDecoder(ModelConfig config, const DecoderRuntime& rt, std::int64_t capacity)
    : config_(std::move(config)), rt_(rt), capacity_(capacity), buf_(std::make_unique<Buffers>()) {
  config_.validate();
  if (capacity < 1 || capacity > config_.max_seq_len) {
    throw ConfigError(fmt::format("a KV cache of {} positions is outside 1..{} (model '{}' max_seq_len)", capacity,
                                  config_.max_seq_len, config_.name));
  }
  STRATA_CHECK((rt.device == nullptr) == (rt.ctx.stream == nullptr),
               "a KvDecoder runs on a device with a stream, or inline on the host with neither");
  Carver measure(nullptr);
  carve(config_, capacity, buf_.get(), measure);
  char* base = nullptr;
  if (rt.device != nullptr) {
    buf_->device_mem = rt.device->allocate(measure.used(), "kv cache");
    base = buf_->device_mem.as<char>();
  } else {
    buf_->host_mem = HostBuffer::allocate(measure.used());
    base = static_cast<char*>(buf_->host_mem.data());
  }
  Carver cv(base);
  carve(config_, capacity, buf_.get(), cv);
  ensure_logit_rows(1);
}

KvDecoder::~KvDecoder() {
  // Work enqueued by append has run (append waits), so the buffers can go.
  if (rt_.ctx.stream != nullptr && buf_) rt_.ctx.stream->synchronize();
}

void KvDecoder::ensure_logit_rows(std::int64_t rows) {
  Buffers& b = *buf_;
  if (rows <= b.logit_rows) return;
  const std::size_t bytes = static_cast<std::size_t>(rows) * logit_row_bytes(config_);
  char* base = nullptr;
  if (rt_.device != nullptr) {
    if (rt_.ctx.stream != nullptr) rt_.ctx.stream->synchronize();  // the old buffer's readers are done
    b.logits_mem = DeviceMemory();
    b.logits_mem = rt_.device->allocate(bytes, "logits");
    base = b.logits_mem.as<char>();
  } else {
    b.logits_host_mem = HostBuffer::allocate(bytes);
    base = static_cast<char*>(b.logits_host_mem.data());
  }
  Carver cv(base);
  const auto n = static_cast<std::size_t>(rows * config_.vocab_size);
  b.logits = cv.take(n * dtype_bytes(config_.dtype));
  b.logits_f32 = config_.dtype == DType::F32 ? static_cast<float*>(b.logits) : cv.take<float>(n * 4);
  b.logit_rows = rows;
}

void KvDecoder::check_tokens(std::span<const std::int32_t> tokens) const {
  const ModelConfig& c = config_;
  const auto n = static_cast<std::int64_t>(tokens.size());
  const std::int64_t p = length_;
  if (n < 1) throw ConfigError("nothing to append to the KV cache: no tokens given");
  if (p + n > capacity_) {
    throw ConfigError(fmt::format("{} more tokens after {} cached exceed the KV cache's {} positions (model '{}')", n,
                                  p, capacity_, c.name));
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t t = tokens[static_cast<std::size_t>(i)];
    if (t < 0 || t >= c.vocab_size) {
      throw ConfigError(fmt::format("token {} at position {} is outside model '{}' vocabulary of {}", t, p + i,
                                    c.name, c.vocab_size));
    }
  }
}

void KvDecoder::norm_rows(const void* x, const void* weight, const void* bias, void* out, std::int64_t rows) {
  const ModelConfig& c = config_;
  Buffers& b = *buf_;
  if (c.arch == Architecture::Gpt2) {
    layernorm_forward(rt_.ctx, c.dtype, x, weight, bias, out, b.mean, b.rstd, rows, c.d_model, c.norm_eps);
  } else {
    rmsnorm_forward(rt_.ctx, c.dtype, x, weight, out, b.rstd, rows, c.d_model, c.norm_eps);
  }
}

namespace {

const void* bias_of(const GroupViews& w, const StageLinear& lin) { return lin.bias == kNoBias ? nullptr : w[lin.bias]; }

}  // namespace

// Block l over the n new rows: attention (q into its buffer, k and v straight into the cache's rows
// p..p+n-1) and the MLP, each added to the residual stream b.x.
void KvDecoder::append_block(ParamProvider& provider, std::int64_t l, std::int64_t n, std::int64_t p) {
  const ModelConfig& c = config_;
  Buffers& b = *buf_;
  const KernelContext& ctx = rt_.ctx;
  Stream* stream = ctx.stream;
  const DType dt = c.dtype;
  const bool gpt2 = c.arch == Architecture::Gpt2;
  const std::int64_t C = c.d_model, F = c.ffn_hidden, hd = c.head_dim();
  const std::int64_t H = c.n_heads, KV = c.n_kv_heads, att_w = c.attn_width(), kv_w = KV * hd;
  const std::int64_t chunks = TilingSpec{}.chunks;  // the training decoder's untiled chunks
  const std::size_t g = block_group_index(l);
  const GroupViews w = provider.acquire_params(g, ParamPhase::Forward, stream);
  void* kc = b.k_cache[static_cast<std::size_t>(l)];
  void* vc = b.v_cache[static_cast<std::size_t>(l)];
  void* k_new = at(kc, p * kv_w, dt);
  void* v_new = at(vc, p * kv_w, dt);
  const std::vector<StageLinear> attn_in = stage_linears(c, BlockStage::AttnIn);
  if (gpt2) {
    using namespace gpt2_block;
    norm_rows(b.x, w[kLn1W], w[kLn1B], b.norm, n);
    const StageLinear& qkv = attn_in[0];
    linear_into(ctx, dt, b.norm, C, n, w[qkv.weight], bias_of(w, qkv), qkv, chunks,
                {{0, C, b.q, att_w}, {C, 2 * C, k_new, kv_w}, {2 * C, 3 * C, v_new, kv_w}});
  } else {
    using namespace llama_block;
    norm_rows(b.x, w[kAttnNorm], nullptr, b.norm, n);
    linear_into(ctx, dt, b.norm, C, n, w[attn_in[0].weight], bias_of(w, attn_in[0]), attn_in[0], chunks,
                {{0, att_w, b.q, att_w}});
    linear_into(ctx, dt, b.norm, C, n, w[attn_in[1].weight], bias_of(w, attn_in[1]), attn_in[1], chunks,
                {{0, kv_w, k_new, kv_w}});
    linear_into(ctx, dt, b.norm, C, n, w[attn_in[2].weight], bias_of(w, attn_in[2]), attn_in[2], chunks,
                {{0, kv_w, v_new, kv_w}});
    rope_at(ctx, dt, b.q, n, p, H, hd, att_w, c.rope);
    rope_at(ctx, dt, k_new, n, p, KV, hd, kv_w, c.rope);
  }
  const CachedAttentionShape shape{n, p + n, H, KV, hd, att_w, kv_w, att_w};
  attention_cached(ctx, dt, shape, b.q, kc, vc, b.att);
  const StageLinear out_proj = stage_linears(c, BlockStage::AttnOut)[0];
  linear_into(ctx, dt, b.att, att_w, n, w[out_proj.weight], bias_of(w, out_proj), out_proj, chunks, {{0, C, b.tmp, C}});
  residual_add(ctx, dt, b.x, b.tmp, b.x, n * C);
  // MLP.
  const std::vector<StageLinear> mlp_in = stage_linears(c, BlockStage::MlpIn);
  if (gpt2) {
    using namespace gpt2_block;
    norm_rows(b.x, w[kLn2W], w[kLn2B], b.norm, n);
    linear_into(ctx, dt, b.norm, C, n, w[mlp_in[0].weight], bias_of(w, mlp_in[0]), mlp_in[0], chunks,
                {{0, F, b.ff_in, F}});
    gelu_forward(ctx, dt, b.ff_in, b.ff_act, n * F);
  } else {
    using namespace llama_block;
    norm_rows(b.x, w[kMlpNorm], nullptr, b.norm, n);
    linear_into(ctx, dt, b.norm, C, n, w[mlp_in[0].weight], nullptr, mlp_in[0], chunks, {{0, F, b.ff_in, 2 * F}});
    linear_into(ctx, dt, b.norm, C, n, w[mlp_in[1].weight], nullptr, mlp_in[1], chunks,
                {{0, F, at(b.ff_in, F, dt), 2 * F}});
    swiglu_forward(ctx, dt, b.ff_in, b.ff_act, n, F);
  }
  const StageLinear down = stage_linears(c, BlockStage::MlpOut)[0];
  linear_into(ctx, dt, b.ff_act, F, n, w[down.weight], bias_of(w, down), down, chunks, {{0, C, b.tmp, C}});
  residual_add(ctx, dt, b.x, b.tmp, b.x, n * C);
  provider.release_params(g, stream);
}

// The final norm and the logits of the last out_rows of the n new rows, fp32 on the host.
std::vector<float> KvDecoder::append_head(ParamProvider& provider, std::int64_t n, std::int64_t out_rows) {
  const ModelConfig& c = config_;
  Buffers& b = *buf_;
  const KernelContext& ctx = rt_.ctx;
  Stream* stream = ctx.stream;
  const DType dt = c.dtype;
  const bool gpt2 = c.arch == Architecture::Gpt2;
  const std::int64_t C = c.d_model, V = c.vocab_size;
  const std::size_t emb = embedding_group_index();
  const std::size_t head = head_group_index(c);
  const GroupViews hw = provider.acquire_params(head, ParamPhase::Forward, stream);
  GroupViews ew;
  if (c.tied_embeddings) ew = provider.acquire_params(emb, ParamPhase::Forward, stream);
  const void* head_w = c.tied_embeddings ? ew[embedding_group::kWte] : hw[head_group::kLmHead];
  const void* x_rows = at(b.x, (n - out_rows) * C, dt);
  norm_rows(x_rows, hw[head_group::kNormW], gpt2 ? hw[head_group::kNormB] : nullptr, b.norm, out_rows);
  matmul(ctx, MatmulArgs{dt, Trans::No, Trans::Yes, out_rows, V, C, b.norm, C, 0, head_w, C, 0, b.logits, V, 0, 1});
  if (c.tied_embeddings) provider.release_params(emb, stream);
  provider.release_params(head, stream);
  if (dt != DType::F32) cast(ctx, dt, b.logits, DType::F32, b.logits_f32, out_rows * V);

  std::vector<float> logits(static_cast<std::size_t>(out_rows * V));
  const std::size_t bytes = logits.size() * 4;
  if (stream == nullptr) {
    std::memcpy(logits.data(), b.logits_f32, bytes);
  } else {
    stream->copy_d2h(logits.data(), b.logits_f32, bytes);
    stream->synchronize();  // the host samples the next token from these logits: decoding is serial
  }
  return logits;
}

std::vector<float> KvDecoder::append(ParamProvider& provider, std::span<const std::int32_t> tokens, LogitRows which) {
  check_tokens(tokens);
  const ModelConfig& c = config_;
  const auto n = static_cast<std::int64_t>(tokens.size());
  const std::int64_t p = length_;
  const std::int64_t out_rows = which == LogitRows::All ? n : 1;
  ensure_logit_rows(out_rows);
  Buffers& b = *buf_;
  Stream* stream = rt_.ctx.stream;
  const DType dt = c.dtype;

  // The token ids go through a host array that lives as long as the decoder (a pageable copy
  // blocks until it has run, but the inline run reads them later in this call too).
  b.host_tokens.assign(tokens.begin(), tokens.end());
  if (stream == nullptr) {
    std::memcpy(b.tokens, b.host_tokens.data(), static_cast<std::size_t>(n) * 4);
  } else {
    stream->copy_h2d(b.tokens, b.host_tokens.data(), static_cast<std::size_t>(n) * 4);
  }

  // Embedding (GPT-2's learned positions from row p).
  const std::size_t emb = embedding_group_index();
  {
    const GroupViews w = provider.acquire_params(emb, ParamPhase::Forward, stream);
    const void* wpe = c.arch == Architecture::Gpt2 ? at(w[embedding_group::kWpe], p * c.d_model, dt) : nullptr;
    embedding_forward(rt_.ctx, dt, b.tokens, w[embedding_group::kWte], wpe, b.x, 1, n, c.d_model);
    provider.release_params(emb, stream);
  }
  for (std::int64_t l = 0; l < c.n_layers; ++l) append_block(provider, l, n, p);
  std::vector<float> logits = append_head(provider, n, out_rows);
  length_ = p + n;
  return logits;
}

}  // namespace strata::models
