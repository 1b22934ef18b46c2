// models::check_parallel_shape: which tensor and pipeline splits a model's shape allows (issue 17's
// bad-input rule), each refusal naming the key, the model's numbers and the valid choices.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "models/model_config.h"

namespace strata::models {
namespace {

std::string refusal(const ModelConfig& m, int t, int p) {
  try {
    check_parallel_shape(m, t, p, "run.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelShape, TensorSplitsFollowHeadsKvHeadsAndTheMlpWidth) {
  const ModelConfig gpt = model_config_by_name("tiny");  // 4 heads, MLP 128
  for (int t : {1, 2, 4}) EXPECT_EQ(refusal(gpt, t, 1), "") << t;
  const std::string three = refusal(gpt, 3, 1);
  EXPECT_NE(three.find("run.json: strata.parallel.tensor = 3 does not split model 'tiny' evenly"), std::string::npos) << three;
  EXPECT_NE(three.find("valid choices: 1, 2, 4"), std::string::npos) << three;
  EXPECT_NE(refusal(gpt, 8, 1), "");

  // LLaMA-70B: 64 heads, 8 KV heads (replicated when fewer than the ranks), MLP 28672.
  const ModelConfig llama = model_config_by_name("llama-70b");
  for (int t : {1, 2, 4, 8, 16, 32, 64}) EXPECT_EQ(refusal(llama, t, 1), "") << t;
  EXPECT_NE(refusal(llama, 6, 1), "") << "6 does not divide 64 heads";
  // tiny-llama: 4 heads, 2 KV heads: 4 ranks replicate each KV head twice.
  const ModelConfig tl = model_config_by_name("tiny-llama");
  EXPECT_EQ(refusal(tl, 4, 1), "");
}

TEST(ParallelShape, EveryPipelineStageNeedsALayer) {
  const ModelConfig gpt = model_config_by_name("tiny");  // 2 layers
  EXPECT_EQ(refusal(gpt, 1, 2), "");
  const std::string m = refusal(gpt, 1, 3);
  EXPECT_NE(m.find("strata.parallel.pipeline = 3 stages for model 'tiny' of 2 layers"), std::string::npos) << m;
  EXPECT_NE(m.find("valid choices 1..2"), std::string::npos) << m;
}

}  // namespace
}  // namespace strata::models
