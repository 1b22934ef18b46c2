// One rank's training run (`run_training`, train/trainer.h) as its phases, in the order
// run_training calls them: the world (config, device, communicator, ranks agreeing), the model and
// its parallel layout, the decoder and where its initial weights come from, the run plan with the
// data, the engine, the checkpoints and a resume, the step loop's set-up, the steps, and the
// report and outputs. Each phase keeps what it built as members, so a later phase (and the step
// loop, which refers to them) finds it; nothing is rebuilt.
//
// The members are declared in the order the phases build them, so they are destroyed in the
// reverse order, as the locals of one function would be: the step loop's drain first, the device
// last. Between the world communicator and the first step, whatever can fail on one rank alone
// runs as an agreed_startup_step (Note [Start-up refusals agreed] in train/rank_agreement.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "core/device/device.h"
#include "core/device/traced_device.h"
#include "plan/parallel_layout.h"
#include "plan/param_provider.h"
#include "plan/run_plan.h"
#include "plan/tier_plan.h"
#include "engine/zero_engine.h"
#include "models/decoder.h"
#include "models/model_config.h"
#include "models/pipeline.h"
#include "models/pipeline_runner.h"
#include "models/tensor_parallel.h"
#include "models/token_data.h"
#include "models/weight_source.h"
#include "train/compute_device.h"
#include "train/step_loop.h"
#include "train/trainer.h"
#include "train/trainer_checkpoints.h"
#include "train/trainer_parallel.h"
#include "train/trainer_report.h"
#include "train/trainer_validation.h"

namespace strata::train {

// The device the run computes on. With strata.trace, every stream records a timeline
// (core/device/traced_device.h) through a traced wrapper of the sim device.
struct RunDevice {
  std::unique_ptr<Device> sim;
  std::shared_ptr<TraceRecorder> recorder;  // null without strata.trace
  std::unique_ptr<Device> traced;
  Device* get() const { return traced ? traced.get() : sim.get(); }
};

// The run plan (where everything lives) and its bytes per tier, before any work: a config that
// cannot fit is refused with the numbers.
struct CheckedPlan {
  RunPlan run;  // moved into the engine
  TierPlan tiers;
};

class TrainingRun {
 public:
  explicit TrainingRun(const TrainOptions& options) : options_(options) {}
  TrainingRun(const TrainingRun&) = delete;  // the step loop and the checkpoints refer to members
  TrainingRun& operator=(const TrainingRun&) = delete;

  // The phases, each called once, in this order.
  void open_world();         // config, device, world communicator; outputs checked, ranks agree
  void lay_out_model();      // the model, its parallel layout and this rank's groups and stage
  void build_decoder();      // tiling, the decoder, the initial weights' source
  void plan_placement();     // the run plan ("auto" resolved, tiers checked), data and validation
  void build_engine();       // the weights' import into the ZeRO engine, its tensor/pipeline groups
  void resume_or_start();    // checkpoints: reslicer, data identity, directory, --resume
  void prepare_steps();      // compute stream, sampler, pipeline runner, reporter, the step loop
  void train();              // the steps
  TrainSummary finish();     // the summary's figures, --save-weights, the trace, the closing lines

 private:
  void init_tensor(std::size_t g, std::size_t t, std::span<float> out) const;
  void log_import();
  void make_step_loop(std::int64_t units);

  const TrainOptions& options_;
  // open_world
  TrainConfig cfg_;
  RunDevice run_device_;
  Device* device_ = nullptr;
  std::unique_ptr<Communicator> comm_;  // the world
  int rank_ = 0;
  int world_ = 1;
  // lay_out_model
  bool checkpointing_ = false;
  std::optional<models::ModelConfig> model_;  // a model folder is read by every rank
  std::optional<ParallelLayout> layout_;
  RankCoords coords_;
  ParallelGroups parallel_groups_;
  Communicator* tensor_comm_ = nullptr;
  Communicator* pipeline_comm_ = nullptr;
  Communicator* dcomm_ = nullptr;  // the data axis the engine shards over
  models::TensorParallel tp_;
  models::PipelineStage stage_;
  std::int64_t seq_ = 0;
  std::int64_t micro_ = 0;
  std::uint64_t device_bytes_ = 0;  // what the plan may fill
  // build_decoder
  std::optional<models::Decoder> decoder_;
  std::vector<ParamGroupSpec> groups_;  // this stage's
  std::uint64_t seed_ = 0;
  std::optional<models::WeightSource> init_file_;
  std::string init_path_;
  models::TensorParallelLayout tp_layout_;
  // plan_placement
  std::optional<CheckedPlan> plan_;
  std::optional<models::TokenFile> data_;  // every rank opens its data and validation files
  std::optional<ValidationSet> validation_;
  // build_engine
  std::uint64_t import_peak_ = 0;
  std::optional<ZeroEngine> engine_;  // every rank opens its swap files and takes their locks
  std::uint64_t init_file_bytes_ = 0;
  // resume_or_start
  std::optional<TrainCheckpoints> checkpoints_;
  models::TensorParallelLayout stage_tp_layout_;
  std::int64_t first_step_ = 0;
  // prepare_steps
  std::optional<ComputeStream> compute_;
  models::DecoderRuntime rt_;
  std::optional<models::BatchSampler> sampler_;
  std::unique_ptr<models::PipelineRunner> pipeline_;
  std::int64_t tokens_per_step_ = 0;
  std::optional<StepReporter> reporter_;  // rank 0 takes the metrics lock
  std::optional<StepLoop> loop_;
  // On an exception the compute stream may still hold work that reads the loop's token arrays and
  // the pipeline runner's buffers: it finishes before they are destroyed (an out-of-memory error
  // in the engine's step crashed here on the unwinding).
  std::optional<StreamDrain> drain_;
  // train, finish
  TrainSummary summary_;
  Clock::time_point start_{};
  LoopSeconds seconds_;
};

}  // namespace strata::train
