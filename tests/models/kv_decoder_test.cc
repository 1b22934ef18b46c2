// The KV-cache decoder (models/kv_decoder.h) against full forwards, on the sim device, for the tiny
// GPT-2, LLaMA (grouped-query heads) and LLaMA with every Hugging Face option (tied head, q/k/v
// biases, head_dim of its own, llama3 rope scaling): decoding a sequence one token at a time after
// a short prefill gives the logits of one forward over the whole sequence, and the training
// decoder's loss; plus the sampler's contracts and the generation loop's stops.
//
// Bound, not bits: Note [KV cache] in models/kv_decoder.h says why the logits would be the same bits but for the BLAS
// (the same kernels, chunks and RoPE positions on fewer rows; attention_cached runs the forward's
// per-row function and rope_at rope's angles, both checked bit for bit in ops_cached_test.cc).
// OpenBLAS does not give a row of a product the same bits for every number of rows: 0.3.21's
// sgemm on an AMD EPYC gives the rows of a 5-row product other last bits than the same rows of a
// 45-row one (its M-remainder micro-kernels add in another order), so a 5-token prefill already
// differs from the whole sequence's forward in the last bits, and every later position inherits
// that through the cache. So the test requires agreement within 1e-5 relative per logit (measured
// worst 1.0e-6 for GPT-2, 4e-7 for LLaMA; a wrong position, cache row, head or RoPE offset moves
// logits by 1e-2 and more) and prints how many logits matched bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/device/device.h"
#include "core/error.h"
#include "models/decoder.h"
#include "models/decoder_params.h"
#include "models/generation.h"
#include "models/kv_decoder.h"
#include "models/resident_provider.h"
#include "tests/models/decoder_test_util.h"

namespace strata::models {
namespace {

using namespace strata::models::testing;

// Every tensor random (biases included, so Qwen2's q/k/v biases count), norm weights around 1.
void randomize(ResidentParamProvider& p, Stream* stream, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.25f, 0.25f);
  for (const std::string& name : p.tensor_names()) {
    std::vector<float> w(p.tensor_spec(name).elems());
    const bool norm = name.find("norm") != std::string::npos || name.find("ln") != std::string::npos;
    for (float& x : w) x = norm && name.find("weight") != std::string::npos ? 1.0f + u(rng) : u(rng);
    p.write_param(name, w.data(), stream);
  }
}

class KvDecoderTest : public ::testing::TestWithParam<Tiny> {
 protected:
  void SetUp() override {
    config_ = tiny(GetParam());
    SimDeviceOptions opts;
    opts.capacity_bytes = 64ull << 20;
    device_ = make_sim_device(opts);
    stream_ = device_->create_stream("compute");
    params_ = std::make_unique<ResidentParamProvider>(decoder_param_groups(config_), device_.get());
    randomize(*params_, stream_.get(), 7);
  }
  DecoderRuntime rt() const { return {{DeviceKind::Sim, stream_.get(), nullptr}, device_.get()}; }

  ModelConfig config_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<ResidentParamProvider> params_;
};

TEST_P(KvDecoderTest, DecodingOneTokenAtATimeGivesTheFullForwardsLogits) {
  const std::int64_t T = 45, prefill = 5, V = config_.vocab_size;  // past one 32-key tile
  const std::vector<std::int32_t> tokens = random_tokens(static_cast<std::size_t>(T), 3);
  KvDecoder whole(config_, rt(), T);
  const std::vector<float> full = whole.append(*params_, tokens, LogitRows::All);
  ASSERT_EQ(full.size(), static_cast<std::size_t>(T * V));

  KvDecoder step(config_, rt(), T);
  std::vector<float> got = step.append(*params_, std::span(tokens).first(prefill), LogitRows::All);
  for (std::int64_t t = prefill; t < T; ++t) {
    const std::vector<float> row = step.append(*params_, std::span(tokens).subspan(static_cast<std::size_t>(t), 1));
    got.insert(got.end(), row.begin(), row.end());
  }
  EXPECT_EQ(step.length(), T);
  std::size_t same_bits = 0, worst = 0;
  double worst_err = 0;
  for (std::size_t i = 0; i < full.size(); ++i) {
    same_bits += std::memcmp(&full[i], &got[i], 4) == 0 ? 1 : 0;
    const double err = std::abs(static_cast<double>(full[i]) - got[i]) / std::max(1.0, std::abs(static_cast<double>(full[i])));
    if (err > worst_err) worst_err = err, worst = i;
  }
  EXPECT_LE(worst_err, 1e-5) << "position " << worst / V << " token " << worst % V << ": full " << full[worst]
                             << ", cached " << got[worst];
  std::size_t prefill_same = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(prefill * V); ++i) prefill_same += std::memcmp(&full[i], &got[i], 4) == 0 ? 1 : 0;
  std::printf("[ %s ] %zu of %zu logits bit-identical to the full forward (prefill rows: %zu of %lld); worst relative "
              "difference %.3g\n",
              tiny_name(GetParam()).c_str(), same_bits, full.size(), prefill_same, static_cast<long long>(prefill * V),
              worst_err);

