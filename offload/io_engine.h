// The asynchronous block I/O interface of the NVMe tier, and its two engines.
//
// Callers register file descriptors (opened O_DIRECT by offload/file.h) and submit batches of
// requests: read or write `length_bytes` at `offset_bytes` of a file into or from a 4 KiB-aligned
// buffer. A batch completes as one IoHandle (wait, poll) and may carry a callback that runs on the
// engine's thread once every byte of the batch is transferred or the batch failed. Engines split
// large requests into blocks, retry -EAGAIN/-EINTR, complete short transfers by resubmitting the
// rest, and report every other failure as an IoError naming path, offset and length, so a caller
// never sees a success for bytes that did not move. Two engines implement the interface:
// `uring` (offload/uring_engine.cc, io_uring via liburing, the default) and `threads`
// (offload/thread_engine.cc, a pread/pwrite thread pool, the fallback and the test oracle).
// See Note [Request size and merging] in offload/uring_engine.cc for the defaults.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace strata::offload {

class FaultInjector;

enum class IoOp : std::uint8_t { Read, Write };
const char* io_op_name(IoOp op);

enum class EngineKind : std::uint8_t {
  Auto,     // io_uring, else the thread pool with one warning
  Uring,    // io_uring or an IoError saying why not
  Threads,  // pread/pwrite thread pool
};
// "auto" | "uring" | "threads"; throws ConfigError naming `where` otherwise.
EngineKind parse_engine_kind(const std::string& text, const std::string& where);
const char* engine_kind_name(EngineKind kind);

// Whether adjacent requests (same file, same op, contiguous in file and memory) are merged into
// one larger request before they reach the kernel.
enum class Coalesce : std::uint8_t { Off, On };
enum class SqPoll : std::uint8_t { Off, On };
enum class FixedBuffers : std::uint8_t { Off, On };
// IORING_SETUP_IOPOLL: completions are polled from the device's poll queues by the engine thread
// (busy while I/O is in flight) instead of interrupts. io_uring only; the device needs poll
// queues (see polled_io_refusal).
enum class IoPoll : std::uint8_t { Off, On };

// The default largest kernel read and write (IoEngineOptions::max_request_bytes,
// max_write_request_bytes; Note [Request size and merging] in offload/uring_engine.cc).
inline constexpr std::size_t kDefaultMaxReadRequestBytes = std::size_t{4} << 20;
inline constexpr std::size_t kDefaultMaxWriteRequestBytes = std::size_t{1} << 20;

struct IoEngineOptions {
  EngineKind kind = EngineKind::Auto;
  unsigned queue_depth = 32;              // requests in flight at the kernel (io_uring) or workers (threads)
  std::size_t max_request_bytes = 0;      // largest single kernel read; 0: kDefaultMaxReadRequestBytes
  // Largest single kernel write; 0: min(kDefaultMaxWriteRequestBytes, max_request_bytes). Writes
  // are split smaller than reads (Note [Request size and merging] in offload/uring_engine.cc).
  std::size_t max_write_request_bytes = 0;
  unsigned submit_batch = 1;              // SQEs per io_uring_enter (0: queue_depth); see uring_engine.cc
  Coalesce coalesce = Coalesce::On;
  SqPoll sqpoll = SqPoll::Off;
  FixedBuffers fixed_buffers = FixedBuffers::On;  // used for buffers given to register_buffers
  IoPoll iopoll = IoPoll::Off;
  int cpu = -1;                           // pin the engine's thread(s) to this logical CPU; -1: no pinning
  unsigned threads = 0;                   // thread engine workers; 0: min(queue_depth, 16)
  unsigned max_retries = 1000;            // consecutive EAGAIN/EINTR per request before it fails
  FaultInjector* faults = nullptr;        // tests: fault injection at the completion boundary
};

// The largest kernel read and write an engine with `options` issues (the defaults filled in).
struct RequestLimits {
  std::size_t read_bytes;
  std::size_t write_bytes;
};
RequestLimits request_limits(const IoEngineOptions& options);

// The IoError of one failed request (every engine's): the file and the offset it failed at, for
// callers that map it back to what they stored there (the swap store's extents).
class IoRequestError : public IoError {
 public:
  IoRequestError(const std::string& what, int err, std::string path, std::uint64_t offset_bytes)
      : IoError(what, err), path_(std::move(path)), offset_bytes_(offset_bytes) {}
  const std::string& path() const { return path_; }
  std::uint64_t offset_bytes() const { return offset_bytes_; }

 private:
  std::string path_;
  std::uint64_t offset_bytes_;
};

// A registered file; an index into the engine's file table.
using FileId = int;

