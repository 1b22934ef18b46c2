// One timed run of a `strata bench io` row: Strata's engine or fio (see tools/bench_io_runs.h).
#include "tools/bench_io_runs.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <numeric>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace strata::tools::bench_io {
namespace {

using offload::IoOp;

// One Strata run of a row: every path streams size bytes with qd requests of bs in flight.
class StrataRun {
 public:
  StrataRun(offload::IoEngine& engine, std::vector<TestFile>& files, std::span<std::byte> buffer, const Row& row,
            std::uint64_t file_bytes, std::uint32_t seed)
      : engine_(engine), files_(files), buffer_(buffer), row_(row) {
    const std::uint64_t blocks = file_bytes / row.bs_bytes;
    STRATA_CHECK(blocks > 0, "file smaller than one block");
    const bool random = row.rw.rfind("rand", 0) == 0;
    op_ = row.rw.find("read") != std::string::npos ? IoOp::Read : IoOp::Write;
    streams_.resize(files.size());
    for (auto& s : streams_) {
      s.order.resize(blocks);
      std::iota(s.order.begin(), s.order.end(), std::uint64_t{0});
      if (random) std::shuffle(s.order.begin(), s.order.end(), std::mt19937_64(seed++));
    }
    total_ = blocks * files.size();
    latencies_us_.resize(total_);
  }

  RunResult run() {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t f = 0; f < files_.size(); ++f) {
      for (unsigned slot = 0; slot < row_.qd; ++slot) issue(f, slot);
    }
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return finished_ == total_ || error_; });
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Wait for anything still in flight after an error before the buffers go away.
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return outstanding_ == 0; });
    }
    if (error_) std::rethrow_exception(error_);
    RunResult r;
    r.gbps = static_cast<double>(total_ * row_.bs_bytes) / seconds / 1e9;
    r.iops = static_cast<double>(total_) / seconds;
    std::sort(latencies_us_.begin(), latencies_us_.end());
    r.p50_us = latencies_us_[latencies_us_.size() / 2];
    r.p99_us = latencies_us_[std::min(latencies_us_.size() - 1, latencies_us_.size() * 99 / 100)];
    return r;
  }

 private:
  struct Stream {
    std::vector<std::uint64_t> order;
    std::size_t next = 0;
  };

  // Takes the next block of stream f for buffer slot `slot` (mutex_ held); false when done.
  bool take_next_locked(std::size_t f, unsigned slot, offload::IoRequest* req, std::size_t* index) {
    Stream& s = streams_[f];
    if (s.next == s.order.size() || error_) return false;
    *index = issued_++;
    ++outstanding_;
    req->op = op_;
    req->file = files_[f].id;
    req->offset_bytes = s.order[s.next++] * row_.bs_bytes;
    req->buffer = buffer_.data() + (f * row_.qd + slot) * row_.bs_bytes;
    req->length_bytes = row_.bs_bytes;
    return true;
  }

  void issue(std::size_t f, unsigned slot) {
    offload::IoRequest req;
    std::size_t index = 0;
    {
      std::lock_guard lock(mutex_);
      if (!take_next_locked(f, slot, &req, &index)) return;
    }
    submit(f, slot, req, index);
  }

  // Completions re-issue on the engine thread, so the queue stays full without a round trip
  // through this thread. The next request is counted before the finished one is uncounted, so
  // run() cannot return (and destroy this) while a callback still uses it.
  void submit(std::size_t f, unsigned slot, const offload::IoRequest& req, std::size_t index) {
    const auto start = std::chrono::steady_clock::now();
    engine_.submit(std::span(&req, 1), [this, f, slot, index, start](std::exception_ptr& err) {
      const auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
      offload::IoRequest next;
      std::size_t next_index = 0;
      bool more = false;
      {
        std::lock_guard lock(mutex_);
        latencies_us_[index] = us;
        ++finished_;
        if (err && !error_) error_ = err;
        more = take_next_locked(f, slot, &next, &next_index);
        --outstanding_;
        if (!more) cv_.notify_all();
      }
      if (more) submit(f, slot, next, next_index);
    });
  }

  offload::IoEngine& engine_;
  std::vector<TestFile>& files_;
  std::span<std::byte> buffer_;
  Row row_;
  IoOp op_ = IoOp::Read;
  std::vector<Stream> streams_;
  std::size_t total_ = 0;
  std::vector<double> latencies_us_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::size_t issued_ = 0;
  std::size_t finished_ = 0;
  std::size_t outstanding_ = 0;
  std::exception_ptr error_;
};

}  // namespace

RunResult run_strata(offload::IoEngine& engine, std::vector<TestFile>& files, std::span<std::byte> buffer,
                     const Row& row, std::uint64_t file_bytes, std::uint32_t seed) {
  StrataRun run(engine, files, buffer, row, file_bytes, seed);
  return run.run();
}

// Runs fio with the row's parameters on the same files; returns its GB/s (1e9 bytes/s).
double run_fio(const std::vector<TestFile>& files, const Row& row, std::uint64_t file_bytes,
               const std::vector<std::string>& extra_options) {
  std::vector<std::string> args = {"fio", "--output-format=json", "--group_reporting"};
  for (std::size_t i = 0; i < files.size(); ++i) {
    args.push_back(fmt::format("--name=strata{}", i));
    args.push_back("--filename=" + files[i].path);
    args.push_back(fmt::format("--size={}", file_bytes));
    args.push_back(fmt::format("--bs={}", row.bs_bytes));
    args.push_back(fmt::format("--iodepth={}", row.qd));
    args.push_back("--rw=" + row.rw);
    args.push_back("--direct=1");
    args.push_back("--ioengine=io_uring");
    for (const auto& o : extra_options) args.push_back(o);
  }
  int pipefd[2];
  STRATA_CHECK_ERRNO(::pipe(pipefd));
  const pid_t pid = ::fork();
  STRATA_CHECK_ERRNO(pid);
  if (pid == 0) {
    ::dup2(pipefd[1], STDOUT_FILENO);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp("fio", argv.data());
    _exit(127);
  }
  ::close(pipefd[1]);
  std::string out;
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::read(pipefd[0], chunk, sizeof chunk);
    if (n > 0) out.append(chunk, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw Error(fmt::format("fio failed (exit {}) for rw={} bs={} qd={}{}; is fio installed and io_uring allowed? "
                            "Run without --vs-fio to skip it",
                            WIFEXITED(status) ? WEXITSTATUS(status) : -1, row.rw, row.bs_bytes, row.qd,
                            extra_options.empty() ? "" : " with the --fio-option given"));
  }
  // fio may print notes before the JSON document.
  const auto brace = out.find('{');
  if (brace == std::string::npos) throw Error("fio printed no JSON result");
  auto j = nlohmann::json::parse(out.substr(brace));
  double bytes_per_s = 0;
  for (const auto& job : j.at("jobs")) {
    bytes_per_s += job.at("read").at("bw_bytes").get<double>() + job.at("write").at("bw_bytes").get<double>();
  }
  return bytes_per_s / 1e9;
}

}  // namespace strata::tools::bench_io
