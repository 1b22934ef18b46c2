// The training config: a DeepSpeed-style JSON (README.md, "Using it") plus a
// `strata` section, parsed into typed, validated structs.
//
// Units follow DeepSpeed where DeepSpeed has the key: stage3_* sizes, sub_group_size and bucket
// sizes are element counts (suffix _elems); aio.block_size and the strata.* sizes are bytes.
// Unknown keys fail with the nearest known key; DeepSpeed features that Strata does not support
// fail, when switched on, saying so (config/config_reader.h). DeepSpeed keys that Strata accepts
// but that have no effect (bucket sizes, overlap_comm, aio.block_size, ...) are range-checked like
// the others, not kept, and listed in TrainConfig::ignored_keys with the reason, for one warning
// line at startup (log_ignored_keys; silent at DeepSpeed's default); other names and old forms are
// read as the current ones. "auto" is resolved as the Hugging Face Trainer would (Note [Auto
// values], config/config.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config_reader.h"

namespace strata {

// "auto" (a Strata extension): the fastest tier that holds the state, spilled chunk by chunk to the
// next (Note [Spill across tiers] in plan/run_plan.cc).
enum class OffloadDevice { None, Cpu, Nvme, Auto };
enum class DeviceChoice { Auto, Sim, Cuda };
// The transport of a multi-rank run (strata.parallel.communicator): auto is NCCL on cuda and MPI on
// sim; mpi on cuda stages device buffers through pinned host memory so that ranks may share a GPU
// (Note [Staged MPI], comm/comm_staged.cc); nccl needs the cuda device.
enum class CommunicatorChoice { Auto, Mpi, Nccl };
enum class Precision { Fp32, Bf16, Fp16 };

struct OffloadConfig {
  OffloadDevice device = OffloadDevice::None;
  std::vector<std::string> nvme_paths;  // nvme_path: one directory per drive; striped over all
  bool pin_memory = true;
  int buffer_count = 4;
  std::uint64_t buffer_size_elems = 100'000'000;  // offload_param.buffer_size
};

struct ZeroConfig {
  int stage = 0;
  OffloadConfig offload_param;
  OffloadConfig offload_optimizer;
  std::uint64_t sub_group_size_elems = 1'000'000'000;
  std::uint64_t max_live_parameters_elems = 1'000'000'000;   // stage3_max_live_parameters
  std::uint64_t prefetch_bucket_size_elems = 50'000'000;     // stage3_prefetch_bucket_size
  std::uint64_t param_persistence_threshold_elems = 100'000;  // stage3_param_persistence_threshold
  int sharding_factor = 0;  // mics_shard_size: 0 = shard over the whole world
};

struct AioConfig {
  int queue_depth = 32;
  std::string engine = "auto";  // strata extension: auto | io_uring | threads
  // Strata extensions (`strata bench io --tune` writes them): the largest kernel read and write;
  // 0: the engine's defaults (Note [Request size and merging], offload/uring_engine.cc).
  std::uint64_t request_bytes = 0;
  std::uint64_t write_request_bytes = 0;
};

struct LossScaleConfig {
  double loss_scale = 0;  // 0: dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
};

struct OptimizerConfig {
  std::string type = "AdamW";  // AdamW | Adam | SGD | Lion
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;  // SGD
  bool bias_correction = true;
  bool lr_auto = false;  // params.lr was "auto": resolved once the scheduler is read
};

struct SchedulerConfig {
  std::string type;  // "" (constant) | WarmupLR | WarmupDecayLR | WarmupCosineLR
  double warmup_min_lr = 0;
  double warmup_max_lr = 1e-3;
  std::int64_t warmup_num_steps = 1000;
  std::int64_t total_num_steps = 0;
  std::string warmup_type = "log";
  double warmup_min_ratio = 0.0;  // WarmupCosineLR
  double cos_min_ratio = 0.0001;
  bool warmup_max_lr_auto = false;    // "auto": the optimizer's lr
  bool total_num_steps_auto = false;  // "auto": the run's steps (resolve_step_autos)
};

struct DeviceConfig {
  DeviceChoice kind = DeviceChoice::Auto;
  std::uint64_t memory_bytes = 0;  // sim: the capacity (required); cuda: an optional cap
  double h2d_gbps = 0;            // sim: modeled link; 0 = memcpy speed
  double d2h_gbps = 0;
  double latency_us = 0;
  // sim: the modeled compute rate of the model's matmuls and attention (Note [Modeled compute] in
  // models/kernels/ops.h), 1e12 FLOP/s; 0 = the host's speed.
  double compute_tflops = 0;
  // sim: non-zero seeds the schedule-chaos mode (Note [Schedule chaos], core/device/schedule_chaos.h):
  // random pauses before every stream task and every offload host task, to try rare orders.
  std::uint64_t chaos_seed = 0;
};

struct CheckpointConfig {
  std::string dir;
  std::int64_t interval_steps = 0;
  double interval_minutes = 0;
  int keep = 2;
};

struct DataConfig {
  std::string train = "fortunes";  // "fortunes", a text file, or a token file
  // A token file (or "fortunes": the built-in corpus's held-out split) whose loss is evaluated
  // every validation_interval_steps steps (0: at the end of the run only), over its first
  // validation_windows windows of seq_len tokens (0: all of them). Note [Validation during training] in
  // train/trainer_validation.h.
  std::string validation;
  std::int64_t validation_interval_steps = 0;
  std::int64_t validation_windows = 0;
  std::string format = "auto";     // auto | text | tokens
  int seq_len = 64;
  double validation_fraction = 0.1;  // for corpora split by Strata
};

// Strata's own offload knobs (zero_optimization.offload_* hold the DeepSpeed ones).
struct OffloadTuning {
  // Pinned host staging for the optimizer's chunk pipeline, split into
  // zero_optimization.offload_optimizer.buffer_count slots: fixed, whatever the model size.
  std::uint64_t pinned_buffer_bytes = 64ull << 20;
  // Run each group's optimizer update as soon as its gradients are final, during backward, when
  // the update does not depend on the whole step (no gradient clipping, no fp16 loss scaling).
  bool overlap_optimizer = true;
  // strata.offload.host_budget: the host memory the run's offloaded arrays and pinned pools may take
  // per rank. "auto" (host_budget_auto, the default) resolves to a safe fraction of MemAvailable
  // when the run is planned (resolve_placement, plan/tier_plan.h); until then host_budget_bytes is
  // 0, meaning no limit. Arrays offloaded with device "auto" fill it, then spill to NVMe.
  bool host_budget_auto = true;
  std::uint64_t host_budget_bytes = 0;
};

// strata.parallel: how the world splits into data x tensor x pipeline ranks (plan/parallel_layout.h).
enum class PipelineSchedule { GPipe, OneFOneB };
struct ParallelConfig {
  int tensor = 1;    // T: Megatron 1D tensor parallelism inside each layer
  int pipeline = 1;  // P: layers split into P stages
  // S: the sums tensor parallelism splits are taken in S fixed slices (Note [Tensor slices] in
  // models/tensor_parallel.h); runs with equal S give the same bits for every T dividing S. 0: T.
  int tensor_slices = 0;
  int slices() const { return tensor_slices > 0 ? tensor_slices : tensor; }
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  // Layers per pipeline stage, first stage first (P counts summing to the model's layers); empty:
  // balanced by parameters (models/pipeline.h).
  std::vector<std::int64_t> pipeline_layers;
  // A pipeline stage keeps only its input of each micro-batch in flight and recomputes its forward
  // in backward (Note [Stage re-materialization] in models/pipeline.h); false: it keeps what the
  // model keeps without stages (every block's activations, or with checkpoint_activations each
  // block's input) for each micro-batch in flight, and runs each forward once.
  bool stage_recompute = false;
  // Megatron's sequence parallelism beside tensor parallelism (Note [Sequence parallelism] in
  // models/tensor_parallel.h): the norms and the residual stream split by rows over the T ranks.
  bool sequence = false;
  CommunicatorChoice communicator = CommunicatorChoice::Auto;
};

struct StrataConfig {
  bool exact = false;
  std::uint64_t seed = 1234;
  nlohmann::json model = "tiny";  // a name or an object of fields; interpreted by models/
  DataConfig data;
  std::string init_weights;
  DeviceConfig device;
  CheckpointConfig checkpoint;
  std::int64_t steps = 100;
  // The run fails after this many consecutive skipped steps (non-finite gradients): a run that
  // trains nothing does not succeed. "auto" (0 here until parse_train_config resolves it): with
  // fp16's dynamic loss scaler, initial_scale_power + hysteresis + 3, room for the scaler to back
  // off from its initial scale; otherwise 3.
  std::int64_t max_skipped_steps = 0;
  std::string metrics_path;  // JSON lines, one per step
  std::string trace_path;    // Chrome-trace JSON
  OffloadTuning offload;
  ParallelConfig parallel;
  nlohmann::json tiling = nlohmann::json::object();  // interpreted by the tiling code
};

struct TrainConfig {
  std::string source;  // the file the config came from, for messages
  int micro_batch_size = 1;  // train_micro_batch_size_per_gpu
  int gradient_accumulation_steps = 1;
  std::int64_t train_batch_size = 0;  // 0: derived; else must equal micro * accum * data-parallel world
  // Whether the config gave the first two as numbers (not absent, not "auto"): resolve_batch_sizes
  // derives the others from them as DeepSpeed does.
  bool micro_batch_given = false;
  bool accumulation_given = false;
  // Written "auto": their derived values are reported (resolve_batch_sizes).
  bool micro_batch_auto = false;
  bool accumulation_auto = false;
  bool train_batch_size_auto = false;
  double gradient_clipping = 0;       // 0: off
  int steps_per_print = 1;
  Precision precision = Precision::Fp32;
  LossScaleConfig fp16;
  ZeroConfig zero;
  AioConfig aio;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  StrataConfig strata;
  nlohmann::json raw;  // the config after overrides, as written into checkpoints
  // DeepSpeed keys present in the config that Strata accepts without effect, with the reason each.
  std::vector<IgnoredKey> ignored_keys;
  // Values written "auto" and what they became (Note [Auto values], config/config.cc).
  std::vector<ResolvedAuto> resolved_auto;
  // Every key path the parser reads, present or not (sections too): its schema.
  std::vector<std::string> accepted_keys;
};

// Parses `root` (after overrides). `source` names the file in messages. Throws ConfigError.
TrainConfig parse_train_config(const nlohmann::json& root, const std::string& source);

// Reads a JSON file (with a clear error for a missing file or bad JSON, with line and column),
// applies `overrides` ("key.path=value"), and parses it.
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides);

