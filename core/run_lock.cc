// Exclusive ownership of a path a run writes (core/run_lock.h, Note [Run locks] in core/run_lock.h).
#include "core/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace strata {

namespace {

std::string process_start_text() {
  static const std::string text = [] {
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    char buf[64];
    std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &utc);
    return std::string(buf);
  }();
  return text;
}

// The command line from /proc/self/cmdline, the program by its base name, at most ~100 characters.
std::string command_text() {
  std::string cmdline;
  try {
    cmdline = read_text_file("/proc/self/cmdline", "command line");
  } catch (const std::exception&) {
    return "unknown command";
  }
  while (!cmdline.empty() && cmdline.back() == '\0') cmdline.pop_back();
  const std::size_t first_end = cmdline.find('\0');
  const std::size_t slash = cmdline.rfind('/', first_end);
  if (slash != std::string::npos) cmdline.erase(0, slash + 1);
  for (char& c : cmdline) {
    if (c == '\0' || c == '\n') c = ' ';
  }
  if (cmdline.size() > 100) cmdline = cmdline.substr(0, 97) + "...";
  return cmdline.empty() ? "unknown command" : cmdline;
}

// What the holder wrote, for the refusal message (best effort: it may be mid-write).
std::string read_holder(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "a process that has not written its name yet";
  std::string s(buf, static_cast<std::size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace

std::string run_lock_holder_line() {
  char host[256] = "unknown host";
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown host");
  host[sizeof(host) - 1] = '\0';
  return fmt::format("pid {} on host {} since {} ({})", ::getpid(), host, process_start_text(), command_text());
}

RunLock& RunLock::operator=(RunLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::move(other.fd_);
    lock_path_ = std::move(other.lock_path_);
  }
  return *this;
}

RunLock RunLock::acquire(const std::string& guarded, std::string_view what, std::string lock_path) {
  RunLock lock;
  lock.lock_path_ = lock_path.empty() ? guarded + ".lock" : std::move(lock_path);
  const std::string& path = lock.lock_path_;
  for (int attempt = 0;; ++attempt) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd.valid()) {
      const int err = errno;
      if (err == ELOOP) {  // Note [No writing through links] in core/file_io.h
        throw ConfigError(fmt::format("the lock file {} of {} {} is a symbolic link (to '{}'); Strata never writes "
                                      "through a link. A run makes its own lock file: remove the link",
                                      path, what, guarded, refused_output_link(path).value_or("?")));
      }
      throw IoError(fmt::format("cannot create the lock file {} of {} {} ({}); check that the directory exists and "
                                "is writable",
                                path, what, guarded, std::strerror(err)),
                    err);
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) {
        throw ConfigError(fmt::format("{} {} is in use by another run: {} (lock file {}). Two runs must not share it: "
                                      "wait for that run to end, stop it, or give this run another path",
                                      what, guarded, read_holder(fd.get()), path));
      }
      const int err = errno;
      throw IoError(fmt::format("cannot lock {} ({})", path, std::strerror(err)), err);
    }
    // The file we locked must still be the one at the path: a holder that released meanwhile
    // unlinked it, and a third run may have made a new one.
    struct stat locked {}, now {};
    if (::fstat(fd.get(), &locked) != 0 || ::stat(path.c_str(), &now) != 0 || locked.st_ino != now.st_ino ||
        locked.st_dev != now.st_dev) {
      if (attempt < 16) continue;
      throw IoError(fmt::format("cannot lock {}: it keeps being replaced by other processes", path), EAGAIN);
    }
    char first = 0;
    if (::pread(fd.get(), &first, 1, 0) == 1) {  // a non-empty lock file nobody holds: its run died
      spdlog::info("{} {}: taking over the lock left by a run that ended without releasing it ({})", what, guarded,
                   read_holder(fd.get()));
    }
    const std::string line = run_lock_holder_line() + "\n";
    resize_file(fd.get(), path, 0);
    write_exact(fd.get(), line.data(), line.size(), 0, path);
    lock.fd_ = std::move(fd);
    return lock;
  }
}

void RunLock::release() noexcept {
  if (!fd_.valid()) return;
  ::unlink(lock_path_.c_str());  // while still holding the lock (Note [Run locks] in core/run_lock.h)
  fd_.reset();
}

}  // namespace strata
