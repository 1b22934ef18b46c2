// DeepSpeed's config semantics for the keys it accepts (config/config.cc): a feature switched off is
// accepted without a word; a key without effect is listed, silently when its value is DeepSpeed's
// default or what Strata does anyway; other names and old forms are read as the current ones (and
// act); a feature switched on that Strata cannot honour is refused naming what to use.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "config/config.h"

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

namespace strata {
namespace {

// Everything parse_train_config keeps of the DeepSpeed keys, as text: two configs that differ here
// train differently.
std::string fingerprint(const TrainConfig& c) {
  const auto offload = [](const OffloadConfig& o) {
    return fmt::format("{}|{}|{}|{}|{}", offload_device_name(o.device), fmt::join(o.nvme_paths, ","), o.pin_memory,
                       o.buffer_count, o.buffer_size_elems);
  };
  const ZeroConfig& z = c.zero;
  const OptimizerConfig& o = c.optimizer;
  const SchedulerConfig& s = c.scheduler;
  return fmt::format(
      "{} {} {} {} {} {} | {} {} {} {} {} {} | {} {} {} {} {} {} {} {} {} | {} {} | {} {} {} {} {} {} {} {} {} | "
      "{} {} {} {} {} {} {} {} | {} {}",
      c.micro_batch_size, c.gradient_accumulation_steps, c.train_batch_size, c.gradient_clipping, c.steps_per_print,
      precision_name(c.precision), c.fp16.loss_scale, c.fp16.initial_scale_power, c.fp16.loss_scale_window,
      c.fp16.hysteresis, c.fp16.consecutive_hysteresis, c.fp16.min_loss_scale, z.stage, offload(z.offload_param),
      offload(z.offload_optimizer), z.sub_group_size_elems, z.max_live_parameters_elems, z.prefetch_bucket_size_elems,
      z.param_persistence_threshold_elems, z.sharding_factor, 0, c.aio.queue_depth, c.aio.engine, o.type, o.lr, o.beta1,
      o.beta2, o.eps, o.weight_decay, o.momentum, o.bias_correction, 0, s.type, s.warmup_min_lr, s.warmup_max_lr,
      s.warmup_num_steps, s.total_num_steps, s.warmup_type, s.warmup_min_ratio, s.cos_min_ratio, c.aio.request_bytes,
      c.aio.write_request_bytes);
}

// The context every row is set into: offloads on (so their keys are read with effect), a decaying
// schedule, the optimizer "Adam" (whose adam_w_mode acts).
json base_config() {
  return json::parse(R"({
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}},
    "optimizer": {"type": "Adam", "params": {}}
  })");
}

// A value other than the default (and other than DeepSpeed's) for every DeepSpeed key the parser
// reads. A key the parser reads that is missing here fails the test: add it, with its effect.
const std::map<std::string, json>& row_values() {
  static const std::map<std::string, json> rows = [] {
    std::map<std::string, json> m;
    for (const char* k : {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "steps_per_print"}) m[k] = 3;
    m["train_batch_size"] = 9;
    m["gradient_clipping"] = 0.5;
    m["bfloat16"] = json{{"enabled", true}};
    m["bf16.enabled"] = true;
    m["bf16.immediate_grad_update"] = true;
    m["bf16.check_grad_overflow"] = false;
    m["bf16.bf16_master_weights_and_grads"] = true;
    m["bf16.bf16_optimizer_states"] = true;
    m["fp16.enabled"] = true;
    m["fp16.loss_scale"] = 128;
    m["fp16.initial_scale_power"] = 8;
    m["fp16.loss_scale_window"] = 10;
    m["fp16.hysteresis"] = 5;
    m["fp16.consecutive_hysteresis"] = true;
    m["fp16.min_loss_scale"] = 4;
    m["fp16.auto_cast"] = true;
    m["fp16.fp16_master_weights_and_grads"] = true;
    const std::string z = "zero_optimization.";
    for (const char* k : {"max_live_parameters", "prefetch_bucket_size", "param_persistence_threshold",
                          "max_reuse_distance", "stage3_max_live_parameters", "stage3_prefetch_bucket_size",
                          "stage3_param_persistence_threshold", "stage3_max_reuse_distance", "sub_group_size",
                          "reduce_bucket_size", "allgather_bucket_size", "stage3_model_persistence_threshold",
                          "stage3_module_granularity_threshold"}) {
      m[z + k] = 12345;
    }
    for (const char* k : {"gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
                          "stage3_gather_16bit_weights_on_model_save", "round_robin_gradients", "elastic_checkpoint",
                          "stage3_use_all_reduce_for_fetch_params", "legacy_stage1", "pipeline_loading_checkpoint",
                          "log_trace_cache_warnings", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
                          "zero_quantized_gradients", "mics_hierarchical_params_gather"}) {
      m[z + k] = true;
    }
    for (const char* k : {"overlap_comm", "contiguous_gradients", "reduce_scatter", "allgather_partitions",
                          "use_multi_rank_bucket_allreduce", "load_from_fp32_weights", "ignore_unused_parameters",
                          "memory_efficient_linear", "override_module_apply"}) {
      m[z + k] = false;
    }
    m[z + "cpu_offload"] = true;  // with the section set to "cpu" already: acts through it (same value)
    m[z + "cpu_offload_params"] = true;
    m[z + "cpu_offload_use_pin_memory"] = false;
    m[z + "stage"] = 2;
    m[z + "mics_shard_size"] = 2;
    m[z + "zero_hpz_partition_size"] = 4;
    m[z + "zeropp_loco_param"] = json{{"err_beta", 0.8}};
    m[z + "offload_param_ratio"] = 0.5;
    for (const char* s : {"offload_param.", "offload_optimizer."}) {
      m[z + s + "device"] = "auto";  // "nvme" would need nvme_path too
      m[z + s + "nvme_path"] = "/nvme-row";
      m[z + s + "pin_memory"] = false;
      m[z + s + "buffer_count"] = 7;
    }
    m[z + "offload_param.buffer_size"] = 777;
    m[z + "offload_param.max_in_cpu"] = 5;
    m[z + "offload_optimizer.pipeline_read"] = true;
    m[z + "offload_optimizer.pipeline_write"] = true;
    m[z + "offload_optimizer.fast_init"] = true;
    m[z + "offload_optimizer.ratio"] = 0.3;
    m["aio.queue_depth"] = 7;
    m["aio.engine"] = "threads";
    m["aio.request_size"] = 262144;
    m["aio.write_request_size"] = 131072;
    m["aio.block_size"] = 8192;
    m["aio.thread_count"] = 4;
    m["aio.single_submit"] = true;
    m["aio.overlap_events"] = false;
    m["aio.use_gds"] = true;
    m["optimizer.type"] = "SGD";
    m["optimizer.legacy_fusion"] = true;
    m["optimizer.params.lr"] = 0.25;
    m["optimizer.params.betas"] = json::array({0.5, 0.6});
    m["optimizer.params.eps"] = 1e-3;
    m["optimizer.params.weight_decay"] = 0.3;
    m["optimizer.params.momentum"] = 0.5;
    m["optimizer.params.bias_correction"] = false;
    m["optimizer.params.torch_adam"] = true;
    m["optimizer.params.adam_w_mode"] = true;
    m["optimizer.params.amsgrad"] = true;
    m["scheduler.type"] = "WarmupLR";
    m["scheduler.params.warmup_min_lr"] = 0.01;
    m["scheduler.params.warmup_max_lr"] = 0.2;
    m["scheduler.params.warmup_num_steps"] = 20;
    m["scheduler.params.total_num_steps"] = 200;
    m["scheduler.params.warmup_type"] = "linear";
    m["scheduler.params.cos_min_ratio"] = 0.5;
    m["scheduler.params.warmup_min_ratio"] = 0.5;
    m["scheduler.params.last_batch_iteration"] = 5;
    for (const char* k : {"wall_clock_breakdown", "zero_allow_untested_optimizer", "memory_breakdown", "dump_state",
                          "prescale_gradients", "sparse_gradients"}) {
      m[k] = true;
    }
    m["zero_force_ds_cpu_optimizer"] = false;
    m["gradient_predivide_factor"] = 4.0;
    m["communication_data_type"] = "fp16";
    m["data_types.grad_accum_dtype"] = "bf16";
    m["activation_checkpointing"] = json{{"partition_activations", true}};
    for (const char* k : {"tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger", "amp",
                          "compression_training", "sparse_attention", "elasticity", "data_efficiency",
                          "curriculum_learning", "autotuning"}) {
      m[k] = json{{"enabled", true}};
    }
    m["pipeline"] = json{{"stages", 2}};
    m["tensor_parallel"] = json{{"autotp_size", 2}};
    return m;
  }();
  return rows;
}

