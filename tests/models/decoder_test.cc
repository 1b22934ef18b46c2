// The decoders: the tiny models overfit one fixed batch (loss falls 10x), 1 micro-batch of 8 and 4
// of 2 give bit-identical gradients, checkpointed and plain backward give bit-identical gradients,
// the sim device matches the inline run bit for bit, the provider sees the fetch/release pattern
// the ZeRO engine will rely on, a full-model finite-difference spot check, and parameter counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/device/device.h"
#include "core/error.h"
#include "models/decoder.h"
#include "models/token_data.h"
#include "models/decoder_params.h"
#include "models/resident_provider.h"
#include "tests/models/decoder_test_util.h"

#include <map>
#include <nlohmann/json.hpp>

namespace strata::models {
namespace {

using testing::random_tokens;
using testing::tiny;

std::vector<std::uint8_t> all_grads(const ResidentParamProvider& p) {
  std::vector<std::uint8_t> out;
  for (const auto& n : p.tensor_names()) {
    std::vector<std::uint8_t> g(p.tensor_spec(n).bytes());
    p.read_grad(n, g.data(), nullptr);
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

class DecoderTest : public ::testing::TestWithParam<testing::Tiny> {};

TEST_P(DecoderTest, TinyModelOverfitsOneBatch) {
  const ModelConfig c = tiny(GetParam());
  Decoder model(c, {});
  ResidentParamProvider params(model.param_groups(), nullptr);
  params.init_gpt2_style(7, c.n_layers, nullptr);
  const std::int64_t B = 4, T = 16;
  const auto tokens = random_tokens(B * (T + 1), 3);
  std::vector<std::int32_t> in, tg;
  for (std::int64_t b = 0; b < B; ++b) {
    in.insert(in.end(), tokens.begin() + b * (T + 1), tokens.begin() + b * (T + 1) + T);
    tg.insert(tg.end(), tokens.begin() + b * (T + 1) + 1, tokens.begin() + (b + 1) * (T + 1));
  }
  // Plain Adam on the host copies of the weights (the optimizer is not this suite's subject).
  struct State {
    std::vector<float> w, m, v;
  };
  std::map<std::string, State> st;
  for (const auto& n : params.tensor_names()) {
    State s;
    s.w.resize(params.tensor_spec(n).elems());
    params.read_param(n, s.w.data(), nullptr);
    s.m.assign(s.w.size(), 0);
    s.v.assign(s.w.size(), 0);
    st[n] = std::move(s);
  }
  const DecoderRuntime rt{};
  double first = 0, last = 0;
  const int steps = 150;
  for (int step = 1; step <= steps; ++step) {
    params.zero_grads(nullptr);
    const LossSum loss = accumulate_step_gradients(model, rt, params, in.data(), tg.data(), 1, B, T);
    if (step == 1) first = loss.mean();
    last = loss.mean();
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.99f;
    for (auto& [n, s] : st) {
      std::vector<float> g(s.w.size());
      params.read_grad(n, g.data(), nullptr);
      for (std::size_t i = 0; i < g.size(); ++i) {
        s.m[i] = b1 * s.m[i] + (1 - b1) * g[i];
        s.v[i] = b2 * s.v[i] + (1 - b2) * g[i] * g[i];
        const float mh = s.m[i] / (1 - std::pow(b1, static_cast<float>(step)));
        const float vh = s.v[i] / (1 - std::pow(b2, static_cast<float>(step)));
        s.w[i] -= lr * mh / (std::sqrt(vh) + 1e-8f);
      }
      params.write_param(n, s.w.data(), nullptr);
    }
  }
  EXPECT_NEAR(first, std::log(256.0), 0.3) << "an untrained byte model starts near ln(256)";
  EXPECT_LT(last, first / 10) << "loss fell from " << first << " to " << last;
}

TEST_P(DecoderTest, MicroBatchesGiveBitIdenticalGradients) {
  const ModelConfig c = tiny(GetParam());
  Decoder model(c, {});
  const std::int64_t T = 12;
  const auto in = random_tokens(8 * T, 11);
  auto tg = random_tokens(8 * T, 12);
  tg[5] = -1;  // an ignored target must not change the scale differently per split
  auto grads = [&](std::int64_t micro_batches, std::int64_t micro) {
    ResidentParamProvider p(model.param_groups(), nullptr);
    p.init_gpt2_style(5, c.n_layers, nullptr);
    p.zero_grads(nullptr);
    const LossSum l = accumulate_step_gradients(model, {}, p, in.data(), tg.data(), micro_batches, micro, T);
    EXPECT_EQ(l.tokens, 8 * T - 1);
    return std::make_pair(all_grads(p), l.sum);
  };
  const auto one = grads(1, 8), four = grads(4, 2);
  EXPECT_TRUE(one.first == four.first) << "1x8 and 4x2 gradients differ";
  EXPECT_EQ(one.second, four.second);
  const auto eight = grads(8, 1);
  EXPECT_TRUE(one.first == eight.first) << "1x8 and 8x1 gradients differ";
}

// A micro-batch whose every target is masked (kIgnoredTarget) adds exactly zero
// to every gradient and reports no token and a zero loss, not NaN; masking part of a window leaves
// the loss of the other targets as it was.
TEST_P(DecoderTest, MaskedTargetsAddNothing) {
  const ModelConfig c = tiny(GetParam());
  Decoder model(c, {});
  const std::int64_t B = 2, T = 12;
  const auto in = random_tokens(B * T, 31);
  const auto tg = random_tokens(B * T, 32);
  ResidentParamProvider p(model.param_groups(), nullptr);
  p.init_gpt2_style(4, c.n_layers, nullptr);
  p.zero_grads(nullptr);
  const std::vector<std::int32_t> none(static_cast<std::size_t>(B * T), kIgnoredTarget);
  const LossSum masked = model.forward_backward({}, p, in.data(), none.data(), B, T, 0.5f);
  EXPECT_EQ(masked.tokens, 0);
  EXPECT_EQ(masked.sum, 0.0);
  EXPECT_EQ(masked.mean(), 0.0);
  ASSERT_EQ(c.dtype, DType::F32);
  const std::vector<std::uint8_t> bytes = all_grads(p);
  std::vector<float> grads(bytes.size() / 4);
  std::memcpy(grads.data(), bytes.data(), grads.size() * 4);
  for (std::size_t i = 0; i < grads.size(); ++i) ASSERT_EQ(grads[i], 0.0f) << "a masked target reached gradient " << i;
  // Half the targets masked: the loss sum is the sum over the rest of the full batch's losses.
  auto half = tg;
  for (std::size_t i = 0; i < half.size(); i += 2) half[i] = kIgnoredTarget;
  const LossSum some = model.forward_loss({}, p, in.data(), half.data(), B, T);
  EXPECT_EQ(some.tokens, B * T / 2);
  double expected = 0;
  for (std::size_t i = 1; i < tg.size(); i += 2) {
    auto one = none;
    one[i] = tg[i];
    expected += model.forward_loss({}, p, in.data(), one.data(), B, T).sum;
  }
  EXPECT_NEAR(some.sum, expected, 1e-9 * std::abs(expected));
}

TEST_P(DecoderTest, CheckpointedBackwardEqualsPlainBackward) {
  const ModelConfig c = tiny(GetParam());
  const std::int64_t B = 3, T = 20;
  const auto in = random_tokens(B * T, 21), tg = random_tokens(B * T, 22);
  auto grads = [&](Checkpointing ck) {
    Decoder model(c, {ck});
    ResidentParamProvider p(model.param_groups(), nullptr);
    p.init_gpt2_style(9, c.n_layers, nullptr);
    p.zero_grads(nullptr);
    model.forward_backward({}, p, in.data(), tg.data(), B, T, 1.0f / static_cast<float>(B * T));
    return all_grads(p);
  };
  const auto plain = grads(Checkpointing::Off), ckpt = grads(Checkpointing::Blocks);
  EXPECT_TRUE(plain == ckpt);
  Decoder a(c, {Checkpointing::Off}), b(c, {Checkpointing::Blocks});
  EXPECT_LT(b.activation_bytes(B, T, true), a.activation_bytes(B, T, true));
}

TEST_P(DecoderTest, ProviderSeesEachGroupAcquiredAndReleased) {
  const ModelConfig c = tiny(GetParam());
  for (auto ck : {Checkpointing::Off, Checkpointing::Blocks}) {
    Decoder model(c, {ck});
    ResidentParamProvider p(model.param_groups(), nullptr);
    p.init_gpt2_style(1, c.n_layers, nullptr);
    p.zero_grads(nullptr);
    const auto in = random_tokens(16, 1), tg = random_tokens(16, 2);
    model.forward_backward({}, p, in.data(), tg.data(), 2, 8, 1.0f / 16);
    EXPECT_EQ(p.live_groups(), 0);
    const auto& counts = p.acquire_counts();
    ASSERT_EQ(counts.size(), static_cast<std::size_t>(c.n_layers + 2));
    for (std::int64_t l = 0; l < c.n_layers; ++l) EXPECT_EQ(counts[static_cast<std::size_t>(1 + l)], 2) << "forward + backward";
    EXPECT_EQ(counts.back(), 1);
    EXPECT_EQ(counts.front(), c.tied_embeddings ? 3 : 2) << "a tied head fetches the embedding too";
  }
}

TEST_P(DecoderTest, GradientMatchesFiniteDifferenceOfTheLoss) {
  const ModelConfig c = tiny(GetParam());
  Decoder model(c, {});
  ResidentParamProvider p(model.param_groups(), nullptr);
  p.init_gpt2_style(3, c.n_layers, nullptr);
  const std::int64_t B = 2, T = 8;
  const auto in = random_tokens(B * T, 31), tg = random_tokens(B * T, 32);
  p.zero_grads(nullptr);
  model.forward_backward({}, p, in.data(), tg.data(), B, T, 1.0f / (B * T));
  for (const std::string name : {"blocks.0.attn_norm.weight", "blocks.1.ln1.weight", "blocks.0.mlp.fc.weight",
                                 "blocks.1.mlp.up.weight", "blocks.0.attn.q.weight", "blocks.0.attn.qkv.weight", "blocks.1.attn.k.bias",
                                 "blocks.0.attn.q.bias", "blocks.1.attn.o.weight",
                                 "head.norm.weight", "embedding.wte"}) {
    bool exists = false;
    for (const auto& n : p.tensor_names()) exists = exists || n == name;
    if (!exists) continue;
    std::vector<float> w(p.tensor_spec(name).elems()), g(w.size());
    p.read_param(name, w.data(), nullptr);
    p.read_grad(name, g.data(), nullptr);
    // The element with the largest gradient: the finite difference is far above fp32 noise there.
    std::size_t i = 0;
    for (std::size_t j = 0; j < g.size(); ++j) i = std::abs(g[j]) > std::abs(g[i]) ? j : i;
    const float h = 1e-2f, w0 = w[i];
    auto loss_at = [&](float v) {
      w[i] = v;
      p.write_param(name, w.data(), nullptr);
      return model.forward_loss({}, p, in.data(), tg.data(), B, T).mean();
    };
    const double fd = (loss_at(w0 + h) - loss_at(w0 - h)) / (2 * h);
    loss_at(w0);
    EXPECT_NEAR(g[i], fd, 2e-2 * std::abs(fd) + 1e-4) << name << "[" << i << "]";
  }
}

// The sim device against the inline run: SimDeviceRunMatchesInlineUntiledRun in tiling_test.cc.

INSTANTIATE_TEST_SUITE_P(Arch, DecoderTest, testing::kEveryTiny,
                         [](const auto& info) { return testing::tiny_name(info.param); });

TEST(ModelConfigTest, ParameterCountsAndFlops) {
  EXPECT_EQ(param_count(model_config_by_name("gpt2-124m")), 124'439'808);  // Hugging Face's gpt2
  EXPECT_EQ(param_count(model_config_by_name("llama-7b")), 6'738'415'616);  // Llama-2-7b
  for (const auto& name : known_model_names()) {
    const ModelConfig c = model_config_by_name(name);
    std::int64_t declared = 0;
    for (const auto& g : decoder_param_groups(c)) {
      for (const auto& t : g.tensors) declared += static_cast<std::int64_t>(t.elems());
    }
    EXPECT_EQ(declared, param_count(c)) << name;
    EXPECT_GT(train_flops_per_token(c, 1024), 6.0 * static_cast<double>(param_count(c)) * 0.5) << name;
  }
  EXPECT_THROW(model_config_by_name("gpt5"), ConfigError);
  const ModelConfig custom = model_config_from_json(nlohmann::json{{"name", "gpt2-124m"}, {"n_layers", 2}});
  EXPECT_EQ(custom.n_layers, 2);
  EXPECT_EQ(custom.d_model, 768);
  EXPECT_THROW(model_config_from_json(nlohmann::json{{"name", "tiny"}, {"n_layer", 2}}), ConfigError);
  EXPECT_THROW(model_config_from_json(nlohmann::json{{"name", "tiny"}, {"n_heads", 5}}), ConfigError);
}

}  // namespace
}  // namespace strata::models
