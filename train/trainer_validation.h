// Validation during training: strata.data.validation's loss, evaluated through the ZeRO engine in
// the tiers the run trains in.
//
// Note [Validation during training]: every strata.data.validation_interval_steps steps (0: once,
// after the last step) and after the last step, the run evaluates the first
// strata.data.validation_windows consecutive windows of seq_len tokens of the validation file (0:
// all of them), micro_batch windows per forward pass, round-robin over the data ranks: in round k
// data rank r takes windows [(k * world + r) * micro, ... + micro). A rank past the end runs the
// round's pass with every target ignored, so every rank makes the same collectives (stage 3
// gathers, tensor-parallel sums). The loss is the sum of per-token cross-entropies over all ranks
// divided by the tokens counted: the same figure `strata eval` gives for those windows and the
// run's weights. Parameters are acquired between steps inside ZeroEngine::begin_evaluation /
// end_evaluation, which leave the steps' prefetch trace alone. Pipeline-parallel runs refuse
// validation for now (their forward runs stage by stage through the pipeline runner).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config/config.h"
#include "models/model_config.h"
#include "models/token_data.h"

namespace strata {
class Communicator;
class ZeroEngine;
}  // namespace strata

namespace strata::models {
class Decoder;
struct DecoderRuntime;
}  // namespace strata::models

namespace strata::train {

struct ValidationResult {
  double loss = 0;          // mean nats per token
  std::int64_t tokens = 0;  // over all ranks
  std::int64_t windows = 0;
  double seconds = 0;
};

class ValidationSet {
 public:
  // Opens `path` (a token file, already prepared) for `model`; ConfigError / FormatError naming
  // strata.data.validation, the file and the fix.
  ValidationSet(const TrainConfig& cfg, const models::ModelConfig& model, const std::string& path);

  // Whether the run evaluates after step `step` (from 1).
  bool due(std::int64_t step) const;

  // The loss of the run's current weights. Every rank of the job calls it (collective).
  ValidationResult evaluate(ZeroEngine& engine, models::Decoder& decoder, const models::DecoderRuntime& rt,
                            Communicator& data_comm, std::int64_t micro) const;

  const std::string& path() const { return path_; }
  std::int64_t windows() const { return windows_; }

 private:
  std::string path_;
  models::TokenFile data_;
  std::int64_t seq_, interval_, last_step_, windows_;
};

// The validation token file of the run: strata.data.validation as given, or the fortunes corpus's
// held-out split (`cache_dir`/val.tok, which preparing the training data wrote) for "fortunes".
// Empty when the run has none. ConfigError for settings that would do nothing (an interval without
// a file) or that the run cannot honour (pipeline parallelism).
std::string validation_path(const TrainConfig& cfg, const std::string& cache_dir);

}  // namespace strata::train
