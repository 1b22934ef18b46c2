// Checked POSIX file I/O for the model files (safetensors, token files): an RAII descriptor, full
// positional reads and writes that complete short transfers and retry EINTR, and the
// write-temporary-fsync-rename step that keeps a previous good file intact when a save fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::models {

class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor();

  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// Opens for reading; IoError naming the path and errno text. `what` says what the file is for.
FileDescriptor open_for_read(const std::string& path, const std::string& what);
std::uint64_t file_size_bytes(int fd, const std::string& path);

// Reads exactly `bytes` at `offset`; FormatError if the file ends first (truncated), IoError on errors.
void read_exact(int fd, void* dst, std::size_t bytes, std::uint64_t offset, const std::string& path);

// Writes a file through `path`.tmp: the callback writes with write_all, then fsync and rename.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();  // removes the temporary if commit() was not reached
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write_all(const void* src, std::size_t bytes);
  void commit();  // fsync, close, rename over the final name

 private:
  std::string path_, tmp_path_;
  FileDescriptor fd_;
  bool committed_ = false;
};

}  // namespace strata::models
