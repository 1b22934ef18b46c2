// What becomes of old checkpoints once a new one is published (Note [Atomic checkpoints] in
// checkpoint/checkpoint.h): a CheckpointRetention retires all but the newest `keep` checkpoints of a
// parent directory and deletes them in the background (Note [Pruning in the background] in
// checkpoint/checkpoint_retention.cc), keeps each retired rank file as that rank's spare for the next checkpoint to
// overwrite (Note [Recycled data files] in checkpoint/checkpoint_retention.cc), and clears what crashed saves left
// behind. Whoever saves a series of checkpoints owns one (the trainer does) and passes it in CheckpointSaveOptions; a
// save given none uses one of its own, so its deletions are finished when it returns. The object's
// destructor waits for the deletion it started.
#pragma once

#include <future>
#include <mutex>
#include <string>

namespace strata {

class CheckpointRetention {
 public:
  CheckpointRetention() = default;
  ~CheckpointRetention();  // waits for a deletion still running
  CheckpointRetention(const CheckpointRetention&) = delete;
  CheckpointRetention& operator=(const CheckpointRetention&) = delete;

  // Removes what crashed saves left in `parent`: temporary step directories, `latest`'s
  // temporary, and retired checkpoints while no deletion of this object runs (it may be deleting
  // them right now).
  void remove_leftovers(const std::string& parent);

  // Retires all but the newest `keep` checkpoints of `parent` (never `keep_name`): each is renamed
  // to .old-step-* at once (it stops being a checkpoint), its rank files become spares where their
  // rank has none, and a background task deletes the rest. Filesystem errors on the way are
  // warnings; a failed directory listing throws std::filesystem::filesystem_error.
  void retire_old(const std::string& parent, int keep, const std::string& keep_name);

  // See Note [Recycled data files] in checkpoint/checkpoint_retention.cc.
  // Moves the spare of data file `name` in `parent` to `path`; false
  // when there is none.
  bool take_spare(const std::string& parent, const std::string& name, const std::string& path) const;

  // Waits until every checkpoint this object retired is deleted.
  void wait();

 private:
  bool deleting();  // whether the deletion task still runs (reaps a finished one)

  std::mutex mutex_;
  std::future<void> deletion_;  // chained: each task waits for the one before it
};

}  // namespace strata
