// Files of the NVMe tier (see offload/file.h).
#include "offload/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "core/file_io.h"
#include "core/host_buffer.h"
#include "core/units.h"

namespace strata::offload {

std::string check_directory(const std::string& dir, const std::string& what) {
  struct stat st {};
  if (dir.empty()) throw ConfigError(fmt::format("{}: no directory given", what));
  if (::stat(dir.c_str(), &st) != 0) {
    throw ConfigError(fmt::format("{} '{}' does not exist ({}); create it or point {} at an existing directory", what,
                                  dir, errno_text(errno), what));
  }
  if (!S_ISDIR(st.st_mode)) throw ConfigError(fmt::format("{} '{}' is not a directory", what, dir));
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw ConfigError(fmt::format("{} '{}' is not writable by this user ({}); fix its permissions or choose another",
                                  what, dir, errno_text(errno)));
  }
  char resolved[PATH_MAX];
  if (::realpath(dir.c_str(), resolved) == nullptr) {
    throw ConfigError(fmt::format("{} '{}' cannot be resolved: {}", what, dir, errno_text(errno)));
  }
  return resolved;
}

std::string path_inside(const std::string& canonical_dir, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    throw ConfigError(fmt::format("file name '{}' would leave the directory {}; use a plain file name without '/' or '..'",
                                  name, canonical_dir));
  }
  return canonical_dir + "/" + name;
}

UniqueFd open_inside(const std::string& canonical_dir, const std::string& name, Direct direct, Truncate truncate) {
  const std::string path = path_inside(canonical_dir, name);
  UniqueFd dirfd(::open(canonical_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (!dirfd.valid()) {
    throw IoError(fmt::format("cannot open directory {}: {}", canonical_dir, errno_text(errno)), errno);
  }
  int flags = O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW;
  if (direct == Direct::On) flags |= O_DIRECT;
  if (truncate == Truncate::Truncate) flags |= O_TRUNC;
  UniqueFd fd(::openat(dirfd.get(), name.c_str(), flags, 0600));
  if (!fd.valid()) {
    const int e = errno;
    if (e == ELOOP) {
      throw ConfigError(fmt::format("{} is a symbolic link; Strata refuses to follow links out of its directory {}. "
                                    "Remove the link",
                                    path, canonical_dir));
    }
    throw IoError(fmt::format("cannot open {}{}: {}", path, direct == Direct::On ? " with O_DIRECT" : "", errno_text(e)),
                  e);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw ConfigError(fmt::format("{} is not a regular file; remove it or choose another directory", path));
  }
  if ((st.st_mode & 0077) != 0) {
    // An existing file made by someone else's umask: swap data is private.
    if (::fchmod(fd.get(), 0600) != 0) {
      throw IoError(fmt::format("cannot restrict {} to mode 0600: {}", path, errno_text(errno)), errno);
    }
  }
  return fd;
}

std::string probe_direct_io(const std::string& canonical_dir) {
  const std::string name = fmt::format(".strata-direct-probe-{}", ::getpid());
  UniqueFd fd;
  try {
    fd = open_inside(canonical_dir, name, Direct::On, Truncate::Truncate);
  } catch (const Error& e) {
    return e.what();
  }
  HostBuffer buf = HostBuffer::allocate(4096);
  std::memset(buf.data(), 0x5A, 4096);
  const std::string path = path_inside(canonical_dir, name);
  std::string reason;
  try {
    write_exact(fd.get(), buf.data(), 4096, 0, path);
  } catch (const Error& e) {
    reason = fmt::format("O_DIRECT write of 4 KiB failed: {}", e.what());
  }
  if (reason.empty()) {
    try {
      read_exact(fd.get(), buf.data(), 4096, 0, path);
    } catch (const Error& e) {
      reason = fmt::format("O_DIRECT read of 4 KiB failed: {}", e.what());
    }
  }
  fd.reset();
  ::unlink(path.c_str());
  return reason;
}

std::uint64_t free_bytes(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return 0;
  return static_cast<std::uint64_t>(s.f_bavail) * s.f_frsize;
}

void preallocate(int fd, const std::string& path, std::uint64_t bytes) {
  if (bytes == 0) return;
  int r = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (r == 0) return;
  if (r == ENOSPC) {
    throw IoError(fmt::format("cannot reserve {} for {}: the drive is full ({} free); free space or give a smaller size",
                              format_bytes(bytes), path, format_bytes(free_bytes(path.substr(0, path.rfind('/'))))),
                  r);
  }
  throw IoError(fmt::format("cannot reserve {} for {}: {}", format_bytes(bytes), path, errno_text(r)), r);
}

}  // namespace strata::offload
