// Parsing of the training config (see config/config.h).
#include "config/config.h"

#include <cerrno>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/file_io.h"
#include "config/config_reader.h"
#include "config/json_input.h"
#include "offload/io_engine.h"

namespace strata {

StrataConfig parse_strata(ConfigReader r);  // config/config_strata.cc

namespace {

constexpr std::uint64_t kMaxCount = std::uint64_t{1} << 60;

// DeepSpeed keys Strata accepts with DeepSpeed's type and range but without effect: the value is
// checked, then the key is reported once at startup with `reason` (IgnoredKey).
// `same_as`: the value (DeepSpeed's default, or what Strata does anyway) about which nothing is
// said at startup.
void ignored_count(ConfigReader& r, std::string_view key, std::uint64_t min, std::string_view reason,
                   const nlohmann::json& same_as = nullptr) {
  std::uint64_t unused = 0;
  r.get_count(key, &unused, min, kMaxCount);
  r.ignored(key, reason, same_as);
}

void ignored_bool(ConfigReader& r, std::string_view key, std::string_view reason,
                  const nlohmann::json& same_as = nullptr) {
  bool unused = false;
  r.get_bool(key, &unused);
  r.ignored(key, reason, same_as);
}

OffloadConfig parse_offload(ConfigReader r, bool is_param) {
  OffloadConfig c;
  std::string device = "none";
  r.get_choice("device", &device, {"none", "cpu", "nvme", "auto"});
  c.device = device == "cpu"    ? OffloadDevice::Cpu
             : device == "nvme" ? OffloadDevice::Nvme
             : device == "auto" ? OffloadDevice::Auto
                                : OffloadDevice::None;
  r.get_string_list("nvme_path", &c.nvme_paths);
  r.get_bool("pin_memory", &c.pin_memory);
  r.get_int("buffer_count", &c.buffer_count, 1, 1024);
  if (is_param) {
    r.get_count("buffer_size", &c.buffer_size_elems, 1, kMaxCount);
    ignored_count(r, "max_in_cpu", 0,
                  "parameters offloaded to NVMe are not cached in host memory: a gather reads the shard into one of "
                  "offload_param.buffer_count pinned slots and uploads it to the device from there",
                  1e9);
  } else {
    const char* pipelined = "the optimizer step is always a pipeline over chunks that reads ahead and writes behind "
                            "(Note [Chunk pipeline], engine/offload_tier.h)";
    r.ignored("pipeline_read", pipelined, true);
    r.ignored("pipeline_write", pipelined, true);
    r.ignored("fast_init", "Strata has one way to initialize offloaded state: each chunk is written to the swap file "
                           "once, through one staging buffer", false);
    r.unsupported("ratio", "partial optimizer offload is not implemented; offload all of it or none", 1.0);
  }
  if (c.device == OffloadDevice::Nvme && c.nvme_paths.empty()) {
    r.fail("nvme_path", "device is \"nvme\" but no nvme_path is given; set it to a directory on a local NVMe drive "
                        "(or a list of directories, one per drive)");
  }
  for (const auto& p : c.nvme_paths) {
    if (p.empty()) r.fail("nvme_path", "an empty directory name; give the directory that holds the swap files");
  }
  r.finish();
  return c;
}

// Note [Auto values]: the Hugging Face Trainer writes "auto" into DeepSpeed configs and fills the
// values in before DeepSpeed reads them. Strata resolves each one itself, as the Trainer would where
// that is defined (its defaults: lr 5e-5, betas [0.9, 0.999], eps 1e-8, weight decay 0, clipping
// 1.0, no warmup; the batch sizes from each other and the world, resolve_batch_sizes; the total
// steps from --steps, resolve_step_autos), else Strata's default, and prints every resolution in
// one block at startup (log_resolved_auto); each can be overridden with --set.
void resolve_auto_default(ConfigReader& r, std::string_view key, std::string value) {
  if (r.is_auto(key)) {
    r.resolved(key, std::move(value), "Strata's default: the Trainer's value comes from the model's hidden size");
  }
}

// DeepSpeed's old booleans (zero/config.py still translates them): cpu_offload: true is
// offload_optimizer.device "cpu", cpu_offload_params: true is offload_param.device "cpu",
// cpu_offload_use_pin_memory is both sections' pin_memory. false is accepted without a word.
void translate_cpu_offload(ConfigReader& r) {
  const auto flag = [&](const char* key, const char* section, const char* field, const char* value) {
    nlohmann::json v;
    r.get_raw(key, &v);
    if (v.is_null()) return;
    if (!v.is_boolean()) r.fail(key, fmt::format("expected true or false, found {}", json_excerpt(v)));
    if (v.get<bool>()) r.translate(key, section, field, value);
  };
  flag("cpu_offload", "offload_optimizer", "device", "cpu");
  flag("cpu_offload_params", "offload_param", "device", "cpu");
  nlohmann::json pin;
  r.get_raw("cpu_offload_use_pin_memory", &pin);
  if (!pin.is_null()) {
    if (!pin.is_boolean()) r.fail("cpu_offload_use_pin_memory", "expected true or false");
    r.translate("cpu_offload_use_pin_memory", "offload_optimizer", "pin_memory", pin);
    r.translate("cpu_offload_use_pin_memory", "offload_param", "pin_memory", pin);
  }
}

// zero_optimization's DeepSpeed fields that Strata reads and ignores (saying why) or refuses.
void ignore_zero_fields(ConfigReader& r) {
  ignored_count(r, "stage3_max_reuse_distance", 0,
                "a released group stays gathered when its next use falls inside the prefetch window "
                "(stage3_prefetch_bucket_size, stage3_max_live_parameters); there is no separate reuse distance",
                1e9);
  ignored_count(r, "reduce_bucket_size", 0,
                "gradients are reduced per param group (a transformer block, the embedding, the head) as soon as the "
                "group's gradients are final: the group is the bucket",
                5e8);
  ignored_count(r, "allgather_bucket_size", 0,
                "weights are gathered per param group (stage 3: before use; stages 1-2: after the step): the group is "
                "the bucket",
                5e8);
  ignored_bool(r, "overlap_comm",
               "gathers and gradient reductions always run on the engine's own communication stream, ordered by "
               "events, while the model computes",
               true);
  ignored_bool(r, "contiguous_gradients", "each param group's gradients always live in one flat buffer", true);
  r.ignored("reduce_scatter", "stages 2 and 3 always reduce-scatter the gradients, stages 0 and 1 all-reduce them",
            true);
  r.ignored("allgather_partitions", "updated weights are always gathered with one all-gather per param group", true);
  r.ignored("use_multi_rank_bucket_allreduce", "gradients are reduced per param group, one collective each", true);
  r.ignored("load_from_fp32_weights", "a checkpoint always restores the fp32 master weights", true);
  r.ignored("round_robin_gradients",
            "offloaded gradients leave the device per param group as soon as they are reduced, on a transfer stream "
            "while backward goes on (Note [Offload], engine/zero_engine.h)",
            false);
  r.ignored("stage3_gather_16bit_weights_on_model_save", "--save-weights always gathers the full fp32 weights");
  r.ignored("ignore_unused_parameters",
            "a param group without a gradient in a micro-batch counts as a zero gradient, never as an error", true);
  r.ignored("elastic_checkpoint", "checkpoints always reshard: --resume takes any world size and sharding factor");
  r.ignored("memory_efficient_linear",
            "it selects DeepSpeed's implementation of torch's linear layer; Strata's models have their own", true);
  r.ignored("stage3_model_persistence_threshold",
            "small groups stay gathered by stage3_param_persistence_threshold alone");
  r.ignored("stage3_module_granularity_threshold", "Strata's param groups are its models' blocks", 0);
  r.ignored("stage3_use_all_reduce_for_fetch_params", "stage 3 gathers weights with an all-gather", false);
  r.ignored("legacy_stage1", "Strata has one stage 1", false);
  r.ignored("pipeline_loading_checkpoint", "checkpoints load as a whole before the first step", false);
  r.ignored("override_module_apply", "Strata's models are not torch modules", true);
  r.ignored("log_trace_cache_warnings", "a changed acquisition order is logged at debug level", false);
  r.unsupported("zero_hpz_partition_size", "use mics_shard_size for hybrid sharding", 1);
  r.unsupported("zero_quantized_weights", "quantized communication is not implemented");
  r.unsupported("zero_quantized_nontrainable_weights", "quantized communication is not implemented");
  r.unsupported("zero_quantized_gradients", "quantized communication is not implemented");
  r.unsupported("zeropp_loco_param", "quantized communication is not implemented");
  r.unsupported("mics_hierarchical_params_gather", "hierarchical gathers are not implemented");
  r.unsupported("offload_param_ratio", "partial parameter offload is not implemented", 1.0);
}

// Which offload each stage allows.
void check_zero_offload(ConfigReader& r, const ZeroConfig& z) {
  if (z.offload_param.device != OffloadDevice::None && z.stage != 3) {
    r.fail("offload_param", fmt::format("parameter offload needs stage 3 (stage is {}); set zero_optimization.stage=3",
                                        z.stage));
  }
  if (z.offload_param.device != OffloadDevice::None && z.offload_optimizer.device == OffloadDevice::None) {
    r.fail("offload_param", "parameter offload needs the optimizer state offloaded too (its updates write the "
                            "offloaded weights); set zero_optimization.offload_optimizer.device to \"cpu\", \"nvme\" or "
                            "\"auto\"");
  }
  if (z.offload_optimizer.device != OffloadDevice::None && z.stage == 0) {
    r.fail("offload_optimizer", "optimizer offload needs ZeRO stage 1, 2 or 3; set zero_optimization.stage");
  }
}

ZeroConfig parse_zero(ConfigReader r) {
  ZeroConfig z;
  // DeepSpeed's other names (zero/config.py: field names beside the stage3_ aliases; old forms).
  r.alias("max_live_parameters", "stage3_max_live_parameters");
  r.alias("prefetch_bucket_size", "stage3_prefetch_bucket_size");
  r.alias("param_persistence_threshold", "stage3_param_persistence_threshold");
  r.alias("max_reuse_distance", "stage3_max_reuse_distance");
  r.alias("gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save");
  r.alias("stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save");
  translate_cpu_offload(r);
  r.get_int("stage", &z.stage, 0, 3);
  resolve_auto_default(r, "stage3_max_live_parameters", std::to_string(z.max_live_parameters_elems));
  resolve_auto_default(r, "stage3_prefetch_bucket_size", std::to_string(z.prefetch_bucket_size_elems));
  resolve_auto_default(r, "stage3_param_persistence_threshold", std::to_string(z.param_persistence_threshold_elems));
  z.offload_param = parse_offload(r.section("offload_param"), /*is_param=*/true);
  z.offload_optimizer = parse_offload(r.section("offload_optimizer"), /*is_param=*/false);
  // 0: the smallest chunks (one optimizer block; DeepSpeed: a sub-group per parameter).
  r.get_count("sub_group_size", &z.sub_group_size_elems, 0, kMaxCount);
  r.get_count("stage3_max_live_parameters", &z.max_live_parameters_elems, 0, kMaxCount);
  r.get_count("stage3_prefetch_bucket_size", &z.prefetch_bucket_size_elems, 0, kMaxCount);
  r.get_count("stage3_param_persistence_threshold", &z.param_persistence_threshold_elems, 0, kMaxCount);
  // DeepSpeed's -1 (its default) is no hybrid sharding, as 0 here.
  {
    std::int64_t mics = z.sharding_factor;
    r.get_int("mics_shard_size", &mics, -1, 1 << 20);
    z.sharding_factor = mics < 0 ? 0 : static_cast<int>(mics);
  }
  ignore_zero_fields(r);
  if (r.has("aio")) r.fail("aio", "\"aio\" is a top-level section of the config, beside zero_optimization; move it there");
  r.finish();
  check_zero_offload(r, z);
  return z;
}

AioConfig parse_aio(ConfigReader r) {
  AioConfig a;
  r.get_int("queue_depth", &a.queue_depth, 1, 4096);
  r.get_choice("engine", &a.engine, {"auto", "io_uring", "threads"});
  std::uint64_t block_size_bytes = 0;
  r.get_bytes("block_size", &block_size_bytes, 4096);
  if (block_size_bytes % 4096 != 0) r.fail("block_size", "must be a multiple of 4096 bytes (O_DIRECT alignment)");
  r.ignored("block_size", fmt::format("kernel requests are sized by Strata's measured defaults: reads up to {} MiB, "
                                      "writes up to {} MiB, adjacent requests merged up to those sizes (Note "
                                      "[Request size and merging], offload/uring_engine.cc)",
                                      offload::kDefaultMaxReadRequestBytes >> 20,
                                      offload::kDefaultMaxWriteRequestBytes >> 20));
  // Request sizes a drive was tuned to (`strata bench io --tune`): whole 4 KiB pages, at most 64 MiB.
  for (auto [key, out] : {std::pair{"request_size", &a.request_bytes}, std::pair{"write_request_size", &a.write_request_bytes}}) {
    r.get_bytes(key, out, 4096);
    if (*out % 4096 != 0 || *out > (std::uint64_t{64} << 20)) {
      r.fail(key, "must be a multiple of 4096 bytes (O_DIRECT alignment) and at most 64 MiB");
    }
  }
  int thread_count = 1;
  r.get_int("thread_count", &thread_count, 1, 256);
  r.ignored("thread_count", "the io_uring engine needs no submitting threads (one engine thread owns the ring); the "
                            "thread-pool fallback (aio.engine=threads) runs min(aio.queue_depth, 16) workers");
  ignored_bool(r, "single_submit",
               "the io_uring engine always submits one request per system call, so the block layer's plug does not "
               "merge requests behind its back (Note [Request size and merging], offload/uring_engine.cc)");
  ignored_bool(r, "overlap_events",
               "up to aio.queue_depth requests are always in flight, and their completions are reaped as they come");
  r.unsupported("use_gds", "GPUDirect Storage is not implemented; NVMe data goes through pinned host buffers");
  r.finish();
  return a;
}

OptimizerConfig parse_optimizer(ConfigReader r) {
  OptimizerConfig o;
  {
    std::string type;
    r.get_string("type", &type);
    for (const char* ds : {"Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Adagrad", "MuAdam", "MuAdamW", "MuSGD",
                           "FusedAdam", "CPUAdam"}) {
      if (type == ds) {
        r.fail("type", fmt::format("DeepSpeed's {} is not implemented in Strata; the optimizers here are AdamW, Adam, "
                                   "SGD and Lion",
                                   type));
      }
    }
  }
  r.get_choice("type", &o.type, {"AdamW", "Adam", "SGD", "Lion", "adamw", "adam", "sgd", "lion"});
  if (o.type == "adamw") o.type = "AdamW";
  if (o.type == "adam") o.type = "Adam";
  if (o.type == "sgd") o.type = "SGD";
  if (o.type == "lion") o.type = "Lion";
  if (o.type == "Lion") {
    o.beta1 = 0.9;
    o.beta2 = 0.99;
  }
  ConfigReader p = r.section("params");
  o.lr_auto = p.is_auto("lr");
  p.get_double("lr", &o.lr, 0.0, 1e3);
  nlohmann::json betas;
  p.get_raw("betas", &betas);
  if (p.is_auto("betas")) {  // Note [Auto values]
    p.resolved("betas", fmt::format("[{}, {}]", o.beta1, o.beta2),
               o.type == "Lion" ? "Lion's defaults" : "the Hugging Face Trainer's adam_beta1 and adam_beta2");
  } else if (!betas.is_null()) {
    if (!betas.is_array() || betas.size() != 2 || !betas[0].is_number() || !betas[1].is_number()) {
      p.fail("betas", "expected two numbers [beta1, beta2], e.g. [0.9, 0.999]");
    }
    o.beta1 = betas[0].get<double>();
    o.beta2 = betas[1].get<double>();
    if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1)) {
      p.fail("betas", fmt::format("[{}, {}]: each beta must be in [0, 1)", o.beta1, o.beta2));
    }
  }
  p.get_double("eps", &o.eps, std::numeric_limits<double>::min(), 1.0);
  if (p.is_auto("eps")) p.resolved("eps", fmt::format("{}", o.eps), "the Hugging Face Trainer's adam_epsilon");
  p.get_double("weight_decay", &o.weight_decay, 0.0, 1e3);
  if (p.is_auto("weight_decay")) {
    p.resolved("weight_decay", fmt::format("{}", o.weight_decay), "the Hugging Face Trainer's weight_decay");
  }
  p.get_double("momentum", &o.momentum, 0.0, 0.999999);
  p.get_bool("bias_correction", &o.bias_correction);
  p.ignored("torch_adam", "Strata has one implementation of each optimizer (optim/: SIMD CPU kernels)");
  // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false; Strata's "Adam" is torch.optim.Adam
  // (weight decay added to the gradient), so only an explicit adam_w_mode: true changes the type.
  bool adam_w_mode = false;
  if (p.has("adam_w_mode") && o.type == "Adam") {
    p.get_bool("adam_w_mode", &adam_w_mode);
    if (adam_w_mode) o.type = "AdamW";
  } else {
    ignored_bool(p, "adam_w_mode",
                 o.type == "AdamW" ? "AdamW always decouples weight decay (DeepSpeed's AdamW too)"
                                   : "it applies to Adam only");
  }
  p.unsupported("amsgrad", "AMSGrad is not implemented");
  p.finish();
  r.unsupported("legacy_fusion", "not applicable");
  r.finish();
  return o;
}

