// Fault injection at the engines' completion boundary (see offload/fault.h).
#include "offload/fault.h"

#include <cerrno>
#include <cstring>

namespace strata::offload {

const char* fault_kind_name(FaultKind kind) {
  switch (kind) {
    case FaultKind::Eio: return "EIO";
    case FaultKind::Enospc: return "ENOSPC";
    case FaultKind::Eagain: return "EAGAIN";
    case FaultKind::Eintr: return "EINTR";
    case FaultKind::ShortTransfer: return "short transfer";
    case FaultKind::Corrupt: return "corrupt read";
  }
  return "?";
}

void FaultInjector::add(const FaultRule& rule) {
  std::lock_guard lock(mutex_);
  rules_.push_back(rule);
}

long FaultInjector::on_complete(IoOp op, long result, std::byte* buffer, std::size_t requested_bytes) {
  std::lock_guard lock(mutex_);
  const std::uint64_t index = op == IoOp::Read ? ++reads_ : ++writes_;
  const std::uint64_t any_index = reads_ + writes_;
  for (const FaultRule& rule : rules_) {
    if (rule.op && *rule.op != op) continue;
    const std::uint64_t n = rule.op ? index : any_index;
    if (n < rule.nth || n >= rule.nth + rule.repeat) continue;
    switch (rule.kind) {
      case FaultKind::Eio: ++injected_; return -EIO;
      case FaultKind::Enospc: ++injected_; return -ENOSPC;
      case FaultKind::Eagain: ++injected_; return -EAGAIN;
      case FaultKind::Eintr: ++injected_; return -EINTR;
      case FaultKind::ShortTransfer: {
        if (op == IoOp::Write) break;  // shortened at submission (submit_length)
        // Stay 4 KiB-aligned (what O_DIRECT would return) and keep at least one block.
        if (result <= 4096) break;
        const long short_bytes = (result / 2) / 4096 * 4096;
        if (op == IoOp::Read && buffer != nullptr && static_cast<std::size_t>(result) <= requested_bytes) {
          std::memset(buffer + short_bytes, 0xA5, static_cast<std::size_t>(result - short_bytes));
        }
        ++injected_;
        return short_bytes;
      }
      case FaultKind::Corrupt: {
        if (op != IoOp::Read || buffer == nullptr || result <= 0) break;
        buffer[0] ^= std::byte{0x01};
        ++injected_;
        return result;
      }
    }
  }
  return result;
}

std::size_t FaultInjector::submit_length(IoOp op, std::size_t length_bytes) {
  if (op != IoOp::Write) return length_bytes;
  std::lock_guard lock(mutex_);
  const std::uint64_t n = ++write_submits_;
  for (const FaultRule& rule : rules_) {
    if (rule.kind != FaultKind::ShortTransfer || (rule.op && *rule.op != IoOp::Write)) continue;
    if (n < rule.nth || n >= rule.nth + rule.repeat || length_bytes <= 4096) continue;
    ++injected_;
    return (length_bytes / 2) / 4096 * 4096;
  }
  return length_bytes;
}

std::uint64_t FaultInjector::injected() const {
  std::lock_guard lock(mutex_);
  return injected_;
}

std::uint64_t FaultInjector::operations(IoOp op) const {
  std::lock_guard lock(mutex_);
  return op == IoOp::Read ? reads_ : writes_;
}

}  // namespace strata::offload
