// What the training loop (train/step_loop.cc) tells the user: rank 0's progress bar or per-step log
// lines, the JSON-lines metrics of strata.metrics, the closing summary lines and --summary-json.
// The figures and formats are the trainer's; this file only writes them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/device/device.h"
#include "core/error.h"
#include "core/run_lock.h"
#include "config/config.h"
#include "engine/offload_tier.h"
#include "engine/zero_engine.h"
#include "train/output_file.h"
#include "train/trainer.h"
#include "train/trainer_validation.h"

namespace strata::train {

// One step's figures: what the summary, the progress line and the metrics line are made from.
struct StepFigures {
  double lr = 0;
  StepResult result;
  double loss = 0;     // the mean over the step's counted targets, all ranks
  std::int64_t counted_targets = 0;  // targets of the step the loss counts (all ranks; fewer with a loss mask)
  double seconds = 0;  // the whole step
  double exposed = 0;  // inside step(): reductions not yet done, optimizer not overlapped
  MemoryStats stats;   // after the step
  TierIoStats io_before;
  TierIoStats io;
  std::uint64_t copy_before = 0;  // engine.offload_copy_bytes() before the step
  std::uint64_t pageable_before = 0;  // the device's pageable copies before the step
  std::uint64_t pageable_copies() const { return stats.pageable_copies - pageable_before; }
  std::uint64_t pins_before = 0;  // the device's host_pins before the step
  std::uint64_t pins() const { return stats.host_pins - pins_before; }
};

// A one-line progress bar on an interactive stderr, redrawn in place each step.
class ProgressBar {
 public:
  ProgressBar(std::int64_t total, bool enabled);
  bool interactive() const { return interactive_; }
  void update(std::int64_t done, const std::string& text);
  void finish();

 private:
  std::int64_t total_;
  bool interactive_;
  bool drawn_ = false;
};

// Rank 0's report of each step: the progress bar, or a log line every steps_per_print steps; and
// with strata.metrics, one JSON line per step (opened for appending; an IoError if it cannot be).
// A file's lines are one run's: a fresh run finding lines of an earlier one keeps them as PATH.N
// (the first free N) and starts the file anew; a resume appends after a marker line
// {"resumed": {"step": S, "checkpoint": DIR}}, so steps that repeat are told apart.
// A metrics write that fails (a full disk) is logged at once with the path; metrics stop, training
// goes on, and the run ends with that error once its other outputs are written (metrics_failure).
class StepReporter {
 public:
  // `resumed_from`: the checkpoint directory a resume continues (empty for a fresh run), at `first_step`.
  StepReporter(const TrainConfig& cfg, bool quiet, int rank, ZeroEngine& engine, std::int64_t tokens_per_step,
               const std::string& resumed_from = {}, std::int64_t first_step = 0);
  // Step s (from 0), with the estimated seconds left. Call on rank 0 only.
  void report(const StepFigures& f, std::int64_t s, double eta_seconds);
  // The validation after step `step` (from 1). Call on rank 0 only.
  void report_validation(std::int64_t step, const ValidationResult& v);
  // Ends the progress bar's line and closes the metrics file (checked).
  void finish();
  // The first failed write, flush or close of strata.metrics, if any.
  const std::optional<IoError>& metrics_failure() const { return metrics_failure_; }

 private:
  void write_metrics_line(const StepFigures& f, std::int64_t s, std::uint64_t host_bytes);
  void metrics_failed(const IoError& e);

  const TrainConfig& cfg_;
  bool quiet_;
  ZeroEngine& engine_;
  std::int64_t tokens_per_step_;
  RunLock metrics_lock_;                 // rank 0: the metrics file is this run's (Note [Run locks] in core/run_lock.h)
  std::unique_ptr<OutputFile> metrics_;  // rank 0 with strata.metrics; null otherwise
  std::optional<IoError> metrics_failure_;
  ProgressBar bar_;
};

// The peak resident set of this process (VmHWM).
std::uint64_t peak_rss_bytes();

// --summary-json: the summary as one JSON object; IoError naming the path when a write or the close
// fails.
void write_summary_json(const std::string& path, const TrainSummary& s);

// Rank 0's closing lines: loss, throughput and memory; the tiers and the overlap when offloading.
// "NVMe wear: ... written per step ... TB per day ... days of this training" for the summary.
std::string describe_wear(const TrainSummary& summary);
void log_summary(const TrainSummary& summary, ZeroEngine& engine, const Device& device);

}  // namespace strata::train
