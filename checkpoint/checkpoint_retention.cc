// Retention of checkpoints: retiring old ones, deleting them in the background, spare data files
// (see checkpoint/checkpoint_retention.h).
#include "checkpoint/checkpoint_retention.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_format.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

// Note [Recycled data files]: a new file's blocks are fresh (fallocated, unwritten extents), and
// this disk writes those slower than blocks written before (docs/MEASUREMENTS.md, "Checkpoints").
// So a retired checkpoint's data files are not deleted but kept as PARENT/.spare-rank-RRRRR.bin
// (one per rank), and the next checkpoint of that rank renames its spare into its temporary
// directory and overwrites it in place, truncated or extended to the new size; every byte of it is
// written again (ranges and the zeros between them cover the file). A spare costs the disk space
// of one rank file, which the next checkpoint needs anyway.
constexpr const char* kSparePrefix = ".spare-";
constexpr const char* kRetiredPrefix = ".old-";

// The rank files of the retired checkpoint `old` become their rank's spare (unless it has one).
void keep_spares(const fs::path& parent, const fs::path& old) {
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& f : fs::directory_iterator(old, ec)) files.push_back(f.path().filename().string());
  for (const auto& n : files) {
    const fs::path spare = parent / (kSparePrefix + n);
    if (n.rfind("rank-", 0) != 0 || fs::exists(spare, ec)) continue;
    fs::rename(old / n, spare, ec);
  }
}

}  // namespace

// Note [Pruning in the background]: removing an old checkpoint (unlinking hundreds of MiB of
// extents, docs/MEASUREMENTS.md, "Checkpoints") does not hold up training. Once `latest` names the new
// checkpoint, rank 0 renames the checkpoints beyond `keep` to .old-step-* (one rename each, so
// they stop being checkpoints at once) and a background task deletes them while training goes
// on. A later retirement's task first waits for the earlier one; a save leaves .old-* directories
// to a running task and removes them only when none runs (a crash's leftovers). The task belongs
// to the CheckpointRetention that started it: the trainer's lives for the run, and its
// destructor waits for the task, so old checkpoints are gone when the run ends.
CheckpointRetention::~CheckpointRetention() {
  try {
    wait();
  } catch (const std::exception& e) {  // a destructor must not throw; the deletion only warns anyway
    spdlog::warn("checkpoint: deleting retired checkpoints failed: {}", e.what());
  }
}

void CheckpointRetention::wait() {
  std::lock_guard lock(mutex_);
  if (deletion_.valid()) deletion_.get();
}

bool CheckpointRetention::deleting() {
  std::lock_guard lock(mutex_);
  if (!deletion_.valid()) return false;
  if (deletion_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return true;
  deletion_.get();
  return false;
}

void CheckpointRetention::remove_leftovers(const std::string& parent) {
  const bool busy = deleting();
  for (const auto& e : fs::directory_iterator(parent)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp-step-", 0) == 0 || (!busy && n.rfind(std::string(kRetiredPrefix) + "step-", 0) == 0) ||
        n == std::string(kCheckpointLatest) + ".tmp") {
      fs::remove_all(e.path());
    }
  }
}

void CheckpointRetention::retire_old(const std::string& parent, int keep, const std::string& keep_name) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  for (const auto& e : fs::directory_iterator(parent)) {
    std::int64_t step = 0;
    if (e.is_directory() && checkpoint_internal::parse_step_dir(e.path().filename().string(), &step)) {
      found.emplace_back(step, e.path().filename().string());
    }
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<fs::path> doomed;
  for (std::size_t i = static_cast<std::size_t>(std::max(keep, 1)); i < found.size(); ++i) {
    if (found[i].second == keep_name) continue;
    const fs::path old = fs::path(parent) / (kRetiredPrefix + found[i].second);
    std::error_code ec;
    fs::rename(fs::path(parent) / found[i].second, old, ec);
    if (ec) {
      spdlog::warn("checkpoint: could not retire old {}/{}: {}", parent, found[i].second, ec.message());
      continue;
    }
    doomed.push_back(old);
    keep_spares(parent, old);
  }
  if (doomed.empty()) return;
  std::lock_guard lock(mutex_);
  deletion_ = std::async(std::launch::async, [earlier = std::move(deletion_), doomed = std::move(doomed)]() mutable {
    if (earlier.valid()) earlier.get();
    for (const auto& d : doomed) {
      std::error_code ec;
      fs::remove_all(d, ec);
      if (ec) spdlog::warn("checkpoint: could not remove {}: {}", d.string(), ec.message());
    }
  });
}

bool CheckpointRetention::take_spare(const std::string& parent, const std::string& name,
                                     const std::string& path) const {
  std::error_code ec;
  fs::rename(fs::path(parent) / (kSparePrefix + name), path, ec);
  return !ec;
}

}  // namespace strata
