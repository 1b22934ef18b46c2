// Validation during training (see train/trainer_validation.h, Note [Validation during training] in
// train/trainer_validation.h).
#include "train/trainer_validation.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "comm/communicator.h"
#include "engine/zero_engine.h"
#include "models/decoder.h"

namespace strata::train {

std::string validation_path(const TrainConfig& cfg, const std::string& cache_dir) {
  const DataConfig& d = cfg.strata.data;
  if (d.validation.empty()) {
    if (d.validation_interval_steps > 0 || d.validation_windows > 0) {
      throw ConfigError(fmt::format("{}: strata.data.validation_interval_steps and validation_windows apply to "
                                    "strata.data.validation, which is not set; name a validation token file (or "
                                    "\"fortunes\" with the fortunes corpus) or remove them",
                                    cfg.source));
    }
    return {};
  }
  if (cfg.strata.parallel.pipeline > 1) {
    throw ConfigError(fmt::format("{}: strata.data.validation with strata.parallel.pipeline = {}: validation runs "
                                  "without pipeline parallelism only, for now; evaluate the saved weights with "
                                  "`strata eval` instead",
                                  cfg.source, cfg.strata.parallel.pipeline));
  }
  if (d.validation == "fortunes") {
    if (d.train != "fortunes") {
      throw ConfigError(fmt::format("{}: strata.data.validation \"fortunes\" is the fortunes corpus's held-out split, "
                                    "and strata.data.train is '{}'; name a validation token file",
                                    cfg.source, d.train));
    }
    return cache_dir + "/val.tok";
  }
  return d.validation;
}

ValidationSet::ValidationSet(const TrainConfig& cfg, const models::ModelConfig& model, const std::string& path)
    : path_(path),
      data_(models::TokenFile::open(path)),
      seq_(cfg.strata.data.seq_len),
      interval_(cfg.strata.data.validation_interval_steps),
      last_step_(cfg.strata.steps) {
  data_.check_vocab(model.vocab_size);
  const std::int64_t count = data_.size() < 2 ? 0 : static_cast<std::int64_t>(data_.size() - 1) / seq_;
  if (count == 0) {
    throw FormatError(fmt::format("strata.data.validation '{}' has {} tokens, fewer than one window of seq_len {} + "
                                  "1; give a longer validation file or a shorter seq_len",
                                  path, data_.size(), seq_));
  }
  const std::int64_t cap = cfg.strata.data.validation_windows;
  windows_ = cap > 0 ? std::min(cap, count) : count;
}

bool ValidationSet::due(std::int64_t step) const {
  return step == last_step_ || (interval_ > 0 && step % interval_ == 0);
}

ValidationResult ValidationSet::evaluate(ZeroEngine& engine, models::Decoder& decoder, const models::DecoderRuntime& rt,
                                         Communicator& data_comm, std::int64_t micro) const {
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t world = data_comm.world_size(), rank = data_comm.rank();
  const std::int64_t per_round = world * micro;
  const std::int64_t rounds = (windows_ + per_round - 1) / per_round;
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(micro * seq_)), targets(inputs.size());
  models::LossSum local;
  engine.begin_evaluation();
  for (std::int64_t k = 0; k < rounds; ++k) {
    for (std::int64_t i = 0; i < micro; ++i) {
      const std::int64_t w = (k * world + rank) * micro + i;
      std::int32_t* in = inputs.data() + i * seq_;
      std::int32_t* tg = targets.data() + i * seq_;
      if (w >= windows_) {  // past the end: the pass still runs (collectives), nothing counts
        std::fill(in, in + seq_, 0);
        std::fill(tg, tg + seq_, -1);
        continue;
      }
      const std::size_t base = static_cast<std::size_t>(w * seq_);
      for (std::int64_t t = 0; t < seq_; ++t) {
        const std::size_t at = base + static_cast<std::size_t>(t);
        in[t] = static_cast<std::int32_t>(data_[at]);
        // A masked target (strata data prepare's prompts) counts nothing, as in training.
        tg[t] = data_.counts_in_loss(at + 1) ? static_cast<std::int32_t>(data_[at + 1]) : -1;
      }
    }
    const models::LossSum s = decoder.forward_loss(rt, engine, inputs.data(), targets.data(), micro, seq_);
    local.sum += s.sum;
    local.tokens += s.tokens;
  }
  engine.end_evaluation();
  ValidationResult r;
  const double sum = data_comm.all_reduce_host(local.sum, ReduceOp::Sum);
  r.tokens = static_cast<std::int64_t>(data_comm.all_reduce_host(static_cast<double>(local.tokens), ReduceOp::Sum));
  r.loss = r.tokens > 0 ? sum / static_cast<double>(r.tokens) : 0.0;
  r.windows = windows_;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace strata::train