SchedulerConfig parse_scheduler(ConfigReader r) {
  SchedulerConfig s;
  if (!r.has("type")) {
    r.finish();
    return s;
  }
  {
    std::string type;
    r.get_string("type", &type);
    if (type == "OneCycle" || type == "LRRangeTest") {
      r.fail("type", fmt::format("DeepSpeed's {} schedule is not implemented in Strata; the schedules here are WarmupLR, "
                                 "WarmupDecayLR and WarmupCosineLR (or none: a constant learning rate)",
                                 type));
    }
  }
  r.get_choice("type", &s.type, {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"});
  ConfigReader p = r.section("params");
  p.get_double("warmup_min_lr", &s.warmup_min_lr, 0.0, 1e3);
  if (p.is_auto("warmup_min_lr")) {  // Note [Auto values]
    s.warmup_min_lr = 0;
    p.resolved("warmup_min_lr", "0", "the Hugging Face Trainer's value");
  }
  s.warmup_max_lr_auto = p.is_auto("warmup_max_lr");  // the optimizer's lr, resolved by the caller
  p.get_double("warmup_max_lr", &s.warmup_max_lr, 0.0, 1e3);
  // 0 and 1 warm up over 2 steps, as DeepSpeed's schedules do (config/lr_schedule.cc).
  p.get_int("warmup_num_steps", &s.warmup_num_steps, 0, std::numeric_limits<std::int64_t>::max());
  if (p.is_auto("warmup_num_steps")) {
    s.warmup_num_steps = 0;
    p.resolved("warmup_num_steps", "0", "the Hugging Face Trainer's warmup_steps; DeepSpeed's schedules warm up over "
                                        "at least 2 steps");
  }
  s.total_num_steps_auto = p.is_auto("total_num_steps");
  p.get_int("total_num_steps", &s.total_num_steps, 0, std::numeric_limits<std::int64_t>::max());
  p.get_choice("warmup_type", &s.warmup_type, {"log", "linear"});
  p.get_double("cos_min_ratio", &s.cos_min_ratio, 0.0, 1.0);
  p.get_double("warmup_min_ratio", &s.warmup_min_ratio, 0.0, 1.0);
  p.ignored("last_batch_iteration", "the schedule's position is the training step (restored by --resume)");
  p.finish();
  if ((s.type == "WarmupDecayLR" || s.type == "WarmupCosineLR") && !s.total_num_steps_auto &&
      s.total_num_steps <= s.warmup_num_steps) {
    p.fail("total_num_steps", fmt::format("{} must exceed warmup_num_steps ({}) for {}", s.total_num_steps,
                                          s.warmup_num_steps, s.type));
  }
  r.finish();
  return s;
}

// The bf16 section: enabled (or "auto", resolved once strata.exact is known).
void parse_bf16(ConfigReader& r, bool* bf16, bool* bf16_auto) {
  ConfigReader b = r.section("bf16");
  *bf16_auto = b.is_auto("enabled");
  if (!*bf16_auto) b.get_bool("enabled", bf16);
  b.ignored("immediate_grad_update", "gradients are always reduced and accumulated per param group as soon as the "
                                     "group's backward is done");
  b.ignored("check_grad_overflow", "every step checks its gradient norm for non-finite values", true);
  b.unsupported("bf16_master_weights_and_grads", "the master weights are always fp32");
  b.unsupported("bf16_optimizer_states", "the optimizer states are always fp32");
  for (const char* scaling : {"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                              "consecutive_hysteresis", "min_loss_scale"}) {
    if (b.has(scaling)) {
      b.fail(scaling, "bf16 has no loss scaling (its range is fp32's); this key belongs in the fp16 section");
    }
  }
  b.finish();
}

// The fp16 section: enabled (or "auto") and the loss scaler's settings.
void parse_fp16(ConfigReader& r, TrainConfig& c, bool* fp16, bool* fp16_auto) {
  ConfigReader f = r.section("fp16");
  *fp16_auto = f.is_auto("enabled");
  if (!*fp16_auto) f.get_bool("enabled", fp16);
  f.get_double("loss_scale", &c.fp16.loss_scale, 0.0, 1e38);
  f.get_int("initial_scale_power", &c.fp16.initial_scale_power, 0, 127);
  f.get_int("loss_scale_window", &c.fp16.loss_scale_window, 1, 1 << 30);
  f.get_int("hysteresis", &c.fp16.hysteresis, 1, 1 << 20);
  f.get_bool("consecutive_hysteresis", &c.fp16.consecutive_hysteresis);
  f.get_double("min_loss_scale", &c.fp16.min_loss_scale, 0.0, 1e38);
  f.ignored("auto_cast", "the models take token ids and compute in the working dtype throughout; there is no "
                         "input to cast", false);
  f.unsupported("fp16_master_weights_and_grads", "the master weights are always fp32");
  f.finish();
}

void resolve_precision(TrainConfig& c, bool bf16, bool fp16, bool bf16_auto, bool fp16_auto) {
  // Precision (see Note [Auto values] above). Exact mode is fp32; otherwise bf16 (Strata's mixed precision on
  // the sim device and on every GPU it builds for, sm_80 and up), unless fp16 was asked for.
  if (bf16_auto) {
    bf16 = !c.strata.exact && !fp16;
    c.resolved_auto.push_back({"bf16.enabled", bf16 ? "true" : "false",
                               c.strata.exact ? "strata.exact is fp32 everywhere"
                               : fp16         ? "fp16.enabled is true"
                                              : "bf16 with fp32 master weights, Strata's mixed precision"});
  }
  if (fp16_auto) {
    c.resolved_auto.push_back({"fp16.enabled", "false",
                               c.strata.exact ? "strata.exact is fp32 everywhere"
                               : bf16         ? "bf16 is enabled"
                                              : "fp16 only when asked for, as the Hugging Face Trainer (--fp16)"});
  }
  c.precision = bf16 ? Precision::Bf16 : fp16 ? Precision::Fp16 : Precision::Fp32;
}

void resolve_learning_rate(TrainConfig& c) {
  // The learning rate and the schedule's peak, each from the other where one is "auto".
  if (c.optimizer.lr_auto) {
    const bool from_schedule = !c.scheduler.type.empty() && !c.scheduler.warmup_max_lr_auto &&
                               c.scheduler.type != "WarmupCosineLR";
    c.optimizer.lr = from_schedule ? c.scheduler.warmup_max_lr : 5e-5;
    c.resolved_auto.push_back({"optimizer.params.lr", fmt::format("{}", c.optimizer.lr),
                               from_schedule ? "scheduler.params.warmup_max_lr"
                                             : "the Hugging Face Trainer's learning_rate"});
  }
  if (c.scheduler.warmup_max_lr_auto) {
    c.scheduler.warmup_max_lr = c.optimizer.lr;
    c.resolved_auto.push_back({"scheduler.params.warmup_max_lr", fmt::format("{}", c.optimizer.lr),
                               "optimizer.params.lr"});
  }
}

// The top-level DeepSpeed fields that Strata reads and ignores (saying why) or refuses.
void ignore_top_level_fields(ConfigReader& r) {
  r.ignored("wall_clock_breakdown", "set strata.trace for a timeline of every stream; the summary prints tokens/s",
            false);
  r.ignored("zero_allow_untested_optimizer",
            "the optimizer always comes from the \"optimizer\" section; there is no client optimizer to allow");
  r.ignored("zero_force_ds_cpu_optimizer", "an offloaded optimizer always runs Strata's own SIMD CPU kernels", true);
  r.ignored("memory_breakdown", "the tier plan before the first step and the summary print the bytes per tier", false);
  r.ignored("dump_state", "the tier plan and the model line at startup show the configuration in effect", false);
  r.ignored("activation_checkpointing",
            "it configures deepspeed.checkpointing, which Strata's models do not call; Strata recomputes blocks in "
            "backward with strata.model.checkpoint_activations");
  // Monitors: switched on, they have no effect (nothing is lost: strata.metrics has the figures).
  const char* monitor = "Strata writes its metrics as JSON lines to strata.metrics, and strata.trace a timeline";
  for (const char* key : {"tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger"}) {
    r.ignored_section(key, monitor);
  }
  {
    ConfigReader d = r.section("data_types");
    std::string accum = "fp32";
    d.get_choice("grad_accum_dtype", &accum, {"fp32", "fp16", "bf16"});
    d.ignored("grad_accum_dtype",
              "gradients are summed across micro-batches in fp32 (the optimizer's side keeps fp32 sums)", "fp32");
    d.finish();
  }
  r.ignored("communication_data_type",
            "collectives carry the working dtype (fp32 in exact mode); the gradient sums across micro-batches are "
            "fp32 on the optimizer's side");
  const char* not_here = "it is not part of Strata";
  r.unsupported("amp", "use bf16 or fp16 (Strata has no apex/amp mode)");
  r.unsupported("pipeline", "set strata.parallel.pipeline (1F1B or GPipe pipeline parallelism) instead");
  r.unsupported("tensor_parallel", "set strata.parallel.tensor (Megatron 1D tensor parallelism) instead");
  r.unsupported("compression_training", not_here);
  r.unsupported("sparse_attention", not_here);
  r.unsupported("elasticity", not_here);
  r.unsupported("data_efficiency", not_here);
  r.unsupported("curriculum_learning", not_here);
  r.unsupported("autotuning", not_here);
  r.unsupported("prescale_gradients", "gradients are averaged after reduction");
  r.unsupported("gradient_predivide_factor", "gradients are averaged after reduction", 1.0);
  r.unsupported("sparse_gradients", not_here);
}

}  // namespace

std::string_view offload_device_name(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::None: return "none";
    case OffloadDevice::Cpu: return "cpu";
    case OffloadDevice::Nvme: return "nvme";
    case OffloadDevice::Auto: return "auto";
  }
  return "?";
}

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::Fp32: return "fp32";
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
  }
  return "?";
}

