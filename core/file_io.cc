// Checked POSIX file I/O (see core/file_io.h).
#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

namespace strata {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void UniqueFd::reset() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

std::optional<std::string> refused_output_link(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return std::nullopt;
  const std::string absolute = std::filesystem::absolute(path).lexically_normal().string();
  if (absolute.rfind("/dev/", 0) == 0 || absolute.rfind("/proc/", 0) == 0) return std::nullopt;
  std::error_code ec;
  const std::filesystem::path target = std::filesystem::read_symlink(path, ec);
  return ec ? std::string("?") : target.string();
}

UniqueFd open_output_file(const std::string& path, std::string_view what, OutputOpen mode) {
  struct stat st {};
  const bool system_link = ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode) && !refused_output_link(path);
  // O_NONBLOCK: opening a FIFO that no process reads would otherwise wait for a reader, forever;
  // it fails with ENXIO instead. Cleared once open, so writes wait as they always do.
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | (mode == OutputOpen::Append ? O_APPEND : O_TRUNC);
  if (!system_link) flags |= O_NOFOLLOW;  // also when a link is planted after the check above
  UniqueFd fd(::open(path.c_str(), flags, 0644));
  if (fd.valid()) {
    const int status = ::fcntl(fd.get(), F_GETFL);
    if (status == -1 || ::fcntl(fd.get(), F_SETFL, status & ~O_NONBLOCK) == -1) {
      const int err = errno;
      throw IoError(fmt::format("{}: cannot set up '{}' for writing: {}", what, path, errno_text(err)), err);
    }
  }
  if (!fd.valid()) {
    const int err = errno;
    if (err == ENXIO) {
      throw IoError(fmt::format("{}: '{}' is a FIFO that no process reads; Strata does not wait for a reader: start "
                                "the reader first (e.g. `cat {} &`) or give a regular file",
                                what, path, path),
                    err);
    }
    if (err == ELOOP) {
      throw IoError(fmt::format("{}: '{}' is a symbolic link (to '{}'); Strata never writes through a link, which "
                                "could overwrite the file it points to: remove the link or give another path",
                                what, path, refused_output_link(path).value_or("?")),
                    err);
    }
    throw IoError(fmt::format("{}: cannot open '{}' for writing: {}", what, path, errno_text(err)), err);
  }
  return fd;
}

UniqueFd open_for_read(const std::string& path, std::string_view what, Symlinks symlinks) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever; it is
  // refused below, and on a regular file the flag changes nothing.
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
  if (symlinks == Symlinks::Refuse) flags |= O_NOFOLLOW;
  UniqueFd fd(::open(path.c_str(), flags));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ELOOP && symlinks == Symlinks::Refuse) {
      throw IoError(fmt::format("cannot open {} {}: it is a symbolic link, which Strata does not follow here; put the "
                                "file itself there",
                                what, path),
                    err);
    }
    throw IoError(fmt::format("cannot open {} {}: {}; check the path", what, path, errno_text(err)), err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    const int err = errno;
    throw IoError(fmt::format("cannot stat {} {}: {}", what, path, errno_text(err)), err);
  }
  if (S_ISDIR(st.st_mode)) {
    throw IoError(fmt::format("{} {} is a directory; give the path of the file itself", what, path), EISDIR);
  }
  if (!S_ISREG(st.st_mode)) {
    throw IoError(fmt::format("{} {} is not a regular file (a FIFO, socket or device); Strata reads a {} from a "
                              "regular file only: copy the data into one",
                              what, path, what),
                  EINVAL);
  }
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void ensure_directory(const std::string& dir, std::string_view what) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) throw ConfigError(fmt::format("{} {} exists and is not a directory", what, dir));
    return;
  }
  std::string parent = dir;
  while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
  const std::size_t slash = parent.rfind('/');
  parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : parent.substr(0, slash));
  if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw ConfigError(fmt::format("{} {} does not exist, and neither does its parent {}; Strata creates only the last "
                                  "component of a path: check it for a typo, or create {} first",
                                  what, dir, parent, parent));
  }
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    const int err = errno;
    throw ConfigError(fmt::format("{} {} cannot be created: {}; choose a writable location", what, dir,
                                  errno_text(err)));
  }
}

UniqueFd create_new_file(const std::string& path, std::string_view what, unsigned mode) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, static_cast<mode_t>(mode)));
  if (!fd.valid()) {
    const int err = errno;
    throw IoError(fmt::format("cannot create {} {}: {}; check that its directory exists and is writable", what, path,
                              errno_text(err)),
                  err);
  }
  return fd;
}

