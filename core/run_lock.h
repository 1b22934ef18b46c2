// Exclusive ownership of a path a run writes (a swap file, a checkpoint directory, a metrics file)
// for the life of the process, so that two runs pointed at the same place refuse to start instead
// of corrupting each other.
//
// Note [Run locks]: a lock is a small file beside what it guards (`<path>.lock`, mode 0600) held
// with flock(LOCK_EX | LOCK_NB) and holding one line that names its holder (pid, host, start time,
// command). A second run fails at once with an error that quotes that line and the lock file.
// flock locks die with their process, so a lock file left behind by a run that was killed is
// stale: the next run takes it over (and says so in the log) instead of refusing. Release unlinks
// the file while still holding the lock; acquire checks after locking that the file it locked is
// still the one at the path (else a releasing holder unlinked it under us) and retries, so two
// runs can never both believe they hold one path. Ranks of one run guard different paths (each its
// own swap file; rank 0 the checkpoint directory and the metrics file).
#pragma once

#include <string>
#include <string_view>

#include "core/file_io.h"

namespace strata {

class RunLock {
 public:
  RunLock() = default;
  RunLock(RunLock&&) noexcept = default;
  RunLock& operator=(RunLock&& other) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  ~RunLock() { release(); }

  // Takes the lock guarding `guarded` through the lock file `lock_path` (default `guarded` +
  // ".lock"; its directory must exist). `what` names the guarded thing in messages ("swap file",
  // "checkpoint directory"). Throws ConfigError naming the holder and the fix when another live
  // process holds it, IoError when the lock file cannot be created.
  static RunLock acquire(const std::string& guarded, std::string_view what, std::string lock_path = {});

  bool held() const { return fd_.valid(); }
  const std::string& lock_path() const { return lock_path_; }
  // Unlinks the lock file and drops the lock (also on destruction).
  void release() noexcept;

 private:
  UniqueFd fd_;
  std::string lock_path_;
};

// The line a lock records about this process: "pid 123 on host h since 2026-11-25 06:50:12 UTC
// (strata train)".
std::string run_lock_holder_line();

}  // namespace strata