TrainConfig parse_train_config(const nlohmann::json& root, const std::string& source) {
  TrainConfig c;
  ConfigReader r(root, source, "", &c.ignored_keys, &c.resolved_auto, &c.accepted_keys);
  c.source = source;
  c.raw = root;
  // A number given fixes the batch triangle; absent or "auto" is derived (resolve_batch_sizes).
  const auto given = [&](const char* key) { return r.has(key) && !root[key].is_null() && !r.is_auto(key); };
  c.micro_batch_given = given("train_micro_batch_size_per_gpu");
  c.accumulation_given = given("gradient_accumulation_steps");
  c.micro_batch_auto = r.is_auto("train_micro_batch_size_per_gpu");
  c.accumulation_auto = r.is_auto("gradient_accumulation_steps");
  c.train_batch_size_auto = r.is_auto("train_batch_size");
  r.get_int("train_micro_batch_size_per_gpu", &c.micro_batch_size, 1, 1 << 20);
  r.get_int("gradient_accumulation_steps", &c.gradient_accumulation_steps, 1, 1 << 20);
  r.get_int("train_batch_size", &c.train_batch_size, 0, std::numeric_limits<std::int64_t>::max());
  r.get_double("gradient_clipping", &c.gradient_clipping, 0.0, 1e12);
  if (r.is_auto("gradient_clipping")) {  // Note [Auto values]
    c.gradient_clipping = 1.0;
    r.resolved("gradient_clipping", "1.0", "the Hugging Face Trainer's max_grad_norm");
  }
  r.get_int("steps_per_print", &c.steps_per_print, 1, 1 << 30);

  bool bf16 = false;
  bool fp16 = false;
  bool bf16_auto = false, fp16_auto = false;  // resolved once strata.exact is known
  r.alias("bfloat16", "bf16");  // DeepSpeed's legacy name
  parse_bf16(r, &bf16, &bf16_auto);
  parse_fp16(r, c, &fp16, &fp16_auto);
  if (bf16 && fp16) r.fail("fp16", "fp16.enabled and bf16.enabled are both true; enable at most one");

  c.zero = parse_zero(r.section("zero_optimization"));
  c.aio = parse_aio(r.section("aio"));
  c.optimizer = parse_optimizer(r.section("optimizer"));
  c.scheduler = parse_scheduler(r.section("scheduler"));
  c.strata = parse_strata(r.section("strata"));

  resolve_precision(c, bf16, fp16, bf16_auto, fp16_auto);
  resolve_learning_rate(c);

  ignore_top_level_fields(r);
  r.finish();

  if (c.strata.max_skipped_steps == 0) {  // "auto"
    const bool dynamic_scale = c.precision == Precision::Fp16 && c.fp16.loss_scale == 0;
    c.strata.max_skipped_steps = dynamic_scale ? c.fp16.initial_scale_power + c.fp16.hysteresis + 3 : 3;
  }
  if (c.strata.exact && c.precision != Precision::Fp32) {
    throw ConfigError(fmt::format("{}: strata.exact is true but {} is enabled; exact mode is fp32 everywhere: disable "
                                  "{}.enabled or set strata.exact=false",
                                  source, precision_name(c.precision), precision_name(c.precision)));
  }
  return c;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  // Through read_text_file, as every file read whole: a FIFO, device or directory is refused
  // saying what it is (a FIFO would block forever, /dev/zero never end).
  std::string text;
  try {
    text = read_text_file(path, "config file");
  } catch (const IoError& e) {
    if (e.errno_value() == ENOENT || e.errno_value() == EACCES) {
      throw ConfigError(fmt::format("config file '{}' cannot be opened: {}; pass an existing file with --config", path,
                                    errno_text(e.errno_value())));
    }
    throw ConfigError(fmt::format("--config: {}", e.what()));
  }
  return load_train_config_text(text, path, overrides);
}

TrainConfig load_train_config_text(const std::string& text, const std::string& path,
                                   const std::vector<std::string>& overrides) {
  JsonInputError error;
  std::optional<nlohmann::json> root = parse_json_input(text, JsonComments::Allow, &error);
  if (!root) {
    if (error.byte == 0) throw ConfigError(fmt::format("config file '{}' is not valid JSON: {}", path, error.message));
    throw ConfigError(fmt::format("config file '{}' is not valid JSON at {}: {}", path, json_error_place(text, error),
                                  error.message));
  }
  if (!root->is_object()) {
    throw ConfigError(fmt::format("config file '{}' must hold a JSON object {{...}}, found {}", path, root->type_name()));
  }
  for (const auto& o : overrides) apply_override(*root, o);
  return parse_train_config(*root, overrides.empty() ? path : fmt::format("{} (with --set)", path));
}

}  // namespace strata
