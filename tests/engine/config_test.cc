// Tests of the training config parser: defaults, every error kind the issue names (unknown key with
// the nearest known key, wrong type, out of range, unsupported DeepSpeed key), DeepSpeed keys
// accepted without effect (listed with their reasons), --set overrides.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "config/config.h"
#include "config/config_reader.h"

namespace strata {
namespace {

using nlohmann::json;

// Parses and returns the ConfigError message, or "" if parsing succeeded.
std::string error_of(const json& j) {
  try {
    parse_train_config(j, "test.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsFromEmptyObject) {
  const TrainConfig c = parse_train_config(json::object(), "test.json");
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_EQ(c.micro_batch_size, 1);
  EXPECT_EQ(c.precision, Precision::Fp32);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::None);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_EQ(c.strata.model, "tiny");
}

TEST(Config, FullDeepSpeedStyleConfig) {
  const json j = json::parse(R"({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "sub_group_size": 1e8, "stage3_max_live_parameters": "auto",
      "stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": 1e4,
      "offload_param": {"device": "nvme", "nvme_path": "/tmp/a", "buffer_count": 5, "buffer_size": 1e8},
      "offload_optimizer": {"device": "nvme", "nvme_path": ["/tmp/a", "/tmp/b"], "pipeline_read": true}},
    "aio": {"block_size": 1048576, "queue_depth": 16},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": 3e-4}},
    "strata": {"seed": 7, "model": {"arch": "gpt2", "n_layer": 2}, "device": {"kind": "sim", "memory": "64MiB"},
               "data": {"seq_len": 128}, "checkpoint": {"dir": "ck", "interval_steps": 20, "keep": 3}}
  })");
  const TrainConfig c = parse_train_config(j, "test.json");
  EXPECT_EQ(c.micro_batch_size, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.precision, Precision::Bf16);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.sub_group_size_elems, 100'000'000u);
  EXPECT_EQ(c.zero.max_live_parameters_elems, 1'000'000'000u);  // "auto" keeps the default
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::Nvme);
  ASSERT_EQ(c.zero.offload_optimizer.nvme_paths.size(), 2u);
  EXPECT_EQ(c.zero.offload_optimizer.nvme_paths[1], "/tmp/b");
  EXPECT_EQ(c.aio.queue_depth, 16);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.strata.device.kind, DeviceChoice::Sim);
  EXPECT_EQ(c.strata.device.memory_bytes, 64u << 20);
  EXPECT_EQ(c.strata.data.seq_len, 128);
  EXPECT_EQ(c.strata.checkpoint.keep, 3);
  EXPECT_EQ(c.strata.model["n_layer"], 2);
}

TEST(Config, UnknownKeyNamesPathAndNearestKey) {
  const std::string msg = error_of(json::parse(R"({"zero_optimization": {"stgae": 3}})"));
  EXPECT_NE(msg.find("test.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("zero_optimization.stgae"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'stage'"), std::string::npos) << msg;

  const std::string top = error_of(json::parse(R"({"train_micro_batch_size_per_gpuu": 3})"));
  EXPECT_NE(top.find("did you mean 'train_micro_batch_size_per_gpu'"), std::string::npos) << top;

  const std::string nested = error_of(json::parse(R"({"strata": {"device": {"memroy": "1GiB"}}})"));
  EXPECT_NE(nested.find("strata.device.memroy"), std::string::npos) << nested;
  EXPECT_NE(nested.find("'memory'"), std::string::npos) << nested;
}

