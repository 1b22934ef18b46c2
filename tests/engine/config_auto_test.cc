// "auto" values and the batch-size triangle (Note [Auto values], config/config.cc): the Hugging Face
// Trainer's DeepSpeed configs write "auto" for what the Trainer fills in; Strata resolves each as the
// Trainer would (or to its own default where the Trainer's value needs the model) and records every
// resolution for the startup block; the batch sizes follow DeepSpeed's derivation.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "config/config.h"

namespace strata {
namespace {

using nlohmann::json;

// The value `key_path` resolved to, or "" when it was not resolved.
std::string resolved(const TrainConfig& c, const std::string& key_path) {
  for (const ResolvedAuto& a : c.resolved_auto) {
    if (a.key_path == key_path) return a.value;
  }
  return "";
}

// The ZeRO-3 config of the Hugging Face DeepSpeed integration's documentation, as users copy it.
json hf_zero3() {
  return json::parse(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto"
  })");
}

TEST(ConfigAuto, TheHuggingFaceZero3ConfigResolvesAsTheTrainerWould) {
  TrainConfig c = parse_train_config(hf_zero3(), "hf.json");
  EXPECT_EQ(c.precision, Precision::Bf16);
  EXPECT_EQ(resolved(c, "bf16.enabled"), "true");
  EXPECT_EQ(resolved(c, "fp16.enabled"), "false");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 5e-5);
  EXPECT_EQ(resolved(c, "optimizer.params.lr"), "5e-05");
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(resolved(c, "optimizer.params.betas"), "[0.9, 0.999]");
  EXPECT_EQ(resolved(c, "optimizer.params.eps"), "1e-08");
  EXPECT_EQ(resolved(c, "optimizer.params.weight_decay"), "0");
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);  // not "no clipping"
  EXPECT_EQ(resolved(c, "gradient_clipping"), "1.0");
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 5e-5);  // the optimizer's lr, not 1e-3
  EXPECT_EQ(c.scheduler.warmup_num_steps, 0);          // not 1000
  EXPECT_NE(resolved(c, "zero_optimization.stage3_prefetch_bucket_size"), "");
  EXPECT_NE(resolved(c, "zero_optimization.stage3_param_persistence_threshold"), "");
  EXPECT_EQ(resolved(c, "zero_optimization.stage3_max_live_parameters"), "");  // a number, not "auto"

  resolve_batch_sizes(c, 2);
  EXPECT_EQ(c.micro_batch_size, 1);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_batch_size, 2);
  EXPECT_EQ(resolved(c, "train_batch_size"), "2");
  EXPECT_EQ(resolved(c, "train_micro_batch_size_per_gpu"), "1");
  EXPECT_EQ(resolved(c, "gradient_accumulation_steps"), "1");
  for (const ResolvedAuto& a : c.resolved_auto) EXPECT_FALSE(a.why.empty()) << a.key_path;
}

TEST(ConfigAuto, PrecisionFollowsExactModeAndAnExplicitChoice) {
  json j = hf_zero3();
  j["strata"] = {{"exact", true}};
  TrainConfig c = parse_train_config(j, "hf.json");
  EXPECT_EQ(c.precision, Precision::Fp32);
  EXPECT_EQ(resolved(c, "bf16.enabled"), "false");
  j = hf_zero3();
  j["fp16"]["enabled"] = true;
  c = parse_train_config(j, "hf.json");
  EXPECT_EQ(c.precision, Precision::Fp16);
  EXPECT_EQ(resolved(c, "bf16.enabled"), "false");
  j = hf_zero3();
  j["bf16"]["enabled"] = false;
  EXPECT_EQ(parse_train_config(j, "hf.json").precision, Precision::Fp32);
}

TEST(ConfigAuto, TheLearningRateAndTheWarmupPeakComeFromEachOther) {
  json j = json::parse(R"({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
                           "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 3e-4}}})");
  TrainConfig c = parse_train_config(j, "t.json");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  j = json::parse(R"({"optimizer": {"type": "AdamW", "params": {"lr": 2e-4}},
                      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}}})");
  c = parse_train_config(j, "t.json");
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 2e-4);
  EXPECT_EQ(resolved(c, "optimizer.params.lr"), "");
}

TEST(ConfigAuto, TotalStepsAutoIsTheRunsSteps) {
  const json j = json::parse(R"({"scheduler": {"type": "WarmupDecayLR",
      "params": {"warmup_num_steps": 5, "total_num_steps": "auto"}}, "strata": {"steps": 40}})");
  TrainConfig c = parse_train_config(j, "t.json");
  resolve_step_autos(c);
  EXPECT_EQ(c.scheduler.total_num_steps, 40);
  EXPECT_EQ(resolved(c, "scheduler.params.total_num_steps"), "40");
  c = parse_train_config(j, "t.json");
  c.strata.steps = 5;  // --steps 5: no room to decay after 5 warm-up steps
  try {
    resolve_step_autos(c);
    FAIL() << "a decay schedule shorter than its warm-up was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--steps"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("total_num_steps"), std::string::npos) << e.what();
  }
}

// DeepSpeed's triangle: the numbers given fix the rest for the data-parallel ranks.
TEST(ConfigAuto, BatchSizesAreDerivedAsDeepSpeedDoes) {
  const auto derived = [](const char* text, int world) {
    TrainConfig c = parse_train_config(json::parse(text), "t.json");
    resolve_batch_sizes(c, world);
    return std::tuple{c.train_batch_size, c.micro_batch_size, c.gradient_accumulation_steps};
  };
  EXPECT_EQ(derived(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", 2), std::tuple(32, 4, 4));
  EXPECT_EQ(derived(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", 4), std::tuple(32, 4, 2));
  EXPECT_EQ(derived(R"({"train_batch_size": 16})", 2), std::tuple(16, 8, 1));
  EXPECT_EQ(derived(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2})", 2),
            std::tuple(12, 3, 2));
  EXPECT_EQ(derived(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
                        "gradient_accumulation_steps": 4})", 1), std::tuple(8, 2, 4));
  EXPECT_EQ(derived(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": "auto",
                        "gradient_accumulation_steps": 2})", 2), std::tuple(16, 4, 2));
  const auto error = [](const char* text, int world) {
    TrainConfig c = parse_train_config(json::parse(text), "t.json");
    try {
      resolve_batch_sizes(c, world);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string disagree = error(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
                                         "gradient_accumulation_steps": 4})", 2);
  EXPECT_NE(disagree.find("must equal"), std::string::npos) << disagree;
  EXPECT_NE(disagree.find("2 data-parallel"), std::string::npos) << disagree;
  const std::string uneven = error(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})", 1);
  EXPECT_NE(uneven.find("not a whole multiple"), std::string::npos) << uneven;
}

}  // namespace
}  // namespace strata
