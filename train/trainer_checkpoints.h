// The trainer's checkpoints: resume, periodic and final saves, and stopping on SIGTERM/SIGINT
// (Note [Stopping on a signal] in train/trainer_checkpoints.cc). Used by the training run
// (train/training_run.cc, train/step_loop.cc) only; the checkpoint format and its writer live in checkpoint/.
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/run_lock.h"
#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "engine/zero_engine.h"

namespace strata::train {

class TrainCheckpoints {
 public:
  TrainCheckpoints(const TrainConfig& cfg, Communicator& comm, std::string model_name);
  ~TrainCheckpoints();
  TrainCheckpoints(const TrainCheckpoints&) = delete;
  TrainCheckpoints& operator=(const TrainCheckpoints&) = delete;

  bool enabled() const { return !cfg_.strata.checkpoint.dir.empty(); }
  std::function<void(double seconds, std::uint64_t bytes)> on_checkpoint;  // TrainOptions::on_checkpoint
  bool capture = true;                                                      // TrainOptions::capture_checkpoints
  CheckpointTensorParallel tensor;  // this rank's place with tensor parallelism (checkpoint/checkpoint.h)
  // Makes the reslicer that loads a checkpoint written with other tensor ranks
  // (train/checkpoint_tensors.h); without it such a checkpoint is refused.
  std::function<CheckpointReslicer(const CheckpointManifest&)> make_reslicer;
  // Rank 0: the identity of the data the run trains on, recorded in each checkpoint; a resume on
  // other data is refused unless allow_new_data (Note [Token cache identity], train/token_cache.h).
  nlohmann::json data_identity;
  bool allow_new_data = false;  // TrainOptions::allow_new_data

  // Before anything is written (collective): rank 0 makes strata.checkpoint.dir (its last component
  // only), takes it for this run (Note [Run locks], core/run_lock.h) and, for a fresh run, refuses
  // a directory that holds checkpoints already (they belong to another run, or this run should be
  // resumed). Every rank throws when rank 0 refused.
  void claim_directory(bool resuming);

  // Loads `dir` into the freshly built engine; returns the step to continue from. Refuses (before
  // training) when strata.checkpoint.dir's `latest` is later than the checkpoint resumed: the run
  // would reach those steps and could neither skip nor silently replace them (check_series).
  std::int64_t resume(const std::string& dir, ZeroEngine& engine);

  // Before the step that brings the count to `steps_done`: begins the checkpoint that an interval
  // in steps or the last step makes due after it, so that the step captures the new state as it is
  // written (engine/state_home_tiered_state.cc, Note [Checkpoint capture] in engine/state_home_tiered_state.cc) and the
  // save reads nothing.
  void before_step(ZeroEngine& engine, std::int64_t steps_done, bool last_step);

  // After step `steps_done`: writes a checkpoint when one is due (interval in steps or minutes, the
  // last step, a stop signal); returns the signal that asks the run to stop, 0 to go on.
  int after_step(ZeroEngine& engine, std::int64_t steps_done, bool last_step);

 private:
  using Clock = std::chrono::steady_clock;

  CheckpointSaveOptions options();
  void save(ZeroEngine& engine, std::int64_t step);
  void check_series(std::int64_t resumed_step);
  // Runs `check` on rank 0; every rank stops when it threw (Note [Start-up refusals agreed] in
  // train/rank_agreement.h).
  void on_rank0(const std::function<void()>& check);

  const TrainConfig& cfg_;
  Communicator& comm_;
  std::string model_name_;
  std::int64_t last_saved_ = -1;
  std::unique_ptr<PendingCheckpoint> pending_;  // begun before the step it saves
  CheckpointRetention retention_;  // deletes retired checkpoints in the background; waits for that on destruction
  RunLock lock_;                   // rank 0: strata.checkpoint.dir is this run's
  double begin_seconds_ = 0;
  Clock::time_point last_time_;
  struct sigaction old_term_ {};
  struct sigaction old_int_ {};
};

}  // namespace strata::train
