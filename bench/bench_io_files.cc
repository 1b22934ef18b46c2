// The test files of `strata bench io` (see bench/bench_io_files.h).
#include "bench/bench_io_files.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "core/file_io.h"
#include "offload/file.h"

namespace strata::bench::bench_io {

using offload::IoOp;

FileState parse_file_state(const std::string& text) {
  if (text == "written") return FileState::Written;
  if (text == "fallocated") return FileState::Fallocated;
  throw ConfigError(fmt::format("--file-state '{}': use written or fallocated", text));
}

void prefill(offload::IoEngine& engine, std::vector<TestFile>& files, std::span<std::byte> buffer,
             std::uint64_t file_bytes) {
  const std::size_t chunk = std::min<std::size_t>(buffer.size(), 64 * MiB);
  for (auto& f : files) {
    for (std::uint64_t off = 0; off < file_bytes; off += chunk) {
      offload::IoRequest r{IoOp::Write, f.id, off, buffer.data(), static_cast<std::size_t>(std::min<std::uint64_t>(chunk, file_bytes - off))};
      engine.run(std::span(&r, 1));
    }
  }
}

void reallocate(const std::vector<TestFile>& files, std::uint64_t file_bytes) {
  for (const auto& f : files) {
    if (f.device) {
      throw ConfigError(fmt::format("--file-state fallocated: {} is a block device; use --file-state written", f.path));
    }
    const auto len = static_cast<off_t>(file_bytes);
    if (::fallocate(f.fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, len) != 0) {
      throw IoError(fmt::format("--file-state fallocated: cannot punch a hole in {}: {}; use --file-state written",
                                f.path, errno_text(errno)),
                    errno);
    }
    offload::preallocate(f.fd.get(), f.path, file_bytes);
    fsync_file(f.fd.get(), f.path);
  }
}

std::vector<TestFile> open_test_files(const std::vector<std::string>& dirs, std::uint64_t file_bytes) {
  std::vector<TestFile> files;
  for (const auto& d : dirs) {
    TestFile f;
    f.dir = offload::check_directory(d, "--dir");
    if (auto why = offload::probe_direct_io(f.dir); !why.empty()) {
      throw ConfigError(fmt::format("{} does not support O_DIRECT ({}); choose a directory on a real drive", f.dir, why));
    }
    const std::uint64_t have = offload::free_bytes(f.dir);
    if (have < file_bytes) {
      throw ConfigError(fmt::format("{} has {} free but the benchmark needs {}; lower --size", f.dir,
                                    format_bytes(have), format_bytes(file_bytes)));
    }
    f.path = offload::path_inside(f.dir, "strata-bench-io.dat");
    f.fd = offload::open_inside(f.dir, "strata-bench-io.dat", offload::Direct::On, offload::Truncate::Keep);
    offload::preallocate(f.fd.get(), f.path, file_bytes);
    files.push_back(std::move(f));
  }
  return files;
}

std::vector<TestFile> open_test_devices(const std::vector<std::string>& devices, std::uint64_t file_bytes,
                                        DeviceAccess access) {
  std::vector<TestFile> files;
  const bool write = access == DeviceAccess::Destructive;
  for (const auto& d : devices) {
    struct stat st {};
    if (::stat(d.c_str(), &st) != 0) {
      throw ConfigError(fmt::format("--device {}: {}; give a block device such as /dev/nvme0n1", d, errno_text(errno)));
    }
    if (!S_ISBLK(st.st_mode)) {
      throw ConfigError(fmt::format("--device {}: not a block device ({}); give one such as /dev/nvme0n1, or measure a "
                                    "directory on the drive with --dir",
                                    d, S_ISDIR(st.st_mode) ? "a directory" : "a file"));
    }
    // O_EXCL on a block device claims it: a mounted device (or one with a mounted partition) is busy.
    const int flags = O_DIRECT | O_CLOEXEC | (write ? O_RDWR | O_EXCL : O_RDONLY);
    TestFile f;
    f.fd = UniqueFd(::open(d.c_str(), flags));
    if (!f.fd.valid()) {
      const int e = errno;
      throw ConfigError(fmt::format("--device {}: cannot open it {}: {}{}", d, write ? "for writing" : "read-only",
                                    errno_text(e),
                                    e == EBUSY ? " (mounted or in use; --destructive needs a device nothing holds)"
                                               : ""));
    }
    std::uint64_t bytes = 0;
    if (::ioctl(f.fd.get(), BLKGETSIZE64, &bytes) != 0) {
      throw IoError(fmt::format("--device {}: cannot read its size: {}", d, errno_text(errno)), errno);
    }
    if (bytes < file_bytes) {
      throw ConfigError(fmt::format("--device {} holds {}, less than the {} per path --size asks for; lower --size", d,
                                    format_bytes(bytes), format_bytes(file_bytes)));
    }
    f.dir = f.path = d;
    f.device = true;
    files.push_back(std::move(f));
  }
  return files;
}

}  // namespace strata::bench::bench_io