std::uint64_t file_size_bytes(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    throw IoError(fmt::format("cannot stat {}: {}", path, errno_text(err)), err);
  }
  return static_cast<std::uint64_t>(st.st_size);
}

void read_exact(int fd, void* dst, std::size_t bytes, std::uint64_t offset, const std::string& path) {
  auto* out = static_cast<char*>(dst);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, out + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      throw IoError(
          fmt::format("reading {} ({} bytes at offset {}): {}", path, bytes - done, offset + done, errno_text(err)),
          err);
    }
    if (n == 0) {
      throw FormatError(fmt::format("{} is truncated: {} bytes were expected at offset {}, the file ends at byte {}",
                                    path, bytes, offset, offset + done));
    }
    done += static_cast<std::size_t>(n);
  }
}

IoError write_error(const std::string& path, std::size_t bytes, std::uint64_t offset, int err) {
  return IoError(fmt::format("writing {} ({} bytes at offset {}): {}", path, bytes, offset, errno_text(err)), err);
}

void write_exact(int fd, const void* src, std::size_t bytes, std::uint64_t offset, const std::string& path) {
  const auto* in = static_cast<const char*>(src);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pwrite(fd, in + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // A write that takes nothing without an error is a full device (the kernel's short write).
      const int err = n < 0 ? errno : ENOSPC;
      throw write_error(path, bytes - done, offset + done, err);
    }
    done += static_cast<std::size_t>(n);
  }
}

void resize_file(int fd, const std::string& path, std::uint64_t bytes) {
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    throw IoError(fmt::format("cannot resize {} to {} bytes: {}", path, bytes, errno_text(err)), err);
  }
}

void fsync_file(int fd, const std::string& path) {
  if (::fsync(fd) != 0) {
    const int err = errno;
    throw IoError(fmt::format("fsync of {} failed: {}", path, errno_text(err)), err);
  }
}

void fsync_directory(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    throw IoError(fmt::format("cannot open directory {}: {}", dir, errno_text(err)), err);
  }
  fsync_file(fd.get(), dir);
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    throw IoError(fmt::format("cannot rename {} to {}: {}", from, to, errno_text(err)), err);
  }
}

std::string read_text_file(const std::string& path, std::string_view what) {
  const UniqueFd fd = open_for_read(path, what);
  std::string text;
  for (;;) {
    const std::size_t at = text.size();
    text.resize(at + (std::size_t{64} << 10));
    const ssize_t n = ::pread(fd.get(), text.data() + at, text.size() - at, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) {
      text.resize(at);
      continue;
    }
    if (n < 0) {
      const int err = errno;
      throw IoError(fmt::format("reading {} {} at offset {}: {}", what, path, at, errno_text(err)), err);
    }
    text.resize(at + static_cast<std::size_t>(n));
    if (n == 0) return text;
  }
}

AtomicFileWriter::AtomicFileWriter(std::string path, unsigned mode)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  // The rename would replace whatever is at the path: a device or FIFO (/dev/full, as root) must
  // not be swapped for a regular file.
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
    throw IoError(fmt::format("cannot write {}: it is not a regular file (a directory, device, FIFO or socket), and "
                              "writing it replaces it whole; give a regular file's path",
                              path_),
                  EINVAL);
  }
  if (::unlink(tmp_path_.c_str()) != 0 && errno != ENOENT) {  // a crash's leftover
    const int err = errno;
    throw IoError(fmt::format("cannot remove the leftover {}: {}; remove it by hand", tmp_path_, errno_text(err)), err);
  }
  fd_ = create_new_file(tmp_path_, "temporary file", mode);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) {
    fd_.reset();
    ::unlink(tmp_path_.c_str());
  }
}

void AtomicFileWriter::append(const void* src, std::size_t bytes) {
  write_exact(fd_.get(), src, bytes, appended_bytes_, tmp_path_);
  appended_bytes_ += bytes;
}

void AtomicFileWriter::commit() {
  fsync_file(fd_.get(), tmp_path_);
  // close() reports what some file systems (NFS) defer to it; release so the destructor does not
  // close the number again.
  if (::close(fd_.release()) != 0) {
    const int err = errno;
    throw IoError(fmt::format("close of {} failed: {}", tmp_path_, errno_text(err)), err);
  }
  rename_path(tmp_path_, path_);
  committed_ = true;  // the temporary is gone: nothing to remove from here on
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  fsync_directory(dir.empty() ? "." : dir);
}

}  // namespace strata