// The same for config text already in memory (JSON with comments); `source` names it in messages.
TrainConfig load_train_config_text(const std::string& text, const std::string& source,
                                   const std::vector<std::string>& overrides);

// One warning per ignored key ("<source>: <key path>: accepted for DeepSpeed compatibility but has
// no effect in Strata: <reason>"). Call once at startup, on one rank.
void log_ignored_keys(const TrainConfig& config);

// What needs the run's step count (--steps, after parsing): scheduler.params.total_num_steps
// "auto" becomes strata.steps, and the decay schedules' steps are checked. Throws ConfigError.
void resolve_step_autos(TrainConfig& config);

// The batch-size triangle, as DeepSpeed derives it (runtime/config.py): of train_batch_size,
// train_micro_batch_size_per_gpu and gradient_accumulation_steps, the ones given (numbers) fix the
// others for `data_world` data-parallel ranks; absent or "auto" ones are derived (micro-batch and
// accumulation 1 where nothing fixes them), and all three given must agree. Derived values written
// "auto" are recorded in resolved_auto. Throws ConfigError naming the three and the ranks.
void resolve_batch_sizes(TrainConfig& config, int data_world);

// One block, "resolved auto: key = value (why)" per line, when the config had any "auto" values.
// Call once at startup, on one rank, after resolve_step_autos and resolve_batch_sizes.
void log_resolved_auto(const TrainConfig& config);

std::string_view offload_device_name(OffloadDevice d);
std::string_view precision_name(Precision p);

}  // namespace strata
