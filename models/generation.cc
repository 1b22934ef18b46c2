// Token choice and the generation loop (models/generation.h).
#include "models/generation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/error.h"

namespace strata::models {

float token_logprob(std::span<const float> logits, std::int32_t token) {
  const float row_max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float v : logits) sum += std::exp(static_cast<double>(v) - row_max);
  return static_cast<float>(static_cast<double>(logits[static_cast<std::size_t>(token)]) - row_max - std::log(sum));
}

TokenSampler::TokenSampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {
  STRATA_CHECK(options.temperature >= 0 && std::isfinite(options.temperature), "temperature {}", options.temperature);
  STRATA_CHECK(options.top_k >= 0, "top_k {}", options.top_k);
  STRATA_CHECK(options.top_p > 0 && options.top_p <= 1, "top_p {}", options.top_p);
}

TokenPick TokenSampler::pick(std::span<const float> logits) {
  STRATA_CHECK(!logits.empty(), "no logits to pick a token from");
  const auto V = static_cast<std::int64_t>(logits.size());
  std::int32_t chosen = 0;
  if (options_.temperature == 0.0f) {
    // The first of equal maxima, as torch.argmax.
    chosen = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    return {chosen, token_logprob(logits, chosen)};
  }
  // Candidates by logit, largest first, lower id first among equals.
  order_.resize(static_cast<std::size_t>(V));
  std::iota(order_.begin(), order_.end(), 0);
  const auto by_logit = [&](std::int32_t a, std::int32_t b) {
    const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
    return la != lb ? la > lb : a < b;
  };
  std::int64_t keep = V;
  if (options_.top_k > 0 && options_.top_k < V) {
    keep = options_.top_k;
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), by_logit);
  } else {
    std::sort(order_.begin(), order_.end(), by_logit);
  }
  // Softmax of logits / temperature over the candidates (in double).
  const double inv_t = 1.0 / static_cast<double>(options_.temperature);
  const double top = static_cast<double>(logits[static_cast<std::size_t>(order_[0])]) * inv_t;
  probs_.resize(static_cast<std::size_t>(keep));
  double sum = 0;
  for (std::int64_t i = 0; i < keep; ++i) {
    const double p = std::exp(static_cast<double>(logits[static_cast<std::size_t>(order_[static_cast<std::size_t>(i)])]) * inv_t - top);
    probs_[static_cast<std::size_t>(i)] = p;
    sum += p;
  }
  if (options_.top_p < 1.0f) {
    // The smallest prefix whose probability reaches top_p (the crossing token stays).
    double cum = 0;
    std::int64_t cut = keep;
    for (std::int64_t i = 0; i < keep; ++i) {
      cum += probs_[static_cast<std::size_t>(i)] / sum;
      if (cum >= static_cast<double>(options_.top_p)) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = std::accumulate(probs_.begin(), probs_.begin() + keep, 0.0);
  }
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * sum;
  double cum = 0;
  chosen = order_[static_cast<std::size_t>(keep - 1)];  // rounding leaves u past the last sum: the last candidate
  for (std::int64_t i = 0; i < keep; ++i) {
    cum += probs_[static_cast<std::size_t>(i)];
    if (u < cum) {
      chosen = order_[static_cast<std::size_t>(i)];
      break;
    }
  }
  return {chosen, token_logprob(logits, chosen)};
}

GenerateResult generate(KvDecoder& decoder, ParamProvider& provider, std::span<const std::int32_t> prompt,
                        const GenerateOptions& options, const std::function<void(const TokenPick&)>& on_token) {
  using Clock = std::chrono::steady_clock;
  const auto n = static_cast<std::int64_t>(prompt.size());
  if (n < 1) throw ConfigError("generation needs a prompt of at least one token");
  STRATA_CHECK(options.max_new_tokens >= 1, "max_new_tokens {}", options.max_new_tokens);
  STRATA_CHECK(decoder.length() == 0, "generation starts from an empty KV cache ({} positions cached)", decoder.length());
  if (n + options.max_new_tokens - 1 > decoder.capacity()) {
    throw ConfigError(fmt::format("a prompt of {} tokens and {} new tokens need {} positions, more than the KV cache's {}",
                                  n, options.max_new_tokens, n + options.max_new_tokens - 1, decoder.capacity()));
  }
  TokenSampler sampler(options.sampling);
  GenerateResult out;
  const auto t0 = Clock::now();
  std::vector<float> logits = decoder.append(provider, prompt);
  auto t_first = t0;
  for (std::int64_t i = 0; i < options.max_new_tokens; ++i) {
    const TokenPick pick = sampler.pick(logits);
    out.tokens.push_back(pick.token);
    out.logprobs.push_back(pick.logprob);
    if (on_token) on_token(pick);
    if (i == 0) t_first = Clock::now();
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), pick.token) != options.stop_ids.end()) {
      out.stopped_at_eos = true;
      break;
    }
    if (i + 1 == options.max_new_tokens) break;  // the last token needs no forward
    const std::int32_t next = pick.token;
    logits = decoder.append(provider, std::span<const std::int32_t>(&next, 1));
  }
  const auto t_end = Clock::now();
  out.prefill_seconds = std::chrono::duration<double>(t_first - t0).count();
  out.decode_seconds = std::chrono::duration<double>(t_end - t_first).count();
  return out;
}

}  // namespace strata::models
