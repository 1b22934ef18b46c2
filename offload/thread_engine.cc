// The fallback I/O engine: a pool of threads doing pread/pwrite (see offload/io_engine.h).
//
// Used where io_uring is unavailable or refused (old kernel, seccomp, io_uring_disabled) and as
// the oracle the io_uring engine is tested against: the same pieces, the same retry and
// short-transfer loop (detail::transfer_piece), the same error wording. Workers sleep on a
// condition variable when idle.
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"

#include "offload/fault.h"
#include "offload/io_engine_impl.h"

namespace strata::offload::detail {
namespace {

class ThreadEngine final : public IoEngine {
 public:
  explicit ThreadEngine(const IoEngineOptions& options) : options_(options) {
    limits_ = request_limits(options);
    const unsigned n = options.threads != 0 ? options.threads : std::clamp(options.queue_depth, 1u, 16u);
    workers_.reserve(n);
    for (unsigned i = 0; i < n; ++i) workers_.emplace_back([this] { work(); });
    if (options.cpu >= 0) pin_workers(options.cpu);
  }

  ~ThreadEngine() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  FileId register_file(int fd, const std::string& path) override { return files_.add(fd, path); }
  void unregister_file(FileId file) override { files_.remove(file); }
  void register_buffers(std::span<const std::span<std::byte>>) override {}

  IoHandle queue_batch(std::span<const IoRequest> requests, IoCallback callback, IoTimes* times) override {
    SplitBatch split =
        split_requests(requests, limits_.read_bytes, limits_.write_bytes, std::move(callback), files_, times);
    {
      std::lock_guard lock(mutex_);
      for (auto& p : split.pieces) queue_.push_back(std::move(p));
    }
    cv_.notify_all();
    return IoHandle(split.batch);
  }

  IoEngineInfo info() const override {
    return IoEngineInfo{"threads", fmt::format("{} pread/pwrite workers", workers_.size()), options_.queue_depth,
                        limits_.read_bytes, limits_.write_bytes};
  }

 private:
  // Pins every worker to `cpu` (IoEngineOptions::cpu); a refusal only costs the placement.
  void pin_workers(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    for (auto& t : workers_) {
      if (const int r = pthread_setaffinity_np(t.native_handle(), sizeof set, &set); r != 0) {
        spdlog::warn("thread engine: pinning a worker to CPU {} failed: {}", cpu, errno_text(r));
      }
    }
  }

  void work() {
    for (;;) {
      IoPiece piece;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        piece = std::move(queue_.front());
        queue_.pop_front();
      }
      const FileTable::Entry file = files_.get(piece.file);
      auto io = [&](const IoPiece& p, std::size_t done) -> long {
        const auto off = static_cast<off_t>(p.offset_bytes + done);
        std::size_t n = p.length_bytes - done;
        if (options_.faults != nullptr) n = options_.faults->submit_length(p.op, n);
        const ssize_t r = p.op == IoOp::Read ? ::pread(file.fd, p.buffer + done, n, off)
                                             : ::pwrite(file.fd, p.buffer + done, n, off);
        return r < 0 ? -static_cast<long>(errno) : static_cast<long>(r);
      };
      piece.batch->mark_submitted(std::chrono::steady_clock::now());
      auto err = transfer_piece(piece, file.path, options_.max_retries, options_.faults, io);
      auto batch = std::move(piece.batch);
      batch->piece_done(std::move(err));
    }
  }

  IoEngineOptions options_;
  RequestLimits limits_{};
  FileTable files_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<IoPiece> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoEngine> make_thread_engine(const IoEngineOptions& options) {
  return std::make_unique<ThreadEngine>(options);
}

}  // namespace strata::offload::detail
