// Text generation from a decoder over a KV cache (models/kv_decoder.h): choosing each next token
// from the logits (greedy, or sampled with temperature, top-k and top-p from a seeded generator),
// and the loop that prefills the prompt once and then feeds back one token at a time until an
// end-of-sequence id or the token budget.
//
// Sampling follows transformers' logits processors in their order: divide by the temperature, keep
// the top_k largest logits, then the smallest set of most likely tokens whose probability reaches
// top_p (the token that crosses top_p stays; at least one token always stays), renormalize, draw.
// Ties keep the lower id first. The draw is a std::mt19937_64 seeded with `seed` taking one
// uniform number per token, so the same seed gives the same tokens on any machine (the logits
// being equal), though not the tokens transformers' torch generator would draw.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "plan/param_provider.h"
#include "models/kv_decoder.h"

namespace strata::models {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy (argmax, the lowest id among equal logits)
  std::int64_t top_k = 0;    // 0: every token
  float top_p = 1.0f;        // in (0, 1]; 1: every token
  std::uint64_t seed = 0;
};

struct TokenPick {
  std::int32_t token = 0;
  float logprob = 0;  // log softmax of the raw logits (temperature 1, before top-k/top-p) at `token`
};

class TokenSampler {
 public:
  // STRATA_CHECK on options outside their ranges (the command checks its flags first, by name).
  explicit TokenSampler(const SamplingOptions& options);
  TokenPick pick(std::span<const float> logits);

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<std::int32_t> order_;  // scratch: candidate ids
  std::vector<double> probs_;        // scratch
};

// log softmax(logits)[token], the sum of exponentials in double (Note [Long sums in double] in
// models/kernels/cpu_matmul.cc).
float token_logprob(std::span<const float> logits, std::int32_t token);

struct GenerateOptions {
  std::int64_t max_new_tokens = 32;
  std::vector<std::int32_t> stop_ids;  // end-of-sequence ids: generation ends after emitting one
  SamplingOptions sampling;
};

struct GenerateResult {
  std::vector<std::int32_t> tokens;  // the new tokens (an end-of-sequence id last when one stopped it)
  std::vector<float> logprobs;       // TokenPick::logprob of each
  bool stopped_at_eos = false;
  double prefill_seconds = 0;        // the prompt's forward and the first token
  double decode_seconds = 0;         // every later token (tokens.size() - 1 forwards of one row)
};

// Generates after `prompt` (at least one token) with `decoder`, which must be empty and have room
// for prompt + max_new_tokens - 1 positions (ConfigError saying so otherwise). `on_token`, when
// given, sees each token as it is chosen.
GenerateResult generate(KvDecoder& decoder, ParamProvider& provider, std::span<const std::int32_t> prompt,
                        const GenerateOptions& options,
                        const std::function<void(const TokenPick&)>& on_token = nullptr);

}  // namespace strata::models