void set_path(json& root, const std::string& path, const json& value) {
  json* node = &root;
  std::size_t start = 0;
  for (;;) {
    const std::size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (dot == std::string::npos) {
      (*node)[part] = value;
      return;
    }
    if (!node->contains(part) || !(*node)[part].is_object()) (*node)[part] = json::object();
    node = &(*node)[part];
    start = dot + 1;
  }
}

// No accepted key is dropped: every DeepSpeed key the parser reads, given a value of its own,
// changes what is kept (it acts), or is listed (without effect, or read as another key), or is
// refused naming the key.
TEST(ConfigCompat, EveryAcceptedKeyActsIsListedOrIsRefused) {
  std::vector<std::string> accepted;
  for (const json& j : {json::object(), base_config()}) {
    for (const std::string& k : parse_train_config(j, "t.json").accepted_keys) {
      if (k.rfind("strata", 0) != 0 && std::find(accepted.begin(), accepted.end(), k) == accepted.end()) {
        accepted.push_back(k);
      }
    }
  }
  const std::string reference = fingerprint(parse_train_config(base_config(), "t.json"));
  int acts = 0, listed_only = 0, refused = 0;
  for (const std::string& key : accepted) {
    const bool section = std::any_of(accepted.begin(), accepted.end(),
                                     [&](const std::string& k) { return k.rfind(key + ".", 0) == 0; });
    if (section) continue;  // its keys are the rows
    const auto row = row_values().find(key);
    if (row == row_values().end()) {
      ADD_FAILURE() << key << " is read by the parser but has no row here: add one, with a value of its own";
      continue;
    }
    json j = base_config();
    set_path(j, key, row->second);
    try {
      const TrainConfig c = parse_train_config(j, "t.json");
      const bool changed = fingerprint(c) != reference;
      // Listed: on the startup line, or (silent: its value is DeepSpeed's default or what Strata does
      // anyway, as pipeline_read, which Strata always does) with its reason at debug level.
      const bool reported = std::any_of(c.ignored_keys.begin(), c.ignored_keys.end(),
                                        [&](const IgnoredKey& k) { return k.key_path == key; });
      EXPECT_TRUE(changed || reported) << key << " = " << row->second.dump() << " was accepted, did nothing, and was "
                                       << "not listed";
      acts += changed;
      listed_only += !changed && reported;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << key << ": " << e.what();
      ++refused;
    }
  }
  EXPECT_GT(acts, 40);
  EXPECT_GT(listed_only, 30);
  EXPECT_GT(refused, 10);
  RecordProperty("acts", acts);
  RecordProperty("listed", listed_only);
  RecordProperty("refused", refused);
}

}  // namespace
}  // namespace strata
