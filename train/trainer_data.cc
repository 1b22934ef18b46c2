// The training data of `strata train` (see train/trainer_data.h).
#include "train/trainer_data.h"

#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "models/hf_config.h"
#include "train/model_source.h"
#include "train/rank_agreement.h"
#include "train/run_paths.h"
#include "train/token_cache.h"

namespace strata::train {

namespace {

void check_data_fits_model(const TrainConfig& cfg, const models::TokenFile& data, const std::string& data_path,
                           const models::ModelConfig& model) {
  const DataConfig& d = cfg.strata.data;
  const bool text = d.train != "fortunes" && train_data_is_text(d);
  const std::string folder = cfg.strata.model.is_string() ? cfg.strata.model.get<std::string>() : std::string();
  const bool hf_folder = !folder.empty() && models::is_hf_model_folder(folder);
  if (model.vocab_size != 256 && (text || d.train == "fortunes")) {
    const std::string prepare = fmt::format("strata data prepare --tokenizer {} --input {} --out data",
                                            hf_folder ? folder : "MODEL_FOLDER",
                                            text ? d.train : std::string("TEXT"));
    if (text) {
      throw ConfigError(fmt::format("strata.data.train '{}' is text, which Strata reads as bytes (a vocabulary of "
                                    "256), and model '{}' has a vocabulary of {}: it would train on bytes without a "
                                    "word; tokenize it with the model's tokenizer: `{}`, then train on data/train.tok",
                                    d.train, model.name, model.vocab_size, prepare));
    }
    spdlog::warn("strata.data.train \"fortunes\" is byte tokens and model '{}' has a vocabulary of {}: the loss "
                 "measures throughput, not language; to train on text, `{}`",
                 model.name, model.vocab_size, prepare);
  }
  if (hf_folder) check_data_tokenizer(data, data_path, folder);
}

}  // namespace

bool train_data_is_text(const DataConfig& d) {
  return d.format == "text" || (d.format == "auto" && std::filesystem::path(d.train).extension() == ".txt");
}

std::string prepare_training_data(const TrainConfig& cfg, Communicator& comm, const std::string& cache_dir) {
  const DataConfig& d = cfg.strata.data;
  if (d.train != "fortunes" && !train_data_is_text(d)) return d.train;
  const bool fortunes = d.train == "fortunes";
  // fortunes_token_cache writes train.tok and val.tok
  const std::string path =
      cache_dir + "/" + (fortunes ? std::string("train") : std::filesystem::path(d.train).filename().string()) + ".tok";
  // Rank 0 makes the cache while the others wait; a refusal there stops every rank (Note
  // [Start-up refusals agreed] in train/rank_agreement.h).
  agreed_startup_step(comm, [&] {
    if (comm.rank() != 0) return;
    if (fortunes) {
      fortunes_token_cache(cache_dir, models::kDefaultFortunesDir);
    } else {
      text_token_cache(d.train, cfg.source + ": strata.data.train", path);
    }
  });
  return path;
}

models::TokenFile open_training_data(const TrainConfig& cfg, Communicator& comm, const models::ModelConfig& model) {
  const std::int64_t seq = cfg.strata.data.seq_len;
  const std::string data_path = prepare_training_data(cfg, comm, token_cache_dir(cfg));
  models::TokenFile data = models::TokenFile::open(data_path);
  data.check_vocab(model.vocab_size);
  check_data_fits_model(cfg, data, data_path, model);
  if (data.size() < static_cast<std::size_t>(seq + 2)) {
    throw FormatError(fmt::format("training data '{}' has {} tokens, fewer than one window of seq_len {} + 1",
                                  data_path, data.size(), seq));
  }
  return data;
}

}  // namespace strata::train
