// The files the commands write for the user (weights, summaries, metrics, traces, exports): the
// checks made before any work that each output path can be written and is none of the command's
// inputs, and OutputFile, the checked writer of the text outputs written in place (strata.metrics
// appended step by step, --summary-json), where a full disk, a failed write or a failed close is an
// IoError naming the path instead of a silently short file. Files replaced whole go through
// core/file_io.h's AtomicFileWriter (models/safetensors.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/file_io.h"

namespace strata::train {

// How an output reaches its path: a new file renamed over it (weights, exports), or writes into
// the file at the path (text outputs, which may also be /dev/stdout or a device).
enum class OutputWrite : std::uint8_t { Replaced, InPlace };

// What a missing directory of an output path means: a typo in a path given on the command line
// (refused), or the run's own working area named in the config, such as the demo's
// strata-run/metrics.jsonl (created, as the data cache's directory is).
enum class MissingDirectory : std::uint8_t { Refuse, Create };

// Refuses, before any work, an output path that cannot be written: a directory; a device, FIFO or
// socket where the file is replaced; a file that is not writable; a directory that does not exist
// (unless `missing` says to create it) or is not writable. ConfigError naming `what` (the flag or
// key), the path and the fix. An empty path (no such output) passes.
void check_output_path(const std::string& path, std::string_view what, OutputWrite how,
                       MissingDirectory missing = MissingDirectory::Refuse);

// Refuses an output path that resolves (symbolic links and `..` followed) to one of the command's
// inputs: equal to one of `input_files`, or inside one of `input_dirs`. Writing it would destroy
// what the command reads. ConfigError naming `what`, both paths and the fix. Empty entries and an
// empty `out` are skipped.
void check_output_not_input(const std::string& out, std::string_view what, const std::vector<std::string>& input_files,
                            const std::vector<std::string>& input_dirs);

// `p` absolute, with symbolic links and `..` resolved as far as the path exists.
std::filesystem::path canonical_path(const std::string& p);
// Whether `inner` is `outer` or lies inside it (both canonical).
bool is_within(const std::filesystem::path& inner, const std::filesystem::path& outer);

// Whether `a` and `b` resolve (symbolic links and `..` followed) to the same file; never for an
// existing device or FIFO, which several outputs may share (/dev/stdout).
bool same_resolved_path(const std::string& a, const std::string& b);

// A text output written in place with sequential write(2) calls, so pipes and terminals work too.
// Every call is checked: short writes are completed, EINTR retried, and a failure (ENOSPC on a full
// disk) is an IoError naming `what`, the path and the bytes written so far; close() fsyncs a
// regular file and checks close(2), where delayed write errors surface.
class OutputFile {
 public:
  enum class Mode : std::uint8_t { Append, Truncate };
  OutputFile(std::string path, std::string what, Mode mode);
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();  // closes without checking; call close() to learn whether the bytes landed

  void write(std::string_view text);
  void close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string what_;
  UniqueFd fd_;
  bool regular_file_ = false;
  std::uint64_t written_bytes_ = 0;
};

}  // namespace strata::train
