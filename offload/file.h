// Files of the NVMe tier: safe creation of files inside the directory a user named (0600, no
// symlinks, no `..`, nothing outside it), and the checks that turn a bad swap directory into one
// clear message (missing, not a directory, not writable, no O_DIRECT, too small — with the
// numbers). Descriptors, exact reads and writes and fsync are core/file_io.h's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/file_io.h"

namespace strata::offload {

// The descriptor is core's (core/file_io.h, where the checked reads, writes and fsyncs live);
// named here too because the NVMe tier's callers spell it offload::UniqueFd.
using strata::UniqueFd;

enum class Direct : std::uint8_t { Off, On };
enum class Truncate : std::uint8_t { Keep, Truncate };

// Checks that `dir` exists, is a directory and is writable; returns its canonical path.
// Throws ConfigError naming the directory and the fix.
std::string check_directory(const std::string& dir, const std::string& what);

// Joins dir and a plain file name, refusing names that could leave the directory (empty, ".",
// "..", containing '/' or NUL). Throws ConfigError.
std::string path_inside(const std::string& canonical_dir, const std::string& name);

// Opens (creating with mode 0600 when missing) `name` inside `canonical_dir` for reading and
// writing. Refuses a symlink at that name (O_NOFOLLOW) and anything that is not a regular file;
// the directory is opened first and the file opened relative to it (openat), so a directory
// swapped for a symlink after the check cannot redirect the file. Throws IoError/ConfigError.
UniqueFd open_inside(const std::string& canonical_dir, const std::string& name, Direct direct, Truncate truncate);

// Whether files in `canonical_dir` accept O_DIRECT reads and writes of 4 KiB (tries a hidden
// probe file, removed afterwards). Returns "" when they do, else the reason.
std::string probe_direct_io(const std::string& canonical_dir);

// Free bytes for an unprivileged writer on the file system holding `dir` (statvfs f_bavail).
std::uint64_t free_bytes(const std::string& dir);

// Reserves [0, bytes) of the file on disk (fallocate, falling back to writing zeros where the
// file system has no fallocate). Throws IoError with the numbers on ENOSPC.
void preallocate(int fd, const std::string& path, std::uint64_t bytes);

}  // namespace strata::offload
