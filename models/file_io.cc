// Checked POSIX file I/O for model files (see models/file_io.h).
#include "models/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <fmt/format.h>

#include "core/error.h"

namespace strata::models {

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

FileDescriptor open_for_read(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw IoError(fmt::format("cannot open {} '{}': {}; check the path", what, path, errno_text(err)), err);
  }
  return FileDescriptor(fd);
}

std::uint64_t file_size_bytes(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    throw IoError(fmt::format("cannot stat '{}': {}", path, errno_text(err)), err);
  }
  return static_cast<std::uint64_t>(st.st_size);
}

void read_exact(int fd, void* dst, std::size_t bytes, std::uint64_t offset, const std::string& path) {
  auto* out = static_cast<char*>(dst);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, out + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      const int err = errno;
      throw IoError(fmt::format("read of '{}' failed at offset {} ({} bytes): {}", path, offset + done, bytes - done,
                                errno_text(err)),
                    err);
    }
    if (n == 0) {
      throw FormatError(fmt::format("'{}' is truncated: expected {} bytes at offset {}, the file ends after {}", path,
                                    bytes, offset, offset + done));
    }
    done += static_cast<std::size_t>(n);
  }
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  const int fd = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    throw IoError(fmt::format("cannot create '{}': {}; check the directory exists and is writable", tmp_path_,
                              errno_text(err)),
                  err);
  }
  fd_ = FileDescriptor(fd);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) {
    fd_ = FileDescriptor();
    ::unlink(tmp_path_.c_str());
  }
}

void AtomicFileWriter::write_all(const void* src, std::size_t bytes) {
  const auto* in = static_cast<const char*>(src);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd_.get(), in + done, bytes - done);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      const int err = errno;
      throw IoError(fmt::format("write to '{}' failed: {}", tmp_path_, errno_text(err)), err);
    }
    done += static_cast<std::size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  if (::fsync(fd_.get()) != 0) {
    const int err = errno;
    throw IoError(fmt::format("fsync of '{}' failed: {}", tmp_path_, errno_text(err)), err);
  }
  const int fd = fd_.release();
  if (::close(fd) != 0) {
    const int err = errno;
    throw IoError(fmt::format("close of '{}' failed: {}", tmp_path_, errno_text(err)), err);
  }
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    throw IoError(fmt::format("rename '{}' -> '{}' failed: {}", tmp_path_, path_, errno_text(err)), err);
  }
  committed_ = true;
}

}  // namespace strata::models
