// The training loop behind `strata train`: config -> device -> communicator -> model -> ZeRO
// engine -> data -> steps, with a progress line per step, JSON-lines metrics and a summary.
//
// Unit u = a * world + rank (micro-batch a of rank r) of step s reads the sampler windows
// [(s * units + u) * micro, ... + micro): every split of a step's units over ranks and micro-batches
// reads the same sequences, which is what lets exact mode give the same weights for any world size
// and accumulation (engine/zero_engine.h, Note [Exact gradient sums] in engine/zero_engine.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "config/config.h"
#include "plan/machine.h"
#include "plan/parallel_layout.h"
#include "models/model_config.h"

namespace strata::train {

// The run skipped strata.max_skipped_steps steps in a row (non-finite gradients): it is not
// training, and stops saying why (exit 1).
class SkippedStepsError : public Error {
 public:
  using Error::Error;
};

struct TrainOptions {
  std::string config_path;                   // --config FILE; empty: the built-in configs/demo.json
  std::vector<std::string> overrides;        // --set key.path=value
  std::optional<std::int64_t> steps;         // --steps N (overrides strata.steps)
  std::string save_weights;                  // --save-weights OUT.safetensors
  std::string summary_json;                  // --summary-json OUT.json (rank 0)
  bool quiet = false;                        // no per-step progress lines (tests)
  std::string resume;                        // --resume DIR: a checkpoint, or the parent with `latest`
  bool allow_new_data = false;               // --allow-new-data: resume on data other than the checkpoint's
  // Called after each checkpoint this rank took part in (benchmarks): its wall seconds and bytes.
  std::function<void(double seconds, std::uint64_t bytes)> on_checkpoint;
  // Whether a checkpoint due after a step is begun before it, so the step captures the new state
  // (checkpoint/checkpoint.h, begin_checkpoint); false copies it after the step (benchmarks).
  bool capture_checkpoints = true;
  // --drive-tbw: the rated endurance of one NVMe drive (1e12 bytes written); 0: unknown. With it
  // the summary says how many days of this training the drives survive.
  double drive_tbw = 0;
};

struct TrainSummary {
  std::int64_t steps = 0;
  double first_loss = 0;
  double last_loss = 0;
  double tokens_per_second = 0;
  std::size_t peak_device_bytes = 0;
  std::uint64_t peak_host_bytes = 0;  // offloaded arrays + pinned staging
  std::uint64_t peak_nvme_bytes = 0;
  std::uint64_t nvme_bytes_read = 0;
  std::uint64_t nvme_bytes_written = 0;
  std::uint64_t optimizer_chunk_updates = 0;
  std::uint64_t overlapped_chunk_updates = 0;
  double step_call_fraction = 0;  // share of step time spent inside ZeroEngine::step()
  // Initial weights read from a file or a Hugging Face folder: their bytes, and the most host
  // memory the import held at once (ZeroEngine's group staging + the reader's; 0 without a file).
  std::uint64_t import_bytes = 0;
  std::uint64_t import_peak_host_bytes = 0;
  // The last validation (strata.data.validation; train/trainer_validation.h); 0 tokens: none ran.
  double validation_loss = 0;
  std::int64_t validation_tokens = 0;
  std::int64_t validation_step = 0;
  std::uint64_t peak_rss_bytes = 0;  // this process's peak resident set (VmHWM)
  std::uint64_t pinned_bytes = 0;    // fixed staging pools
  bool optimizer_offloaded = false;  // the optimizer state (and its update) on the host or NVMe
  std::uint64_t model_state_bytes = 0;      // weights, master, moments, gradients of the whole model
  std::uint64_t device_capacity_bytes = 0;  // per rank
  std::string device_name;                  // "sim:0", "cuda:0 (NVIDIA H100 80GB HBM3)"
  std::int64_t tokens_per_step = 0;         // of all data-parallel ranks
  int stopped_by_signal = 0;  // SIGTERM/SIGINT ended the run after a final checkpoint (0: it ran to the end)
  std::uint64_t parameters = 0;
  // Per step (rank 0): wall seconds, NVMe bytes read and written, host<->device bytes of offloaded state.
  std::vector<double> step_seconds;
  std::vector<std::uint64_t> step_nvme_read, step_nvme_written, step_copy_bytes;
  // Copies of pageable host memory per step: each may be a host synchronization on cuda (Note
  // [Pageable copies]).
  std::vector<std::uint64_t> step_pageable_copies;
  // Page-locks (pin_host) per step: each may stall every stream on cuda (Note [Pinning while
  // streams run]).
  std::vector<std::uint64_t> step_pins;
  // NVMe writes per step of all ranks (rank 0's steps after the first, times the world size) and
  // what they mean for the drives: one per nvme_path directory, each rated --drive-tbw.
  SsdWear wear;
  int drives = 0;
  double drive_tbw = 0;
  // Tensor parallelism (T > 1): the tensor group's collectives per micro-batch as issued (counted
  // at the communicator) and as Megatron's formula gives them (models::tensor_parallel_traffic).
  int tensor_ranks = 1;
  double tp_all_reduce_calls = 0, tp_all_reduce_bytes = 0, tp_all_gather_calls = 0, tp_all_gather_bytes = 0;
  std::uint64_t tp_formula_all_reduce_calls = 0, tp_formula_all_reduce_bytes = 0;
  std::uint64_t tp_formula_all_gather_calls = 0, tp_formula_all_gather_bytes = 0;
  // With sequence parallelism: its reduce-scatters, and the norm weight gradients' rank-order chain
  // (sends, receives and broadcasts together; Note [Sequence parallelism] in models/tensor_parallel.h).
  double tp_reduce_scatter_calls = 0, tp_reduce_scatter_bytes = 0, tp_chain_calls = 0, tp_chain_bytes = 0;
  std::uint64_t tp_formula_reduce_scatter_calls = 0, tp_formula_reduce_scatter_bytes = 0;
  std::uint64_t tp_formula_chain_calls = 0, tp_formula_chain_bytes = 0;
  // Pipeline parallelism (P > 1), per stage (gathered to rank 0 from the stages of its model
  // replica): its blocks and parameters, the most micro-batches in flight (GPipe: all of them;
  // 1F1B: min(A, P - stage)), the device bytes of its stash and boundary buffers, its peak device memory,
  // and the bytes it sent and received per micro-batch (counted at the communicator) beside the
  // formula: batch x seq x d_model values to each neighbouring stage and from it; with a tied
  // embedding across stages (Note [Tied embedding across stages] in models/pipeline.h) one more such boundary from the
  // last stage to the first, and the embedding's vocabulary x d_model values from the first to the
  // last once per step (a 1/A share of it per micro-batch).
  struct PipelineStageFigures {
    std::int64_t first_layer = 0, end_layer = 0, parameters = 0;
    int peak_in_flight = 0, stash_slots = 0;
    std::uint64_t buffer_bytes = 0, peak_device_bytes = 0;
    // See Note [Stage activations] in models/pipeline.h.
    // The activation sets the stage keeps (one per micro-batch in flight;
    // 0 on the last stage and with strata.parallel.stage_recompute) and its activation workspace.
    int activation_sets = 0;
    std::uint64_t activation_bytes = 0;
    double sent_bytes = 0, received_bytes = 0;
    double formula_sent_bytes = 0, formula_received_bytes = 0;
    // The stage's idle share of its steps (after the first), from events on its compute stream
    // (Note [Measured bubble] in models/pipeline_runner.h); -1 when not measured (one step).
    double measured_bubble = -1;
  };
  int pipeline_stages = 1;
  std::string pipeline_schedule;
  double pipeline_ideal_bubble = 0;  // (P - 1) / (A + P - 1)
  std::vector<PipelineStageFigures> stages;
  // World > 1: every rank's own figures, gathered to rank 0 (the fields above are rank 0's): its
  // place in the layout, its model state (the tier plan's) and peak device memory, its tensor
  // group's collectives per micro-batch (all kinds together) and its pipeline stage's sends and
  // receives per micro-batch, each beside its formula.
  struct RankFigures {
    int rank = 0, data = 0, tensor = 0, pipeline = 0;
    std::uint64_t model_state_bytes = 0, peak_device_bytes = 0;
    double tensor_calls = 0, tensor_bytes = 0, formula_tensor_calls = 0, formula_tensor_bytes = 0;
    double sent_bytes = 0, received_bytes = 0, formula_sent_bytes = 0, formula_received_bytes = 0;
  };
  std::vector<RankFigures> ranks;
};

// The config in `path` with `overrides` applied; an empty path means configs/demo.json as compiled
// into the command (tools/CMakeLists.txt), so `strata train` works from any directory.
TrainConfig load_train_config_or_demo(const std::string& path, const std::vector<std::string>& overrides);
// A config fragment file (a JSON object of sections, as `strata bench io --tune --out` writes) as
// --set overrides, one per leaf: {"aio": {"queue_depth": 8}} is aio.queue_depth=8.
std::vector<std::string> config_fragment_overrides(const std::string& path);

// The model a training config describes (strata.model, with the precision's dtype), and whether it
// asks for activation checkpointing.
models::ModelConfig training_model_config(const TrainConfig& cfg, bool* checkpointing);
// Where the run's initial weights come from: strata.init_weights, else the Hugging Face model
// folder strata.model names; empty: the default initialization.
std::string initial_weights_path(const TrainConfig& cfg);

// strata.parallel (plan/parallel_layout.h): the world must factor into data x tensor x pipeline
// and the model's shape must split that way, before any work. Tensor parallelism runs with the
// limits of models/tensor_parallel.h (no tiling beside it yet, no clipping in exact mode), refused
// saying so; pipeline parallelism (models/pipeline.h) needs only a split the model allows. Throws
// ConfigError.
ParallelLayout check_parallel_layout(const TrainConfig& cfg, const models::ModelConfig& model, int world);

// Runs the whole job on this rank. Throws strata::Error subclasses for bad input.
TrainSummary run_training(const TrainOptions& options);

}  // namespace strata::train