struct IoRequest {
  IoOp op = IoOp::Read;
  FileId file = -1;
  std::uint64_t offset_bytes = 0;
  void* buffer = nullptr;  // 4 KiB-aligned for O_DIRECT files
  std::size_t length_bytes = 0;
};

// Runs on the engine thread when a batch finishes, before waiters wake. `error` is null on
// success; the callback may replace it (e.g. a checksum check that fails) and must not block.
using IoCallback = std::function<void(std::exception_ptr& error)>;

// (optional) When a batch reached the kernel, for latency split as fio's slat and clat
// (`strata bench io`). The engine fills it in before the batch's callback runs: `submitted` is when
// the call that handed the batch's last piece to the kernel returned (io_uring_submit, which
// consumes the SQE and issues the I/O; for the thread engine, when a worker starts its pread or
// pwrite). A resubmission after a short transfer or EAGAIN does not move it. An io_uring_enter that
// submits and then sleeps for completions (the engine's last SQE goes with its wait; IOPOLL) stamps
// the moment it was entered, so that call's cost counts as completion time.
struct IoTimes {
  std::chrono::steady_clock::time_point submitted{};
};

namespace detail {
struct IoBatchState;
}

// Completion of one submitted batch. Copyable; all copies observe the same batch.
class IoHandle {
 public:
  IoHandle() = default;
  explicit IoHandle(std::shared_ptr<detail::IoBatchState> state) : state_(std::move(state)) {}

  bool valid() const { return state_ != nullptr; }
  // True once the batch finished (successfully or not); never blocks.
  bool poll() const;
  // Blocks until the batch finished; rethrows its error (IoError, FormatError, ...).
  void wait() const;
  // Blocks until finished; returns its error instead of throwing (null on success).
  std::exception_ptr wait_error() const;
  std::size_t bytes() const;

  // A handle that is already complete (with `error`, possibly null).
  static IoHandle ready(std::exception_ptr error = nullptr);

 private:
  std::shared_ptr<detail::IoBatchState> state_;
};

// Waits for every handle; rethrows the first error after all finished.
void wait_all(std::span<const IoHandle> handles);

// Facts about a running engine, for logs and `strata bench io`.
struct IoEngineInfo {
  std::string name;               // "io_uring" or "threads"
  std::string features;           // e.g. "SINGLE_ISSUER|COOP_TASKRUN fixed-files fixed-buffers"
  unsigned queue_depth = 0;
  std::size_t max_request_bytes = 0;        // largest kernel read
  std::size_t max_write_request_bytes = 0;  // largest kernel write
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  IoEngine() = default;
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // The fd stays owned by the caller and must outlive every request on it; `path` is for messages.
  virtual FileId register_file(int fd, const std::string& path) = 0;
  virtual void unregister_file(FileId file) = 0;
  // (optional) Buffers that will be used for many requests; io_uring registers them as fixed
  // buffers (pinned once, no per-request page walk). Replaces the previous set. Call with no I/O
  // in flight. Requests whose buffer lies outside every registered one still work.
  virtual void register_buffers(std::span<const std::span<std::byte>> buffers) = 0;

  // Queues the batch; returns at once. Requests must stay valid until the handle completes, and
  // `times` (optional) until the callback has run.
  IoHandle submit(std::span<const IoRequest> requests, IoCallback callback = {}, IoTimes* times = nullptr) {
    return queue_batch(requests, std::move(callback), times);
  }
  // Convenience: submit + wait.
  void run(std::span<const IoRequest> requests);

  virtual IoEngineInfo info() const = 0;

 protected:
  virtual IoHandle queue_batch(std::span<const IoRequest> requests, IoCallback callback, IoTimes* times) = 0;
};

// Creates the engine `options.kind` asks for. Auto falls back to threads with one warning when
// io_uring is disabled (/proc/sys/kernel/io_uring_disabled), unsupported (-ENOSYS) or refused
// (-EPERM, seccomp). Uring throws IoError saying why it is unavailable.
std::unique_ptr<IoEngine> make_io_engine(const IoEngineOptions& options);

// The block device's max_sectors_kb for a file in `dir` (the most one request reaches the device
// unsplit), in bytes; nothing when sysfs does not say. `strata doctor` shows it; the engine's
// defaults are the constants above.
std::optional<std::size_t> disk_max_request_bytes(const std::string& dir);

// The block device holding `path` (a file or directory on it, or the device node itself), as
// its sysfs name ("vda", "nvme0n1"; the whole disk for a partition); nothing when sysfs does not say.
std::optional<std::string> block_device_name(const std::string& path);

// Why polled I/O (IoPoll::On) cannot work for `path`: empty when the device behind it has poll
// queues (/sys/block/DEV/queue/io_poll = 1), else one sentence naming the device and the fix.
std::string polled_io_refusal(const std::string& path);

}  // namespace strata::offload