TEST(Config, WrongTypeSaysWhatWasFound) {
  const std::string msg = error_of(json::parse(R"({"zero_optimization": {"stage": "three"}})"));
  EXPECT_NE(msg.find("zero_optimization.stage"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected an integer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("three"), std::string::npos) << msg;

  const std::string section = error_of(json::parse(R"({"zero_optimization": 3})"));
  EXPECT_NE(section.find("expected an object"), std::string::npos) << section;

  const std::string boolean = error_of(json::parse(R"({"bf16": {"enabled": "yes"}})"));
  EXPECT_NE(boolean.find("bf16.enabled"), std::string::npos) << boolean;
  EXPECT_NE(boolean.find("true or false"), std::string::npos) << boolean;
}

TEST(Config, OutOfRangeSaysTheRange) {
  const std::string msg = error_of(json::parse(R"({"zero_optimization": {"stage": 4}})"));
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0..3"), std::string::npos) << msg;

  EXPECT_NE(error_of(json::parse(R"({"optimizer": {"params": {"betas": [0.9, 1.0]}}})")).find("[0, 1)"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"optimizer": {"params": {"eps": 0}}})")).find("optimizer.params.eps"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"optimizer": {"params": {"lr": -1}}})")).find("out of range"), std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"aio": {"block_size": 5000}})")).find("multiple of 4096"), std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"strata": {"device": {"memory": "lots"}}})")).find("byte size"),
            std::string::npos);
  // The transport of a multi-rank run: auto by default, mpi and nccl by name, anything else refused
  // with the choices (Note [Staged MPI] in comm/comm_staged.cc).
  EXPECT_EQ(parse_train_config(json::object(), "test.json").strata.parallel.communicator, CommunicatorChoice::Auto);
  EXPECT_EQ(parse_train_config(json::parse(R"({"strata": {"parallel": {"communicator": "mpi"}}})"), "test.json")
                .strata.parallel.communicator,
            CommunicatorChoice::Mpi);
  EXPECT_EQ(parse_train_config(json::parse(R"({"strata": {"parallel": {"communicator": "nccl"}}})"), "test.json")
                .strata.parallel.communicator,
            CommunicatorChoice::Nccl);
  const std::string transport = error_of(json::parse(R"({"strata": {"parallel": {"communicator": "gloo"}}})"));
  EXPECT_NE(transport.find("strata.parallel.communicator"), std::string::npos) << transport;
  EXPECT_NE(transport.find("nccl"), std::string::npos) << transport;
}

// Well-formed but absurd values: a byte size in bits (or of unclear case), a modeled link so slow a
// step never finishes, a latency of minutes per copy.
TEST(Config, AbsurdValuesAreRefusedWithTheAcceptedForms) {
  const std::string bits = error_of(json::parse(R"({"strata": {"offload": {"pinned_buffer": "64Mb"}}})"));
  EXPECT_NE(bits.find("strata.offload.pinned_buffer: '64Mb' is not a byte size: a lowercase 'b' means bits"),
            std::string::npos)
      << bits;
  EXPECT_NE(bits.find("64MiB"), std::string::npos) << bits;
  EXPECT_NE(bits.find("64MB"), std::string::npos) << bits;
  EXPECT_NE(error_of(json::parse(R"({"strata": {"device": {"memory": "64mb"}}})")).find("bits"), std::string::npos);
  EXPECT_EQ(error_of(json::parse(R"({"strata": {"device": {"memory": "64MB"}}})")), "");

  const std::string slow = error_of(json::parse(R"({"strata": {"device": {"h2d_gbps": 1e-9}}})"));
  EXPECT_NE(slow.find("strata.device.h2d_gbps"), std::string::npos) << slow;
  EXPECT_NE(slow.find("at least 0.01"), std::string::npos) << slow;
  EXPECT_NE(error_of(json::parse(R"({"strata": {"device": {"d2h_gbps": 0.001}}})")).find("strata.device.d2h_gbps"),
            std::string::npos);
  EXPECT_EQ(error_of(json::parse(R"({"strata": {"device": {"h2d_gbps": 0, "d2h_gbps": 0.01}}})")), "")
      << "0 (unmodeled) and the slowest modeled link are accepted";
  EXPECT_NE(error_of(json::parse(R"({"strata": {"device": {"latency_us": 6e7}}})")).find("strata.device.latency_us"),
            std::string::npos);
  const std::string crawl = error_of(json::parse(R"({"strata": {"device": {"compute_tflops": 1e-6}}})"));
  EXPECT_NE(crawl.find("strata.device.compute_tflops"), std::string::npos) << crawl;
  EXPECT_NE(crawl.find("at least 0.001 TFLOPS"), std::string::npos) << crawl;
  EXPECT_EQ(error_of(json::parse(R"({"strata": {"device": {"compute_tflops": 0.001}}})")), "");
}

