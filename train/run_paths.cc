// The paths of a training run and the check that no output lands on another (see train/run_paths.h,
// Note [Run paths] in train/run_paths.h).
#include "train/run_paths.h"

#include <sys/stat.h>

#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "checkpoint/checkpoint.h"
#include "plan/run_plan.h"
#include "models/hf_config.h"
#include "train/output_file.h"
#include "train/trainer_data.h"

namespace strata::train {
namespace fs = std::filesystem;

namespace {

// An existing device, FIFO or socket (/dev/stdout): several outputs may share a stream, and no
// file is destroyed by writing it.
bool is_stream(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

// " 'P'" unless P is how `o` was spelled too (the message names it once).
std::string other_spelling(const RunPath& o, const RunPath& p) {
  return o.path == p.path ? std::string() : fmt::format(" '{}'", p.path);
}

// Why output `o` may not be written over or inside `p` (same file or inside a directory of it);
// nullopt when they do not meet.
std::optional<std::string> output_conflict(const RunPath& o, const fs::path& ro, const RunPath& p, const fs::path& rp) {
  if (p.kind == PathKind::File) {
    if (ro != rp) return std::nullopt;
    switch (p.role) {
      case PathRole::Input:
        return fmt::format("{} '{}' is {}{}, a file this command reads; writing it would destroy the input; choose "
                           "another output path",
                           o.what, o.path, p.what, other_spelling(o, p));
      case PathRole::Owned:
        return fmt::format("{} '{}' is {}{}, a file this run owns; the output would destroy it or be destroyed by "
                           "it: choose another output path",
                           o.what, o.path, p.what, other_spelling(o, p));
      case PathRole::Output:
        return fmt::format("{} '{}' and {} '{}' are the same file; give each output its own path", p.what, p.path,
                           o.what, o.path);
    }
  }
  if (!is_within(ro, rp)) return std::nullopt;
  if (p.role == PathRole::Input) {
    return fmt::format("{} '{}' lies inside {} '{}', which this command reads; writing there could destroy the "
                       "input; choose an output path outside it",
                       o.what, o.path, p.what, p.path);
  }
  return fmt::format("{} '{}' lies inside {} '{}', which this run owns (its checkpoints, `latest` and token caches "
                     "live there); an output there could overwrite them or be removed with an old checkpoint: choose "
                     "an output path outside it",
                     o.what, o.path, p.what, p.path);
}

}  // namespace

void RunPaths::add(RunPath path) {
  if (!path.path.empty()) paths_.push_back(std::move(path));
}

void RunPaths::check() const {
  std::vector<fs::path> canonical;
  canonical.reserve(paths_.size());
  for (const RunPath& p : paths_) canonical.push_back(canonical_path(p.path));
  for (std::size_t i = 0; i < paths_.size(); ++i) {
    const RunPath& o = paths_[i];
    if (o.role == PathRole::Input || is_stream(o.path)) continue;
    for (std::size_t j = 0; j < paths_.size(); ++j) {
      const RunPath& p = paths_[j];
      if (j == i || is_stream(p.path)) continue;
      if (o.role == PathRole::Output) {
        // Against every input and owned path, and each pair of outputs once.
        if (p.role == PathRole::Output && j > i) continue;
        if (std::optional<std::string> why = output_conflict(o, canonical[i], p, canonical[j])) throw ConfigError(*why);
        continue;
      }
      // A file the run writes itself must not be one it reads. (Its directories hold its inputs by
      // design: the checkpoint being resumed, the token cache.)
      if (o.kind != PathKind::File || p.role != PathRole::Input) continue;
      const bool meets = p.kind == PathKind::File ? canonical[i] == canonical[j] : is_within(canonical[i], canonical[j]);
      if (meets) {
        throw ConfigError(fmt::format("{} '{}' would be {}{}, which this run reads; the run would overwrite its own "
                                      "input: give one of them another path",
                                      o.what, o.path, p.what, other_spelling(o, p)));
      }
    }
  }
}

std::string token_cache_dir(const TrainConfig& cfg) {
  return cfg.strata.checkpoint.dir.empty() ? "strata-run/data" : cfg.strata.checkpoint.dir + "/data";
}

std::string trace_path_of_rank(const TrainConfig& cfg, int rank, int world) {
  return world > 1 ? fmt::format("{}.rank{}", cfg.strata.trace_path, rank) : cfg.strata.trace_path;
}

RunPaths train_run_paths(const TrainOptions& options, const TrainConfig& cfg, int world) {
  RunPaths paths;
  const DataConfig& d = cfg.strata.data;
  // Read.
  paths.add({options.config_path, "--config", PathRole::Input});
  paths.add({cfg.strata.init_weights, "strata.init_weights", PathRole::Input});
  if (cfg.strata.model.is_string() && models::is_hf_model_folder(cfg.strata.model.get<std::string>())) {
    paths.add({cfg.strata.model.get<std::string>(), "the Hugging Face model folder of strata.model", PathRole::Input,
               PathKind::Directory});
  }
  if (d.validation != "fortunes") paths.add({d.validation, "strata.data.validation", PathRole::Input});
  if (!options.resume.empty()) {
    const std::string resumed = resolve_checkpoint_dir(options.resume);
    paths.add({resumed, "the checkpoint being resumed", PathRole::Input, PathKind::Directory});
    if (canonical_path(resumed) != canonical_path(options.resume)) {
      paths.add({(fs::path(options.resume) / kCheckpointLatest).string(), "the `latest` of --resume", PathRole::Input});
    }
  }
  // Read, or made from the source and then read (the token caches, owned: the run writes them).
  const std::string cache = token_cache_dir(cfg);
  if (d.train == "fortunes") {
    paths.add({cache + "/train.tok", "the token cache", PathRole::Owned});
    paths.add({cache + "/val.tok", "the token cache", PathRole::Owned});
  } else {
    paths.add({d.train, "strata.data.train", PathRole::Input});
    const bool text = train_data_is_text(d);
    if (text) paths.add({cache + "/" + fs::path(d.train).filename().string() + ".tok", "the token cache", PathRole::Owned});
  }
  // Owned.
  paths.add({cfg.strata.checkpoint.dir, "strata.checkpoint.dir", PathRole::Owned, PathKind::Directory});
  for (const std::string& dir : nvme_dirs_of(cfg)) {
    for (int r = 0; r < world; ++r) {
      const std::string swap = dir + "/" + swap_file_name(r);
      paths.add({swap, fmt::format("the swap file of rank {}", r), PathRole::Owned});
      paths.add({swap + ".lock", fmt::format("the lock file of rank {}'s swap file", r), PathRole::Owned});
    }
  }
  // Written, as the user named them.
  paths.add({options.save_weights, "--save-weights", PathRole::Output});
  paths.add({options.summary_json, "--summary-json", PathRole::Output});
  paths.add({cfg.strata.metrics_path, "strata.metrics", PathRole::Output});
  if (!cfg.strata.metrics_path.empty() && !is_stream(cfg.strata.metrics_path)) {
    paths.add({cfg.strata.metrics_path + ".lock", "the lock file of strata.metrics", PathRole::Owned});
  }
  if (!cfg.strata.trace_path.empty()) {
    for (int r = 0; r < world; ++r) {
      paths.add({trace_path_of_rank(cfg, r, world), world > 1 ? fmt::format("strata.trace of rank {}", r) : "strata.trace",
                 PathRole::Output});
    }
  }
  return paths;
}

void check_run_outputs(const TrainOptions& options, const TrainConfig& cfg, int rank, int world) {
  if (!cfg.strata.trace_path.empty()) {
    check_output_path(trace_path_of_rank(cfg, rank, world), "strata.trace", OutputWrite::InPlace,
                      MissingDirectory::Create);
  }
  struct stat st {};
  const std::string& ck = cfg.strata.checkpoint.dir;
  if (!ck.empty() && ::stat(ck.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    throw ConfigError(fmt::format("strata.checkpoint.dir '{}' is a file, not a directory; give a directory (made if "
                                  "missing) for the run's checkpoints",
                                  ck));
  }
  if (rank == 0) {
    check_output_path(options.save_weights, "--save-weights", OutputWrite::Replaced);
    check_output_path(options.summary_json, "--summary-json", OutputWrite::InPlace);
    check_output_path(cfg.strata.metrics_path, "strata.metrics", OutputWrite::InPlace, MissingDirectory::Create);
  }
  train_run_paths(options, cfg, world).check();
}

}  // namespace strata::train