  // The training decoder's loss on the same tokens from the cached logits (targets shifted by one).
  Decoder decoder(config_, {});
  std::vector<std::int32_t> in(tokens.begin(), tokens.end() - 1), tg(tokens.begin() + 1, tokens.end());
  const LossSum want = decoder.forward_loss(rt(), *params_, in.data(), tg.data(), 1, T - 1);
  double sum = 0;
  for (std::int64_t t = 0; t + 1 < T; ++t) {
    sum -= token_logprob(std::span(got).subspan(static_cast<std::size_t>(t * V), static_cast<std::size_t>(V)),
                         tg[static_cast<std::size_t>(t)]);
  }
  EXPECT_NEAR(sum / static_cast<double>(T - 1), want.mean(), 1e-5 * want.mean());
}

TEST_P(KvDecoderTest, RefusesTokensOutsideTheVocabularyAndPastTheCapacity) {
  KvDecoder kv(config_, rt(), 4);
  const std::vector<std::int32_t> bad = {1, static_cast<std::int32_t>(config_.vocab_size)};
  EXPECT_THROW(kv.append(*params_, bad), ConfigError);
  EXPECT_EQ(kv.length(), 0);
  kv.append(*params_, std::vector<std::int32_t>{1, 2, 3});
  EXPECT_THROW(kv.append(*params_, std::vector<std::int32_t>{4, 5}), ConfigError);
  EXPECT_THROW(KvDecoder(config_, rt(), config_.max_seq_len + 1), ConfigError);
}

TEST_P(KvDecoderTest, GreedyGenerationFollowsTheArgmaxAndSamplingRepeatsForASeed) {
  const std::vector<std::int32_t> prompt = random_tokens(6, 5);
  KvDecoder kv(config_, rt(), 6 + 10);
  GenerateOptions go;
  go.max_new_tokens = 10;
  const GenerateResult greedy = generate(kv, *params_, prompt, go);
  ASSERT_EQ(greedy.tokens.size(), 10u);
  // Each greedy token is the argmax of a full forward over everything before it.
  std::vector<std::int32_t> seq = prompt;
  for (std::size_t i = 0; i < greedy.tokens.size(); ++i) {
    KvDecoder fresh(config_, rt(), static_cast<std::int64_t>(seq.size()));
    const std::vector<float> logits = fresh.append(*params_, seq);
    const auto want = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(greedy.tokens[i], want) << "token " << i;
    seq.push_back(greedy.tokens[i]);
  }
  // An end-of-sequence id stops generation after it is emitted.
  kv.clear();
  go.stop_ids = {greedy.tokens[3]};
  const GenerateResult stopped = generate(kv, *params_, prompt, go);
  EXPECT_TRUE(stopped.stopped_at_eos);
  const auto first = std::find(greedy.tokens.begin(), greedy.tokens.end(), greedy.tokens[3]);
  EXPECT_EQ(stopped.tokens, std::vector<std::int32_t>(greedy.tokens.begin(), first + 1));
  // Sampling: the same seed gives the same tokens.
  go.stop_ids.clear();
  go.sampling = {1.5f, 20, 0.9f, 42};
  kv.clear();
  const GenerateResult a = generate(kv, *params_, prompt, go);
  kv.clear();
  const GenerateResult b = generate(kv, *params_, prompt, go);
  EXPECT_EQ(a.tokens, b.tokens);
}

INSTANTIATE_TEST_SUITE_P(Tinies, KvDecoderTest, kEveryTiny, [](const auto& info) { return tiny_name(info.param); });

// The sampler's filters on hand-made logits.
TEST(TokenSampler, TopKAndTopPKeepOnlyTheirCandidates) {
  const std::vector<float> logits = {0.0f, 3.0f, 2.9f, -1.0f, 1.0f};
  TokenSampler greedy({});
  EXPECT_EQ(greedy.pick(logits).token, 1);
  EXPECT_NEAR(greedy.pick(logits).logprob, token_logprob(logits, 1), 1e-7);
  TokenSampler top1({1.0f, 1, 1.0f, 3});  // top-k 1 is greedy whatever the draw
  for (int i = 0; i < 20; ++i) EXPECT_EQ(top1.pick(logits).token, 1);
  TokenSampler top2({1.0f, 2, 1.0f, 3});
  for (int i = 0; i < 50; ++i) {
    const std::int32_t t = top2.pick(logits).token;
    EXPECT_TRUE(t == 1 || t == 2) << t;
  }
  // p(1) ~ 0.47 and p(2) ~ 0.43 of the softmax: top-p 0.5 keeps both (1 alone is below 0.5), 0.4 only 1.
  TokenSampler p05({1.0f, 0, 0.5f, 3}), p04({1.0f, 0, 0.4f, 3});
  for (int i = 0; i < 50; ++i) {
    const std::int32_t t = p05.pick(logits).token;
    EXPECT_TRUE(t == 1 || t == 2) << t;
    EXPECT_EQ(p04.pick(logits).token, 1);
  }
}

}  // namespace
}  // namespace strata::models