// strata.max_skipped_steps: "auto" leaves fp16's dynamic loss scaler room to back off from its
// initial scale; a static scale, bf16 and fp32 fail after 3 skipped steps in a row; 0 is refused.
TEST(Config, MaxSkippedStepsAutoFollowsThePrecision) {
  EXPECT_EQ(parse_train_config(json::object(), "t").strata.max_skipped_steps, 3);
  EXPECT_EQ(parse_train_config(json::parse(R"({"bf16": {"enabled": true}})"), "t").strata.max_skipped_steps, 3);
  EXPECT_EQ(parse_train_config(json::parse(R"({"fp16": {"enabled": true}})"), "t").strata.max_skipped_steps,
            16 + 2 + 3);
  EXPECT_EQ(parse_train_config(json::parse(R"({"fp16": {"enabled": true, "initial_scale_power": 20, "hysteresis": 4}})"),
                               "t")
                .strata.max_skipped_steps,
            20 + 4 + 3);
  EXPECT_EQ(parse_train_config(json::parse(R"({"fp16": {"enabled": true, "loss_scale": 128}})"), "t")
                .strata.max_skipped_steps,
            3);
  EXPECT_EQ(parse_train_config(json::parse(R"({"strata": {"max_skipped_steps": "auto"}})"), "t").strata.max_skipped_steps,
            3);
  EXPECT_EQ(parse_train_config(json::parse(R"({"strata": {"max_skipped_steps": 50}})"), "t").strata.max_skipped_steps,
            50);
  EXPECT_NE(error_of(json::parse(R"({"strata": {"max_skipped_steps": 0}})")).find("strata.max_skipped_steps"),
            std::string::npos);
}

TEST(Config, UnsupportedDeepSpeedKeySaysSo) {
  const std::string msg = error_of(json::parse(R"({"zero_optimization": {"zero_quantized_weights": true}})"));
  EXPECT_NE(msg.find("not supported by Strata"), std::string::npos) << msg;
  EXPECT_NE(msg.find("quantized"), std::string::npos) << msg;
  EXPECT_NE(error_of(json::parse(R"({"aio": {"use_gds": true}})")).find("GPUDirect"), std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"pipeline": {}})")).find("not supported"), std::string::npos);
}

TEST(Config, ConsistencyChecks) {
  EXPECT_NE(error_of(json::parse(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})")).find("at most one"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"zero_optimization": {"offload_param": {"device": "cpu"}}})")).find("stage 3"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})"))
                .find("nvme_path"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"strata": {"exact": true}, "bf16": {"enabled": true}})")).find("exact"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"strata": {"checkpoint": {"interval_steps": 5}}})")).find("strata.checkpoint.dir"),
            std::string::npos);
}

TEST(Config, AutoOffloadAndTheHostBudget) {
  const TrainConfig d = parse_train_config(json::object(), "test.json");
  EXPECT_TRUE(d.strata.offload.host_budget_auto);
  EXPECT_EQ(d.strata.offload.host_budget_bytes, 0u);
  const TrainConfig c = parse_train_config(json::parse(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "auto"}, "offload_param": {"device": "auto", "nvme_path": "/nvme"}},
      "strata": {"offload": {"host_budget": "2GiB"}}})"),
                                           "test.json");
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::Auto);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::Auto);
  EXPECT_FALSE(c.strata.offload.host_budget_auto);
  EXPECT_EQ(c.strata.offload.host_budget_bytes, 2ull << 30);
  EXPECT_TRUE(parse_train_config(json::parse(R"({"strata": {"offload": {"host_budget": "auto"}}})"), "t")
                  .strata.offload.host_budget_auto);
  EXPECT_NE(error_of(json::parse(R"({"strata": {"offload": {"host_budget": "4KiB"}}})")).find("at least 1.00 MiB"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"strata": {"offload": {"host_budget": "lots"}}})")).find("strata.offload.host_budget"),
            std::string::npos);
  // "auto" is an offload like "cpu": it needs stage 1-3, and stage 3 for the parameters.
  EXPECT_NE(error_of(json::parse(R"({"zero_optimization": {"offload_optimizer": {"device": "auto"}}})")).find("stage"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "auto"},
      "offload_param": {"device": "auto"}}})")).find("stage 3"),
            std::string::npos);
}

