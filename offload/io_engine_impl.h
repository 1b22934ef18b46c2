// Pieces shared by the two I/O engines (not part of the public interface): the completion state
// of a batch, the file table, the split of requests into kernel-sized pieces, and the wording of
// I/O errors, so that io_uring and the thread pool report failures identically.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "offload/io_engine.h"

namespace strata::offload::detail {

struct IoBatchState {
  std::mutex mutex;
  std::condition_variable cv;
  std::atomic<std::size_t> pending_pieces{0};
  std::exception_ptr error;  // first error (guarded by mutex)
  bool done = false;         // guarded by mutex
  std::atomic<bool> done_flag{false};
  std::size_t bytes = 0;
  IoCallback callback;
  IoTimes* times = nullptr;  // the caller's, filled in before the callback (IoTimes)
  std::atomic<std::int64_t> submitted_ns{0};  // steady_clock, the latest first submission of a piece

  // A piece reached the kernel for the first time at `when` (a no-op unless the caller asked for times).
  void mark_submitted(std::chrono::steady_clock::time_point when);
  // One piece finished (err null on success). The last one runs the callback and wakes waiters.
  void piece_done(std::exception_ptr err);
};

// A contiguous part of one request, at most max_request_bytes long: the unit engines schedule.
struct IoPiece {
  IoOp op = IoOp::Read;
  FileId file = -1;
  std::uint64_t offset_bytes = 0;
  std::byte* buffer = nullptr;
  std::size_t length_bytes = 0;
  std::shared_ptr<IoBatchState> batch;
};

// Validates the requests against the file table and splits them into pieces; creates the batch.
// Throws ConfigError for an unknown file or a zero-length/null request.
struct SplitBatch {
  std::shared_ptr<IoBatchState> batch;
  std::vector<IoPiece> pieces;
};
class FileTable;
SplitBatch split_requests(std::span<const IoRequest> requests, std::size_t max_piece_bytes, IoCallback callback,
                          const FileTable& files);
// The same with a separate largest piece for writes.
SplitBatch split_requests(std::span<const IoRequest> requests, std::size_t max_read_piece_bytes,
                          std::size_t max_write_piece_bytes, IoCallback callback, const FileTable& files,
                          IoTimes* times = nullptr);

// The engines' request-size limits from the options: {largest read, largest write} in bytes
// (Note [Request size and merging] in offload/uring_engine.cc).

// fd + path per FileId; slots are reused after unregister.
class FileTable {
 public:
  struct Entry {
    int fd = -1;
    std::string path;
  };
  FileId add(int fd, const std::string& path);
  void remove(FileId id);
  Entry get(FileId id) const;  // throws ConfigError for an unknown id
  bool valid(FileId id) const;
  std::size_t capacity() const;

 private:
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
};

// "cannot read 1.00 MiB at offset 4096 of /d/f: Input/output error" plus a hint for the errno.
std::exception_ptr make_io_error(IoOp op, const std::string& path, std::uint64_t offset_bytes,
                                 std::size_t length_bytes, int err, const std::string& what = {});

// Retries on EAGAIN/EINTR, advances over short transfers, and stops at the first hard error:
// the transfer loop of one piece, shared by the thread engine and tests. `io` does one
// pread/pwrite-like step and returns bytes or -errno; `faults` (optional) may alter the result.
std::exception_ptr transfer_piece(const IoPiece& piece, const std::string& path, unsigned max_retries,
                                  FaultInjector* faults, const std::function<long(const IoPiece&, std::size_t done)>& io);

std::unique_ptr<IoEngine> make_uring_engine(const IoEngineOptions& options);   // throws IoError if unavailable
std::unique_ptr<IoEngine> make_thread_engine(const IoEngineOptions& options);

// Reads /proc/sys/kernel/io_uring_disabled: 0 allowed, 1 restricted, 2 disabled, -1 unknown.
int io_uring_disabled_setting();

}  // namespace strata::offload::detail
