// The decoder's forward for generation: one sequence, run a few positions at a time over a cache
// of every earlier position's keys and values (GPT-2 and the LLaMA family, with grouped-query
// heads, RoPE and its scaling, q/k/v biases, a head_dim of its own, tied or untied heads).
//
// Note [KV cache]: generating token t + 1 needs the logits of position t only, and attention is
// the one place where positions meet: position t's attention reads the keys and values of
// positions 0..t, which never change once computed. So the cache keeps each layer's K and V rows
// (after RoPE), [capacity, kv_heads * head_dim] each in the model's dtype on the device, and an
// append of n tokens at positions p..p+n-1 runs those n rows only: embedding (GPT-2's learned
// positions from row p), norms and linears over n rows, RoPE of the new q and k rows at their
// positions (ops.h rope_at), their k and v written straight into the cache's rows p..p+n-1 by the
// q/k/v linears, attention of the n query rows over cache rows 0..p+n-1 (ops.h attention_cached),
// and the head on the last row (or every row, for tests). The prompt is one append (the prefill),
// each generated token another of one row.
//
// The calls are those of the training decoder (models/decoder.h) on fewer rows: the same kernels,
// each linear in the same fixed row chunks of its weight (Note [Tile-invariant linear layers] in
// models/tiling.h), RoPE angles of the same positions, and attention_cached runs the forward
// attention's own per-row function. So a position's logits would equal a full forward's bit for
// bit if the BLAS gave a row of a product the same bits whatever the number of rows; OpenBLAS does
// not (its remainder kernels add in another order), so they agree within fp32 rounding instead
// (tests/models/kv_decoder_test.cc: within 1e-5 relative, measured ~1e-6).
//
// Untiled, unsliced, unpipelined models only (a generator's weights are resident, or acquired
// group by group from any ParamProvider over the untiled layout, models/decoder_params.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/device/device.h"
#include "core/host_buffer.h"
#include "plan/param_provider.h"
#include "models/decoder.h"
#include "models/model_config.h"

namespace strata::models {

enum class LogitRows { Last, All };

class KvDecoder {
 public:
  // A cache of `capacity` positions (1..max_seq_len) and the work buffers of an append of up to
  // `capacity` rows, allocated on rt.device (host memory when it is null, the inline reference run).
  KvDecoder(ModelConfig config, const DecoderRuntime& rt, std::int64_t capacity);
  ~KvDecoder();
  KvDecoder(const KvDecoder&) = delete;
  KvDecoder& operator=(const KvDecoder&) = delete;

  // Device bytes a KvDecoder of this capacity allocates (cache and work buffers; the logits of one
  // row included, those of more rows are allocated when asked for).
  static std::size_t device_bytes(const ModelConfig& config, std::int64_t capacity);
  // The cache's bytes alone: 2 x layers x capacity x kv_heads x head_dim elements.
  static std::size_t cache_bytes(const ModelConfig& config, std::int64_t capacity);

  const ModelConfig& config() const { return config_; }
  std::int64_t length() const { return length_; }  // positions cached
  std::int64_t capacity() const { return capacity_; }
  void clear() { length_ = 0; }  // forget the cached positions (the memory stays)

  // Runs `tokens` at positions length()..length()+n-1 through the model over the cache, caches
  // their keys and values and returns fp32 logits of the last row ([vocab]) or of every row
  // ([n, vocab]). Weights come from `provider` (the untiled groups, decoder_param_groups), each
  // group acquired for the forward and released. Waits for the stream: the caller samples from the
  // logits. ConfigError naming the token or the capacity when a token is outside the vocabulary
  // or the cache would overflow.
  std::vector<float> append(ParamProvider& provider, std::span<const std::int32_t> tokens,
                            LogitRows rows = LogitRows::Last);

  // The cache and work buffers (defined in models/kv_decoder.cc; opaque to users).
  struct Buffers;

 private:
  void ensure_logit_rows(std::int64_t rows);
  // The steps of append over n new tokens after p cached ones (models/kv_decoder.cc).
  void check_tokens(std::span<const std::int32_t> tokens) const;
  void norm_rows(const void* x, const void* weight, const void* bias, void* out, std::int64_t rows);
  void append_block(ParamProvider& provider, std::int64_t l, std::int64_t n, std::int64_t p);
  std::vector<float> append_head(ParamProvider& provider, std::int64_t n, std::int64_t out_rows);

  ModelConfig config_;
  DecoderRuntime rt_;
  std::int64_t capacity_ = 0;
  std::int64_t length_ = 0;
  std::unique_ptr<Buffers> buf_;
};

}  // namespace strata::models
