// Helpers shared by the offload tests: a private temporary directory on a real file system
// (O_DIRECT needs one; tmpfs refuses it), deterministic byte patterns, and aligned buffers.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/host_buffer.h"
#include "offload/file.h"

namespace strata::offload::testing {

// mkdtemp under $STRATA_TEST_DIR, else $TMPDIR, else the current directory (the build tree under
// ctest); removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("STRATA_TEST_DIR");
    if (base == nullptr) base = std::getenv("TMPDIR");
    std::string root = base != nullptr ? base : std::filesystem::current_path().string();
    std::string templ = root + "/strata-offload-test-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed under " + root);
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const {
    std::filesystem::create_directories(path_ + "/" + name);
    return path_ + "/" + name;
  }

 private:
  std::string path_;
};

// The reason O_DIRECT does not work in `dir`, or "" when it does.
inline std::string direct_io_problem(const std::string& dir) { return probe_direct_io(check_directory(dir, "test dir")); }

#define STRATA_SKIP_WITHOUT_DIRECT_IO(dir)                                                       \
  do {                                                                                           \
    const std::string why_ = ::strata::offload::testing::direct_io_problem(dir);                 \
    if (!why_.empty()) GTEST_SKIP() << "O_DIRECT unavailable in " << (dir) << ": " << why_      \
                                    << " (set STRATA_TEST_DIR to a directory on a real drive)"; \
  } while (0)

// Byte i of pattern `seed` (distinct per position and seed, so misplaced blocks show).
inline std::byte pattern_byte(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  return static_cast<std::byte>(x & 0xFF);
}

inline void fill_pattern(std::byte* p, std::size_t n, std::uint64_t seed, std::uint64_t first_index = 0) {
  for (std::size_t i = 0; i < n; ++i) p[i] = pattern_byte(seed, first_index + i);
}

// Index of the first byte that differs from the pattern, or -1.
inline long long first_mismatch(const std::byte* p, std::size_t n, std::uint64_t seed, std::uint64_t first_index = 0) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != pattern_byte(seed, first_index + i)) return static_cast<long long>(i);
  }
  return -1;
}

inline HostBuffer aligned_buffer(std::size_t bytes) {
  HostBuffer b = HostBuffer::allocate(bytes);
  std::memset(b.data(), 0, bytes);
  return b;
}

}  // namespace strata::offload::testing
