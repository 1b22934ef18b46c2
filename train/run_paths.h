// Every path a `strata train` run reads, owns or writes, collected before the first step, and the
// one check that no output lands on another of them.
//
// Note [Run paths]: a run touches three kinds of paths. Inputs it reads (the config, the data, init
// weights, the checkpoint being resumed and the `latest` that named it); paths it owns and writes
// itself (every rank's swap file and its lock, the checkpoint directory with its step directories,
// `latest` and token caches, the token caches it makes, the metrics lock); and the outputs the user
// names (--save-weights, --summary-json, strata.metrics, strata.trace of every rank). All are
// canonicalised (symbolic links and `..` resolved as far as the path exists) and an output is
// refused when it equals another path of the run or lies inside a directory of it; a file the run
// owns is refused when it is an input. Refused before any work, with one message naming both paths,
// so a wrong path costs seconds and destroys nothing: --save-weights on a swap file (deleted with
// the swap files at the end), --summary-json on `latest`, strata.metrics on a swap file (whose lock
// it would share). An output that exists and is not a regular file (/dev/stdout) may be shared.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "train/trainer.h"

namespace strata::train {

enum class PathRole : std::uint8_t { Input, Owned, Output };
enum class PathKind : std::uint8_t { File, Directory };

struct RunPath {
  std::string path;  // as the user or the run spelled it
  std::string what;  // the key, flag or thing it is, for messages: "strata.metrics", "the swap file of rank 1"
  PathRole role;
  PathKind kind = PathKind::File;
};

class RunPaths {
 public:
  // Empty paths are skipped.
  void add(RunPath path);
  // ConfigError naming both paths and the fix for the first conflict (Note [Run paths]).
  void check() const;
  const std::vector<RunPath>& paths() const { return paths_; }

 private:
  std::vector<RunPath> paths_;
};

// The directory the run's token caches live in: strata.checkpoint.dir/data, else strata-run/data.
std::string token_cache_dir(const TrainConfig& cfg);

// strata.trace of `rank`: the path itself with one rank, else PATH.rankR.
std::string trace_path_of_rank(const TrainConfig& cfg, int rank, int world);

// The paths of this run on `world` ranks (every rank's swap files and traces; rank 0's outputs).
RunPaths train_run_paths(const TrainOptions& options, const TrainConfig& cfg, int world);

// Every output of the run can be written (train/output_file.h) and none of them is another path of
// the run (Note [Run paths]); this rank's outputs only are opened and checked for writability.
void check_run_outputs(const TrainOptions& options, const TrainConfig& cfg, int rank, int world);

}  // namespace strata::train