// Every accepted DeepSpeed key either acts or is listed, with its reason, for one warning at startup.
TEST(Config, IgnoredKeysAreListedWithReasons) {
  const json j = json::parse(R"({
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8, "allgather_bucket_size": "auto",
      "overlap_comm": true, "contiguous_gradients": true, "stage3_max_reuse_distance": 1e9,
      "offload_optimizer": {"device": "cpu", "pipeline_read": true},
      "offload_param": {"device": "nvme", "nvme_path": "/tmp/a", "max_in_cpu": 1e9}},
    "aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 1, "single_submit": false,
            "overlap_events": true},
    "wall_clock_breakdown": false
  })");
  const TrainConfig c = parse_train_config(j, "test.json");
  std::map<std::string, std::string> reasons;
  for (const IgnoredKey& k : c.ignored_keys) {
    EXPECT_TRUE(reasons.emplace(k.key_path, k.reason).second) << "listed twice: " << k.key_path;
    EXPECT_GT(k.reason.size(), 20u) << k.key_path << ": " << k.reason;
  }
  const std::vector<std::string> expected = {
      "zero_optimization.reduce_bucket_size", "zero_optimization.allgather_bucket_size",
      "zero_optimization.overlap_comm", "zero_optimization.contiguous_gradients",
      "zero_optimization.stage3_max_reuse_distance", "zero_optimization.offload_param.max_in_cpu",
      "zero_optimization.offload_optimizer.pipeline_read", "aio.block_size", "aio.thread_count",
      "aio.single_submit", "aio.overlap_events", "wall_clock_breakdown"};
  EXPECT_EQ(reasons.size(), expected.size());
  for (const auto& key : expected) EXPECT_EQ(reasons.count(key), 1u) << key << " is not listed";
  EXPECT_NE(reasons["zero_optimization.reduce_bucket_size"].find("the group is the bucket"), std::string::npos);
  EXPECT_NE(reasons["aio.block_size"].find("4 MiB"), std::string::npos) << reasons["aio.block_size"];
  EXPECT_NE(reasons["aio.thread_count"].find("io_uring"), std::string::npos);
  EXPECT_EQ(c.aio.queue_depth, 8);  // a key beside them still acts
}

TEST(Config, NoIgnoredKeysWhenNoneAreWritten) {
  EXPECT_TRUE(parse_train_config(json::object(), "test.json").ignored_keys.empty());
  const json j = json::parse(R"({
    "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 5e7, "sub_group_size": 1e8,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/a", "buffer_count": 4}},
    "aio": {"queue_depth": 16, "engine": "threads"},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}
  })");
  EXPECT_TRUE(parse_train_config(j, "test.json").ignored_keys.empty());
}

TEST(Config, IgnoredKeysAreStillRangeChecked) {
  EXPECT_NE(error_of(json::parse(R"({"zero_optimization": {"reduce_bucket_size": -1}})")).find("reduce_bucket_size"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"zero_optimization": {"overlap_comm": "yes"}})")).find("true or false"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"aio": {"thread_count": 0}})")).find("out of range"), std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"aio": {"single_submit": 1}})")).find("aio.single_submit"), std::string::npos);
}

// DeepSpeed's "Adam" is AdamW unless adam_w_mode is false; an explicit adam_w_mode: true gives AdamW.
TEST(Config, AdamWModeActsOnAdam) {
  const auto parse = [](const char* text) { return parse_train_config(json::parse(text), "test.json"); };
  EXPECT_EQ(parse(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": true}}})").optimizer.type, "AdamW");
  const TrainConfig plain = parse(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})");
  EXPECT_EQ(plain.optimizer.type, "Adam");
  EXPECT_TRUE(plain.ignored_keys.empty());
  const TrainConfig adamw = parse(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})");
  EXPECT_EQ(adamw.optimizer.type, "AdamW");
  ASSERT_EQ(adamw.ignored_keys.size(), 1u);
  EXPECT_EQ(adamw.ignored_keys[0].key_path, "optimizer.params.adam_w_mode");
}

