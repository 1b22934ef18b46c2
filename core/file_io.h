// Checked POSIX file I/O, the one module every file Strata reads or writes goes through (swap
// files, checkpoints, safetensors, token files): an owning descriptor, opening with one clear
// error, exact positional reads and writes (short transfers completed, EINTR retried, the path,
// byte count and offset in every error, a file that ends early a FormatError), fsync of a file and
// of a directory, and atomic replacement (temporary, fsync, rename, fsync of the directory) so a
// failed save leaves the previous file intact. Policies that belong to one kind of file stay with
// it: the swap directory's safety checks in offload/file.h, the checkpoint's fault injection in
// checkpoint/checkpoint_writer.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace strata {

// Owns one file descriptor (closed on destruction); move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset() noexcept;

 private:
  int fd_ = -1;
};

enum class Symlinks : std::uint8_t { Follow, Refuse };

// Opens `path` for reading. IoError naming `what` (e.g. "token file"), the path and errno; with
// Symlinks::Refuse a symbolic link at `path` is refused (O_NOFOLLOW) with a message saying so. A
// directory, FIFO, socket or device is refused with a message saying what it is (a FIFO would
// block the read forever).
UniqueFd open_for_read(const std::string& path, std::string_view what, Symlinks symlinks = Symlinks::Follow);

// Note [No writing through links]: where Strata writes a file in place (metrics, trace, summary,
// lock files), a symbolic link at the path is refused, never followed: a planted link would turn
// the write into an overwrite of whatever it points to (a checkpoint, a swap file, someone's
// weights). Files replaced whole rename a new file over the path and so replace a link instead of
// writing through it; the tools refuse links there too (train/output_file.h), so every output path
// has one rule. The system's own links under /dev/ and /proc/ (/dev/stdout, /dev/fd/N) name a
// stream the user chose and are followed.
//
// The target of `path` when `path` itself is a symbolic link Strata refuses to write through (see
// the note); nullopt when it is not a link or is one of the system's.
std::optional<std::string> refused_output_link(const std::string& path);

// Opens `path` to write in place, sequentially (pipes and terminals work too): created 0644 when
// missing, then appended to or truncated. A link at the path is refused (Note [No writing through
// links]); IoError naming `what`, the path and the cause.
enum class OutputOpen : std::uint8_t { Append, Truncate };
UniqueFd open_output_file(const std::string& path, std::string_view what, OutputOpen mode);

// Makes directory `dir` when it is missing, creating its last component only (a mistyped path must
// not grow a chain of directories). ConfigError naming `what`, the path and the fix when the parent
// is missing, `dir` is not a directory, or mkdir fails (read-only file system, permissions).
void ensure_directory(const std::string& dir, std::string_view what);
// Creates `path` for writing with permission bits `mode`; never opens an existing file or follows
// a link (O_EXCL | O_NOFOLLOW). IoError naming `what`, the path and the fix.
UniqueFd create_new_file(const std::string& path, std::string_view what, unsigned mode);

// Size of the open file in bytes; IoError naming the path.
std::uint64_t file_size_bytes(int fd, const std::string& path);

// Reads exactly `bytes` at `offset`. A file that ends first is a FormatError naming the path, the
// offset asked for and where the file ends; a failing read is an IoError naming path, count, offset.
void read_exact(int fd, void* dst, std::size_t bytes, std::uint64_t offset, const std::string& path);

// Writes exactly `bytes` at `offset`, completing short writes. IoError (ENOSPC when the kernel
// stops taking bytes) naming the path, the byte count and the offset.
void write_exact(int fd, const void* src, std::size_t bytes, std::uint64_t offset, const std::string& path);

// The IoError write_exact throws for errno `err`: for callers that fail a write before the kernel
// does (the checkpoint's fault injection) and must read the same.
IoError write_error(const std::string& path, std::size_t bytes, std::uint64_t offset, int err);

// Truncates or extends the open file to `bytes` (ftruncate); IoError naming the path and size.
void resize_file(int fd, const std::string& path, std::uint64_t bytes);

// fsync of an open file; of a directory by name (makes a rename or a new entry in it durable).
void fsync_file(int fd, const std::string& path);
void fsync_directory(const std::string& dir);

// rename(2) with an IoError naming both paths.
void rename_path(const std::string& from, const std::string& to);

// The whole file as bytes (also files whose size stat does not know, as under /proc). IoError
// naming `what` and the path when it cannot be opened or read.
std::string read_text_file(const std::string& path, std::string_view what);

// Replaces `path` atomically: the bytes go to `path`.tmp (removed first if a crash left one, then
// created afresh with `mode`), and commit() fsyncs it, renames it over `path` and fsyncs the
// directory. Until commit() succeeds `path` is as it was; a writer destroyed before that removes
// the temporary.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path, unsigned mode = 0644);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Appends to the temporary (write_exact at the end of what was appended so far).
  void append(const void* src, std::size_t bytes);
  void commit();

  // For callers that write through their own checked wrapper (positional, then commit()).
  int fd() const { return fd_.get(); }
  const std::string& temp_path() const { return tmp_path_; }

 private:
  std::string path_, tmp_path_;
  UniqueFd fd_;
  std::uint64_t appended_bytes_ = 0;
  bool committed_ = false;
};

}  // namespace strata
