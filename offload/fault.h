// Fault injection at the engines' completion boundary, for tests of the error paths.
//
// Both engines pass every kernel result (bytes transferred or -errno) through an optional
// FaultInjector before acting on it. A rule rewrites the result of the Nth matching operation
// into EIO, ENOSPC, EAGAIN, EINTR or a short transfer, so tests can prove that hard errors reach
// the caller with path/offset/length, that retries and resubmission happen where they should, and
// that a read never returns bytes the kernel did not deliver (a short read also scribbles over
// the part of the buffer it pretends was not read, so a missing resubmission shows as bad data).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "offload/io_engine.h"

namespace strata::offload {

// Corrupt: a read that succeeds with its first byte flipped, as a drive returning bad data
// without an error (the swap store's checksums must catch it).
enum class FaultKind : std::uint8_t { Eio, Enospc, Eagain, Eintr, ShortTransfer, Corrupt };
const char* fault_kind_name(FaultKind kind);

struct FaultRule {
  FaultKind kind = FaultKind::Eio;
  std::uint64_t nth = 1;          // 1-based index among operations matching `op`
  std::optional<IoOp> op;         // nullopt: reads and writes
  std::uint64_t repeat = 1;       // affect this many consecutive matching operations
};

class FaultInjector {
 public:
  FaultInjector() = default;
  explicit FaultInjector(std::vector<FaultRule> rules) : rules_(std::move(rules)) {}

  void add(const FaultRule& rule);
  // The engines call this with each kernel result; returns the result they should act on.
  // `buffer`/`requested_bytes` describe the transfer (a short read scribbles the unread tail).
  long on_complete(IoOp op, long result, std::byte* buffer, std::size_t requested_bytes);

  // The engines call this with the length of each transfer they are about to issue. A
  // ShortTransfer rule for writes shortens the Nth write here (counted among write submissions),
  // so the kernel really writes less and only a resubmission of the rest completes the data; a
  // short write reported after a full one could not tell a missing resubmission apart.
  std::size_t submit_length(IoOp op, std::size_t length_bytes);

  std::uint64_t injected() const;
  std::uint64_t operations(IoOp op) const;

 private:
  mutable std::mutex mutex_;
  std::vector<FaultRule> rules_;
  std::uint64_t reads_ = 0;
  std::uint64_t writes_ = 0;
  std::uint64_t write_submits_ = 0;
  std::uint64_t injected_ = 0;
};

}  // namespace strata::offload
