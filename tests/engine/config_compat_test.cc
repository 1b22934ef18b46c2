// DeepSpeed's config semantics for the keys it accepts (engine/config.cc): a feature switched off is
// accepted without a word; a key without effect is listed, silently when its value is DeepSpeed's
// default or what Strata does anyway; other names and old forms are read as the current ones (and
// act); a feature switched on that Strata cannot honour is refused naming what to use.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/error.h"
#include "engine/config.h"

namespace strata {
namespace {

using nlohmann::json;

std::string error_of(const json& j) {
  try {
    parse_train_config(j, "t.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// key path -> (silent, kind) of every listed key.
std::map<std::string, IgnoredKey> listed(const TrainConfig& c) {
  std::map<std::string, IgnoredKey> out;
  for (const IgnoredKey& k : c.ignored_keys) out[k.key_path] = k;
  return out;
}

TEST(ConfigCompat, FeaturesSwitchedOffAreAccepted) {
  const json j = json::parse(R"({
    "prescale_gradients": false, "gradient_predivide_factor": 1.0, "sparse_gradients": false,
    "amp": {"enabled": false, "opt_level": "O1"},
    "zero_optimization": {"stage": 2, "zero_hpz_partition_size": 1, "zero_quantized_weights": false,
                          "zero_quantized_gradients": false, "mics_hierarchical_params_gather": false,
                          "cpu_offload": false, "mics_shard_size": -1},
    "fp16": {"fp16_master_weights_and_grads": false},
    "bf16": {"bf16_master_weights_and_grads": false}
  })");
  const TrainConfig c = parse_train_config(j, "t.json");
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::None);
  EXPECT_EQ(c.zero.sharding_factor, 0);
  for (const auto& [key, k] : listed(c)) EXPECT_TRUE(k.silent) << key << " would be reported";
  // Switched on, each is refused, naming the key.
  for (const char* on : {R"({"prescale_gradients": true})", R"({"gradient_predivide_factor": 2.0})",
                         R"({"amp": {"enabled": true}})", R"({"zero_optimization": {"zero_hpz_partition_size": 8}})",
                         R"({"zero_optimization": {"zero_quantized_gradients": true}})"}) {
    const std::string msg = error_of(json::parse(on));
    EXPECT_NE(msg.find("not supported by Strata"), std::string::npos) << on << ": " << msg;
  }
}

TEST(ConfigCompat, DeepSpeedDefaultsAreSilentOtherValuesListed) {
  const auto silent = [](const char* text, const char* key) {
    const auto keys = listed(parse_train_config(json::parse(text), "t.json"));
    const auto it = keys.find(key);
    EXPECT_NE(it, keys.end()) << key << " not listed";
    return it != keys.end() && it->second.silent;
  };
  EXPECT_TRUE(silent(R"({"zero_optimization": {"overlap_comm": true}})", "zero_optimization.overlap_comm"));
  EXPECT_FALSE(silent(R"({"zero_optimization": {"overlap_comm": false}})", "zero_optimization.overlap_comm"));
  EXPECT_TRUE(silent(R"({"zero_optimization": {"reduce_bucket_size": 5e8}})", "zero_optimization.reduce_bucket_size"));
  EXPECT_TRUE(silent(R"({"zero_optimization": {"reduce_bucket_size": 500000000}})",
                     "zero_optimization.reduce_bucket_size"));
  EXPECT_FALSE(silent(R"({"zero_optimization": {"reduce_bucket_size": 2e8}})", "zero_optimization.reduce_bucket_size"));
  EXPECT_TRUE(silent(R"({"wall_clock_breakdown": false})", "wall_clock_breakdown"));
  EXPECT_TRUE(silent(R"({"tensorboard": {"enabled": false, "output_path": "x"}})", "tensorboard"));
  EXPECT_FALSE(silent(R"({"tensorboard": {"enabled": true, "output_path": "x"}})", "tensorboard"));
  EXPECT_TRUE(silent(R"({"data_types": {"grad_accum_dtype": "fp32"}})", "data_types.grad_accum_dtype"));
}

TEST(ConfigCompat, OtherNamesAndOldFormsAreReadAsTheCurrentOnes) {
  const TrainConfig c = parse_train_config(json::parse(R"({
    "bfloat16": {"enabled": true},
    "zero_optimization": {"stage": 3, "max_live_parameters": 123, "prefetch_bucket_size": 456,
                          "param_persistence_threshold": 7, "cpu_offload": true, "cpu_offload_params": true,
                          "cpu_offload_use_pin_memory": false}
  })"), "t.json");
  EXPECT_EQ(c.precision, Precision::Bf16);
  EXPECT_EQ(c.zero.max_live_parameters_elems, 123u);
  EXPECT_EQ(c.zero.prefetch_bucket_size_elems, 456u);
  EXPECT_EQ(c.zero.param_persistence_threshold_elems, 7u);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::Cpu);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::Cpu);
  EXPECT_FALSE(c.zero.offload_optimizer.pin_memory);
  const auto keys = listed(c);
  ASSERT_EQ(keys.count("bfloat16"), 1u);
  EXPECT_EQ(keys.at("bfloat16").kind, IgnoredKey::Kind::Translated);
  EXPECT_EQ(keys.at("bfloat16").reason, "read as bf16");
  EXPECT_EQ(keys.at("zero_optimization.cpu_offload").reason,
            "read as zero_optimization.offload_optimizer.device = \"cpu\"");
  // A name and its alias with different values: refused, naming both.
  const std::string msg =
      error_of(json::parse(R"({"zero_optimization": {"max_live_parameters": 1, "stage3_max_live_parameters": 2}})"));
  EXPECT_NE(msg.find("zero_optimization.max_live_parameters"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stage3_max_live_parameters"), std::string::npos) << msg;
  // An old form that contradicts its section.
  EXPECT_NE(error_of(json::parse(R"({"zero_optimization": {"stage": 2, "cpu_offload": true,
                                     "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}})"))
                .find("keep one"),
            std::string::npos);
}

TEST(ConfigCompat, MessagesPointAtTheFix) {
  EXPECT_NE(error_of(json::parse(R"({"zero_optimization": {"comm_overlap": true}})")).find("did you mean 'overlap_comm'"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"zero_optimization": {"aio": {"queue_depth": 8}}})")).find("top-level section"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"bf16": {"enabled": true, "loss_scale": 0}})")).find("bf16 has no loss scaling"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"optimizer": {"type": "OneBitAdam"}})")).find("AdamW, Adam, SGD and Lion"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"scheduler": {"type": "LRRangeTest"}})")).find("WarmupLR, WarmupDecayLR"),
            std::string::npos);
  // DeepSpeed allows 0 for these sizes.
  EXPECT_EQ(error_of(json::parse(R"({"zero_optimization": {"sub_group_size": 0, "reduce_bucket_size": 0}})")), "");
}

}  // namespace
}  // namespace strata
