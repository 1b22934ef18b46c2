// The training data of `strata train`: the fortunes corpus, a token file or a text file (tokenized
// by bytes into a cache, train/token_cache.h), opened and checked against the model it trains.
#pragma once

#include <string>

#include "comm/communicator.h"
#include "config/config.h"
#include "models/model_config.h"
#include "models/token_data.h"

namespace strata::train {

// Whether strata.data.train is text that Strata tokenizes by bytes (format "text", or "auto" and a
// .txt name); the fortunes corpus is text too, but by name.
bool train_data_is_text(const DataConfig& d);

// The token file to train on: the fortunes corpus (tokenized once into `cache_dir`), a token file,
// or a text file tokenized by bytes. Caches are made again when their source changed (Note [Token
// cache identity], train/token_cache.h). Collective over `comm` (rank 0 makes the caches).
std::string prepare_training_data(const TrainConfig& cfg, Communicator& comm, const std::string& cache_dir);

// The token file to train on, checked against the model: its vocabulary, one whole window, text
// tokenized by bytes only for a byte vocabulary (the built-in fortunes corpus, a throughput
// benchmark's data, with a warning), and a token file that names its tokenizer only for a model
// folder with that tokenizer. Collective over `comm`.
models::TokenFile open_training_data(const TrainConfig& cfg, Communicator& comm, const models::ModelConfig& model);

}  // namespace strata::train
