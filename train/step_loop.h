// The step loop of a training run: what it works with (StepLoop, set up by TrainingRun in
// train/training_run.cc), the steps themselves (micro-batches, the engine's step, the report, the
// checkpoints and validation between steps) and the run's totals once they are done.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "core/device/device.h"
#include "engine/zero_engine.h"
#include "models/decoder.h"
#include "models/model_config.h"
#include "models/pipeline_runner.h"
#include "models/token_data.h"
#include "plan/tier_plan.h"
#include "train/trainer.h"
#include "train/trainer_checkpoints.h"
#include "train/trainer_report.h"
#include "train/trainer_validation.h"

namespace strata::train {

using Clock = std::chrono::steady_clock;

// What the step loop works with, set up once by TrainingRun::prepare_steps.
struct StepLoop {
  const TrainConfig& cfg;
  Device& device;
  Communicator& comm;        // the data axis
  Communicator& world_comm;  // every rank of the job
  ZeroEngine& engine;
  models::Decoder& decoder;
  models::DecoderRuntime& rt;
  models::BatchSampler& sampler;
  TrainCheckpoints& checkpoints;
  StepReporter& reporter;  // rank 0's progress and metrics
  bool reports;            // this is rank 0 of the world
  int rank;                // on the data axis (comm)
  int world;
  std::int64_t micro;
  std::int64_t seq;
  std::uint64_t seed;
  int accumulation;
  std::int64_t units;  // micro-batches per step over all ranks
  std::int64_t tokens_per_step;
  bool masked;  // the data has a loss mask (Note [Loss mask] in models/token_data.h)
  std::int64_t first_step = 0;       // of this run (after a resume, the checkpoint's)
  std::vector<std::int32_t> inputs;   // one micro-batch
  std::vector<std::int32_t> targets;
  models::PipelineRunner* pipeline = nullptr;  // this rank's stage (P > 1)
  Communicator* pipeline_comm = nullptr;
  const ValidationSet* validation = nullptr;  // strata.data.validation
  double pipeline_busy_ms = 0, pipeline_span_ms = 0;  // over the steps after the run's first
};

// Seconds the steps took in all, and inside step().
struct LoopSeconds {
  double steps = 0;
  double exposed = 0;
  double validation = 0;  // not counted in the run's throughput
};

// Runs steps first_step+1.. of the run, recording each in `summary`; stops early on a signal.
LoopSeconds run_steps(StepLoop& l, std::int64_t first_step, TrainSummary& summary);
// NVMe writes per step, after the first step (set-up and warm-up), of every rank (they write alike),
// and the drives' wear at that rate: one drive per nvme_path directory.
void wear_summary(TrainSummary& summary, const TierPlan& plan, int world, double drive_tbw);
// The run's totals, once the steps are done.
void total_summary(TrainSummary& summary, const StepLoop& l, const LoopSeconds& seconds, const TierPlan& plan,
                   const models::ModelConfig& model, Clock::time_point start, std::int64_t first_step);

}  // namespace strata::train
