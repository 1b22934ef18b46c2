// Errors and the one CHECK family.
//
// Two kinds of failure, kept apart on purpose (docs/DESIGN.md, "Errors and data"):
//  * Recoverable failures of the world outside the program — bad configs, I/O errors, full
//    devices, corrupt files — are typed exceptions derived from strata::Error. Each carries the
//    thing, the place and the fix in its message, so the top level prints one clear line.
//  * Broken invariants and failed library calls (errno, CUDA, cuBLAS, NCCL) go through the
//    STRATA_CHECK family below, which throws InternalError carrying file:line, the failing call or
//    condition, and the library's error code and text. The CUDA/cuBLAS/NCCL members live in
//    core/cuda_check.h so that host-only code never includes CUDA headers.
//
// In CUDA translation units (.cu) fmt is not included (nvcc's front end cannot evaluate fmt's
// consteval format checks), so there STRATA_CHECK takes a plain message string without arguments.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

#if !defined(__CUDACC__)
#include <fmt/format.h>
#endif

namespace strata {

// Base of every error Strata reports to a user.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A config file, config key or command-line flag is wrong.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// An I/O call failed (open, read, write, fsync, io_uring); the message names path, offset, length.
class IoError : public Error {
 public:
  IoError(const std::string& what, int err) : Error(what), errno_value_(err) {}
  int errno_value() const { return errno_value_; }

 private:
  int errno_value_;
};

// A file's contents are wrong: corrupt, truncated, from another model, failed checksum.
class FormatError : public Error {
 public:
  using Error::Error;
};

// A memory tier is full. The message includes the usage report of that tier.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// A device, stream or event was misused (destroyed device, event never recorded, ...).
class DeviceError : public Error {
 public:
  using Error::Error;
};

// This rank stops because another rank of the job failed (another_rank_failed,
// comm/communicator.h); the failing rank's own error says why.
class AnotherRankFailed : public Error {
 public:
  using Error::Error;
};

// A CHECK fired: a broken invariant or a failed library call. Not the user's fault.
class InternalError : public Error {
 public:
  using Error::Error;
};

// A file-system error (std::filesystem) as one line: the path(s), the cause and the fix.
std::string filesystem_message(const std::filesystem::filesystem_error& e);

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, std::string_view expr, std::string_view detail);
[[noreturn]] void errno_check_failed(const char* file, int line, std::string_view expr, int err);
}  // namespace detail

// Returns strerror(err) as a string (thread-safe).
std::string errno_text(int err);

}  // namespace strata

// STRATA_CHECK(cond, fmt, args...): throws InternalError("file:line: check failed: cond: message").
#if defined(__CUDACC__)
#define STRATA_CHECK(cond, message)                                                      \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      ::strata::detail::check_failed(__FILE__, __LINE__, #cond, message);                \
    }                                                                                    \
  } while (0)
#else
#define STRATA_CHECK(cond, ...)                                                          \
  do {                                                                                   \
    if (!(cond)) [[unlikely]] {                                                          \
      ::strata::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
    }                                                                                    \
  } while (0)
#endif

// STRATA_CHECK_ERRNO(call): for POSIX calls returning -1 and setting errno. Evaluates to the result.
#define STRATA_CHECK_ERRNO(call)                                                         \
  ([&]() {                                                                               \
    auto strata_result_ = (call);                                                        \
    if (strata_result_ == -1) [[unlikely]] {                                             \
      ::strata::detail::errno_check_failed(__FILE__, __LINE__, #call, errno);            \
    }                                                                                    \
    return strata_result_;                                                               \
  }())

// STRATA_CHECK_NEGERRNO(call): for calls returning -errno on failure (liburing). Evaluates to the result.
#define STRATA_CHECK_NEGERRNO(call)                                                      \
  ([&]() {                                                                               \
    auto strata_result_ = (call);                                                        \
    if (strata_result_ < 0) [[unlikely]] {                                               \
      ::strata::detail::errno_check_failed(__FILE__, __LINE__, #call, -strata_result_);  \
    }                                                                                    \
    return strata_result_;                                                               \
  }())