TEST(Config, OverridesSetNestedValues) {
  json root = json::parse(R"({"zero_optimization": {"stage": 1}})");
  apply_override(root, "zero_optimization.stage=3");
  apply_override(root, "strata.device.memory=64MiB");
  apply_override(root, "bf16.enabled=true");
  apply_override(root, "zero_optimization.offload_optimizer.nvme_path=[\"/a\",\"/b\"]");
  EXPECT_EQ(root["zero_optimization"]["stage"], 3);
  EXPECT_EQ(root["strata"]["device"]["memory"], "64MiB");
  EXPECT_EQ(root["bf16"]["enabled"], true);
  EXPECT_EQ(root["zero_optimization"]["offload_optimizer"]["nvme_path"].size(), 2u);
}

TEST(Config, BadOverridesAreRejected) {
  json root = json::parse(R"({"zero_optimization": {"stage": 1}})");
  EXPECT_THROW(apply_override(root, "novalue"), ConfigError);
  EXPECT_THROW(apply_override(root, "=3"), ConfigError);
  EXPECT_THROW(apply_override(root, "zero_optimization..stage=3"), ConfigError);
  try {
    apply_override(root, "zero_optimization.stage.x=1");
    FAIL() << "crossing a number must fail";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not an object"), std::string::npos) << e.what();
  }
}

TEST(Config, LoadFileReportsMissingFileAndBadJsonWithLine) {
  try {
    load_train_config("/nonexistent/strata.json", {});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/strata.json"), std::string::npos);
  }
  const std::string path = testing::TempDir() + "/bad_config.json";
  {
    std::ofstream out(path);
    out << "{\n  \"zero_optimization\": {\n    \"stage\": 3,\n  }\n}\n";
  }
  try {
    load_train_config(path, {});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("line 4"), std::string::npos) << e.what();
  }
  {
    std::ofstream out(path);
    out << "{\"zero_optimization\": {\"stage\": 1}}\n";
  }
  const TrainConfig c = load_train_config(path, {"zero_optimization.stage=2"});
  EXPECT_EQ(c.zero.stage, 2);
  std::remove(path.c_str());
}

// Found by tests/fuzz: a number beyond double's range was nlohmann's out_of_range (not a
// ConfigError), a --set value that is not UTF-8 threw json::type_error when a message quoted it, and a
// file holding `null` was accepted as the defaults. Deep nesting is refused before a copy or dump of
// the config can recurse through it; huge integers are reported as they were written.
TEST(Config, HostileJsonIsAConfigError) {
  const std::string path = testing::TempDir() + "/hostile_config.json";
  const auto load_text = [&](const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
    return load_train_config(path, {});
  };
  const auto message = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "no ConfigError";
    return std::string();
  };
  EXPECT_NE(message([&] { load_text(R"({"gradient_clipping": 1e999})"); }).find("number overflow"), std::string::npos);
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_NE(message([&] { load_text(R"({"strata": {"model": )" + deep + "}}"); }).find("nested more than"),
            std::string::npos);
  EXPECT_NE(message([&] { load_text(R"({"steps_per_print": 18446744073709551615})"); })
                .find("18446744073709551615 is out of range"),
            std::string::npos);
  EXPECT_NE(message([&] { load_text(R"({"strata": {"offload": {"pinned_buffer": 1e308}}})"); })
                .find("expected a byte size"),
            std::string::npos);
  EXPECT_NE(message([&] { load_text("null"); }).find("must hold a JSON object"), std::string::npos);
  std::ofstream(path, std::ios::trunc) << "{}";
  EXPECT_NE(message([&] { load_train_config(path, {"optimizer.type=\xad\xff"}); }).find("not valid UTF-8"),
            std::string::npos);
  EXPECT_NE(message([&] { load_train_config(path, {"strata.model=" + deep}); }).find("nested more than"),
            std::string::npos);
  // A value that is not JSON is still a plain string, and "1e999" is one.
  EXPECT_NE(message([&] { load_train_config(path, {"gradient_clipping=1e999"}); }).find("expected a number"),
            std::string::npos);
  std::remove(path.c_str());
}

TEST(Config, EditDistance) {
  EXPECT_EQ(edit_distance("stage", "stage"), 0u);
  EXPECT_EQ(edit_distance("stgae", "stage"), 2u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
}

}  // namespace
}  // namespace strata
