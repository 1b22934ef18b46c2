// Output paths and the checked text writer (see train/output_file.h).
#include "train/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <optional>
#include <system_error>

#include <fmt/format.h>

#include "core/error.h"
#include "checkpoint/checkpoint.h"

namespace strata::train {
namespace fs = std::filesystem;

fs::path canonical_path(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::absolute(p).lexically_normal() : r;
}

bool is_within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

namespace {

std::string file_kind(const struct stat& st) {
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "not a regular file";
}

fs::path resolved(const std::string& p) { return canonical_path(p); }

// A file of a checkpoint series, this run's or another's: its `latest` pointer, or anything inside
// one of its step directories (checkpoint/checkpoint.h); or a token cache a run made. An output there
// would break the series or the cache.
std::optional<std::string> checkpoint_part(const std::string& path) {
  const fs::path p = resolved(path);
  const fs::path parent = p.parent_path();
  std::error_code ec;
  if (fs::exists(p.string() + ".source", ec)) {  // a token cache with its record (train/token_cache.h)
    return fmt::format("a token cache of a run (its record is '{}.source')", p.string());
  }
  if (p.filename() == kCheckpointLatest && !checkpoint_steps_in(parent.string()).empty()) {
    return fmt::format("the `latest` pointer of the checkpoints in '{}'", parent.string());
  }
  for (fs::path dir = parent; !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
    const std::string name = dir.filename().string();
    if ((name.rfind("step-", 0) == 0 || name.rfind(".tmp-step-", 0) == 0) &&
        fs::exists(dir / kCheckpointManifest, ec)) {
      return fmt::format("inside the checkpoint '{}'", dir.string());
    }
  }
  return std::nullopt;
}

}  // namespace

void check_output_path(const std::string& path, std::string_view what, OutputWrite how, MissingDirectory missing) {
  if (path.empty()) return;
  if (const std::optional<std::string> target = refused_output_link(path)) {
    throw ConfigError(fmt::format("{} '{}' is a symbolic link (to '{}'); Strata never writes through a link, which "
                                  "could overwrite the file it points to: remove the link or give another path",
                                  what, path, *target));
  }
  if (const std::optional<std::string> part = checkpoint_part(path)) {
    throw ConfigError(fmt::format("{} '{}' is {}; writing it would break what a run reads there: choose an output "
                                  "path outside it",
                                  what, path, *part));
  }
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists) {
    if (S_ISDIR(st.st_mode)) {
      throw ConfigError(fmt::format("{} '{}' is a directory; give the path of a file to write", what, path));
    }
    if (how == OutputWrite::Replaced && !S_ISREG(st.st_mode)) {
      throw ConfigError(fmt::format("{} '{}' is {}; the output replaces the file at its path, so give the path of a "
                                    "regular file (or of none yet)",
                                    what, path, file_kind(st)));
    }
    if (::access(path.c_str(), W_OK) != 0) {
      throw ConfigError(fmt::format("{} '{}' cannot be written: {}; choose another path or fix its permissions", what,
                                    path, errno_text(errno)));
    }
  }
  if (exists && how == OutputWrite::InPlace) return;  // written where it is: its directory does not matter
  const fs::path parent = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  struct stat dir {};
  if (missing == MissingDirectory::Create && ::stat(parent.c_str(), &dir) != 0) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) {
      throw ConfigError(fmt::format("{} '{}': cannot create directory '{}': {}; choose another path", what, path,
                                    parent.string(), ec.message()));
    }
  }
  if (::stat(parent.c_str(), &dir) != 0) {
    throw ConfigError(fmt::format("{} '{}': directory '{}' does not exist; create it or choose another path", what,
                                  path, parent.string()));
  }
  if (!S_ISDIR(dir.st_mode)) {
    throw ConfigError(fmt::format("{} '{}': '{}' is not a directory; choose another path", what, path, parent.string()));
  }
  if (::access(parent.c_str(), W_OK | X_OK) != 0) {
    throw ConfigError(fmt::format("{} '{}': directory '{}' is not writable ({}); choose another path or fix its "
                                  "permissions",
                                  what, path, parent.string(), errno_text(errno)));
  }
}

bool same_resolved_path(const std::string& a, const std::string& b) {
  struct stat st {};
  if (::stat(a.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return false;  // /dev/stdout may take two outputs
  return resolved(a) == resolved(b);
}

void check_output_not_input(const std::string& out, std::string_view what, const std::vector<std::string>& input_files,
                            const std::vector<std::string>& input_dirs) {
  if (out.empty()) return;
  const fs::path o = resolved(out);
  for (const auto& f : input_files) {
    if (!f.empty() && resolved(f) == o) {
      const std::string which = f == out ? std::string("a file") : fmt::format("'{}', a file", f);
      throw ConfigError(fmt::format("{} '{}' is {} this command reads; writing it would destroy the input; choose "
                                    "another output path",
                                    what, out, which));
    }
  }
  for (const auto& d : input_dirs) {
    if (!d.empty() && is_within(o, resolved(d))) {
      throw ConfigError(fmt::format("{} '{}' lies inside '{}', which this command reads; writing there could "
                                    "destroy the input; choose an output path outside it",
                                    what, out, d));
    }
  }
}

OutputFile::OutputFile(std::string path, std::string what, Mode mode) : path_(std::move(path)), what_(std::move(what)) {
  fd_ = open_output_file(path_, what_, mode == Mode::Append ? OutputOpen::Append : OutputOpen::Truncate);
  struct stat st {};
  regular_file_ = ::fstat(fd_.get(), &st) == 0 && S_ISREG(st.st_mode);
}

OutputFile::~OutputFile() = default;

void OutputFile::write(std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd_.get(), text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;  // a write that takes nothing: the device is full
      throw IoError(fmt::format("{}: writing {} bytes to '{}' failed after {} bytes written: {}", what_, text.size(),
                                path_, written_bytes_, errno_text(err)),
                    err);
    }
    text.remove_prefix(static_cast<std::size_t>(n));
    written_bytes_ += static_cast<std::uint64_t>(n);
  }
}

void OutputFile::close() {
  if (!fd_.valid()) return;
  if (regular_file_ && ::fsync(fd_.get()) != 0) {
    const int err = errno;
    throw IoError(fmt::format("{}: flushing '{}' to disk failed: {}", what_, path_, errno_text(err)), err);
  }
  const int fd = fd_.release();
  if (::close(fd) != 0 && errno != EINTR) {
    const int err = errno;
    throw IoError(fmt::format("{}: closing '{}' failed: {}; its last writes may be lost", what_, path_,
                              errno_text(err)),
                  err);
  }
}

}  // namespace strata::train
