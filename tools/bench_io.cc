// `strata bench io`: NVMe bandwidth, IOPS and latency of Strata's I/O engine, beside fio.
//
// For every row of the matrix rw x bs x qd it streams --size bytes of each path's test file
// through the engine with qd requests of bs bytes in flight per path (sequential or a random
// permutation of the blocks), and prints GB/s (1e9 bytes/s), IOPS and the p50/p99 latency of one
// request (submit to completion). With --vs-fio it runs fio on the same file with the same
// parameters (direct=1, ioengine=io_uring, one job per path) alternately with Strata (A B A B, at
// least 3 pairs, because this kind of disk drifts between runs: docs/MEASUREMENTS.md) and prints
// the medians and the median of the per-pair ratios. The engine defaults are the ones Strata uses
// for swapping; --request-size, --write-request-size, --coalesce, --huge-pages and --fixed-buffers
// expose the choices of Note [Request size and merging] (offload/uring_engine.cc) so their effect
// can be measured, and --file-state the state of the blocks under the file (Note [Bench file
// state]), given to Strata and fio alike. Strata's buffers are 2 MiB huge pages (as BufferPool's;
// 4 KiB pages for small random writes, Note [Bench buffers]) and fio's are its default malloc'd
// memory, which on a disk like the one of that Note is most of the difference; --fio-option
// passes extra options to every fio job (e.g. --mem=shmhuge, with hugetlb pages reserved in
// /proc/sys/vm/nr_hugepages) to measure fio with huge pages too.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/file_io.h"
#include "core/host_buffer.h"
#include "core/units.h"
#include "offload/file.h"
#include "offload/io_engine.h"
#include "tools/commands.h"

namespace strata::tools {
namespace {

using offload::IoOp;

struct BenchIoArgs {
  std::string dir;
  std::string paths;
  std::string size = "4G";
  std::string bs = "1M";
  std::string qd = "32";
  std::string rw = "read";
  std::string engine = "auto";
  std::string request_size = "auto";
  std::string write_request_size = "auto";
  std::string coalesce = "on";
  std::string huge_pages = "auto";
  std::string fixed_buffers = "on";
  std::string file_state = "written";
  std::vector<std::string> fio_options;
  unsigned batch = 1;
  bool sqpoll = false;
  bool vs_fio = false;
  bool json = false;
  bool keep_file = false;
  int pairs = 3;
};

struct Row {
  std::string rw;
  std::size_t bs_bytes = 0;
  unsigned qd = 0;
};

struct RunResult {
  double gbps = 0;
  double iops = 0;
  double p50_us = 0;
  double p99_us = 0;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool parse_on_off(const std::string& text, const char* flag) {
  if (text == "on" || text == "1" || text == "true") return true;
  if (text == "off" || text == "0" || text == "false") return false;
  throw ConfigError(fmt::format("{} '{}': use on or off", flag, text));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct TestFile {
  std::string dir;
  std::string path;
  offload::UniqueFd fd;
  offload::FileId id = -1;
};

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

// Note [Bench file state]
// What a write costs on this kind of disk depends on the state of the blocks under the file, not
// only on the engine: blocks that were freed and discarded (ext4 mounted with `discard` passes the
// discard to the host, which drops its backing storage) must be allocated again by the host on
// the first write. On the virtio disk of Note [Request size and merging], writes into written
// blocks and into blocks turned back into ext4 unwritten extents over host-allocated storage
// (FALLOC_FL_ZERO_RANGE) ran at the same speed, writes into fresh fallocated blocks after a hole
// punch (host allocation) ~20 % slower (docs/MEASUREMENTS.md, "Bench file state"). A freshly
// preallocated test file therefore handicaps whichever tool writes it first (Strata, in A B A B
// order). --file-state written (the default) writes every test file once in full before the first
// timed run, so Strata and fio both see written blocks; --file-state fallocated punches the file
// back to fresh preallocated blocks before every timed write run of both tools, to measure the
// first-write case fairly. Reads always need written data (reads of unwritten extents return zeros
// without touching the disk).
enum class FileState : std::uint8_t { Written, Fallocated };

FileState parse_file_state(const std::string& text) {
  if (text == "written") return FileState::Written;
  if (text == "fallocated") return FileState::Fallocated;
  throw ConfigError(fmt::format("--file-state '{}': use written or fallocated", text));
}

// Writes every test file once in full (Note [Bench file state]).
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

// Frees every block of the test files and preallocates fresh ones (Note [Bench file state]).
void reallocate(const std::vector<TestFile>& files, std::uint64_t file_bytes) {
  for (const auto& f : files) {
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

int run_bench_io(const BenchIoArgs& a) {
  std::vector<std::string> dirs = split_list(a.paths);
  if (dirs.empty()) {
    if (a.dir.empty()) throw ConfigError("strata bench io: give --dir DIR (or --paths D1,D2)");
    dirs.push_back(a.dir);
  }
  const std::uint64_t total_bytes = parse_bytes_or_throw(a.size, "--size");
  const std::uint64_t file_bytes = total_bytes / dirs.size() / (4 * MiB) * (4 * MiB);
  std::vector<Row> rows;
  unsigned max_qd = 0;
  std::size_t max_bs = 0;
  for (const auto& rw : split_list(a.rw)) {
    if (rw != "read" && rw != "write" && rw != "randread" && rw != "randwrite") {
      throw ConfigError(fmt::format("--rw '{}': use read, write, randread or randwrite (comma-separated)", rw));
    }
    for (const auto& bs : split_list(a.bs)) {
      const std::size_t bs_bytes = parse_bytes_or_throw(bs, "--bs");
      if (bs_bytes % 4096 != 0 || bs_bytes == 0 || bs_bytes > file_bytes) {
        throw ConfigError(fmt::format("--bs {}: use a multiple of 4 KiB no larger than each file ({})", bs,
                                      format_bytes(file_bytes)));
      }
      for (const auto& qd : split_list(a.qd)) {
        int q = 0;
        const char* last = qd.data() + qd.size();
        const auto [end, ec] = std::from_chars(qd.data(), last, q);
        if (ec != std::errc() || end != last || q < 1 || q > 1024) {
          throw ConfigError(fmt::format("--qd '{}': use whole numbers 1..1024, comma-separated without spaces", qd));
        }
        rows.push_back(Row{rw, bs_bytes, static_cast<unsigned>(q)});
        max_qd = std::max(max_qd, static_cast<unsigned>(q));
        max_bs = std::max(max_bs, bs_bytes);
      }
    }
  }
  if (rows.empty()) throw ConfigError("strata bench io: the matrix is empty (check --rw, --bs, --qd)");
  if (a.vs_fio && a.pairs < 3) throw ConfigError("--pairs: at least 3 alternating pairs are needed for a median");

  const FileState file_state = parse_file_state(a.file_state);
  // --huge-pages: nothing for auto (Note [Bench buffers]), else on or off for every row.
  std::optional<bool> huge_always;
  if (a.huge_pages != "auto") huge_always = parse_on_off(a.huge_pages, "--huge-pages (or auto)");
  offload::IoEngineOptions eo;
  eo.kind = offload::parse_engine_kind(a.engine, "--engine");
  eo.coalesce = parse_on_off(a.coalesce, "--coalesce") ? offload::Coalesce::On : offload::Coalesce::Off;
  eo.fixed_buffers =
      parse_on_off(a.fixed_buffers, "--fixed-buffers") ? offload::FixedBuffers::On : offload::FixedBuffers::Off;
  eo.sqpoll = a.sqpoll ? offload::SqPoll::On : offload::SqPoll::Off;
  eo.submit_batch = a.batch;
  // "auto": the engine's defaults (Note [Request size and merging]), as Strata swaps with them.
  eo.max_request_bytes = a.request_size == "auto" ? 0 : parse_bytes_or_throw(a.request_size, "--request-size");
  eo.max_write_request_bytes =
      a.write_request_size == "auto" ? 0 : parse_bytes_or_throw(a.write_request_size, "--write-request-size");

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

  // Note [Bench buffers]: the I/O buffers are one region on 2 MiB huge pages, as BufferPool's
  // (Note [Request size and merging] in offload/uring_engine.cc: a request over a huge page is one
  // segment), except for random writes of blocks of 16 KiB or less under --huge-pages auto, which
  // use 4 KiB pages: on the disk of that Note those ran faster from 4 KiB pages, while random reads
  // of 16 KiB, random writes of 64 KiB and every sequential row (whose requests coalesce across
  // pages) ran faster from the huge page (docs/MEASUREMENTS.md, "Bench buffers"). Why small random
  // writes prefer 4 KiB pages we do not know: the buffers are registered (fixed), so the kernel
  // does not pin pages per request. `huge_pages` in the JSON rows says which backing was asked for
  // (THP through madvise; the kernel may decline).
  const auto row_huge = [&](const Row& row) {
    return huge_always.value_or(!(row.rw == "randwrite" && row.bs_bytes <= 16 * KiB));
  };
  const std::size_t buffer_bytes = std::max<std::size_t>(max_qd * max_bs * files.size(), 64 * MiB);
  HostBuffer buffers[2];  // [0]: 4 KiB pages, [1]: huge pages; allocated when a row first needs one
  const auto buffer_for = [&](bool huge) {
    HostBuffer& b = buffers[huge ? 1 : 0];
    if (b.size_bytes() == 0) {
      HostBufferOptions bo;
      bo.huge_pages = huge ? HugePages::Transparent : HugePages::Off;
      bo.alignment_bytes = huge ? 2 * MiB : 4096;
      b = HostBuffer::allocate(buffer_bytes, bo);
      std::memset(b.data(), 0x5C, b.size_bytes());  // fault every page in before timing
    }
    return std::span<std::byte>(static_cast<std::byte*>(b.data()), b.size_bytes());
  };

  bool written = false;  // every test file holds written data (Note [Bench file state])
  if (!a.json) {
    fmt::print("{:>9} {:>8} {:>4} {:>5} {:>8} {:>9} {:>9} {:>9}{}\n", "rw", "bs", "qd", "paths", "GB/s", "IOPS",
               "p50_us", "p99_us", a.vs_fio ? fmt::format(" {:>9} {:>7}", "fio_GB/s", "ratio") : "");
  }
  for (const Row& row : rows) {
    offload::IoEngineOptions o = eo;
    o.queue_depth = row.qd * static_cast<unsigned>(files.size());
    auto engine = offload::make_io_engine(o);
    for (auto& f : files) f.id = engine->register_file(f.fd.get(), f.path);
    const bool huge = row_huge(row);
    const std::span<std::byte> buf = buffer_for(huge);
    const std::span<std::byte> spans[] = {buf};
    engine->register_buffers(spans);
    const bool write_row = row.rw.find("write") != std::string::npos;
    if (!written && (!write_row || file_state == FileState::Written)) {
      prefill(*engine, files, buf, file_bytes);
      written = true;
    }
    const auto info = engine->info();
    spdlog::info("engine {} [{}], kernel requests up to {} (reads), {} (writes), buffers on {} pages", info.name,
                 info.features, format_bytes(info.max_request_bytes), format_bytes(info.max_write_request_bytes),
                 huge ? "2 MiB" : "4 KiB");

    const int runs = a.vs_fio ? a.pairs : 1;
    std::vector<double> gbps, fio_gbps, ratios, iops, p50, p99;
    const bool reallocate_each = write_row && file_state == FileState::Fallocated;
    for (int i = 0; i < runs; ++i) {
      if (reallocate_each) reallocate(files, file_bytes);
      StrataRun run(*engine, files, buf, row, file_bytes, 1234u + static_cast<std::uint32_t>(i));
      const RunResult r = run.run();
      gbps.push_back(r.gbps);
      iops.push_back(r.iops);
      p50.push_back(r.p50_us);
      p99.push_back(r.p99_us);
      if (a.vs_fio) {
        if (reallocate_each) reallocate(files, file_bytes);
        const double f = run_fio(files, row, file_bytes, a.fio_options);
        fio_gbps.push_back(f);
        ratios.push_back(f > 0 ? r.gbps / f : 0);
        spdlog::debug("{} bs={} qd={} pair {}: strata {:.3f} GB/s, fio {:.3f} GB/s", row.rw, row.bs_bytes, row.qd, i,
                      r.gbps, f);
      }
    }
    for (auto& f : files) engine->unregister_file(f.id);
    engine.reset();
    if (reallocate_each) written = false;  // a timed write pass may have been partial

    if (a.json) {
      nlohmann::json j = {{"rw", row.rw},
                          {"bs", row.bs_bytes},
                          {"qd", row.qd},
                          {"paths", files.size()},
                          {"gbps", median(gbps)},
                          {"iops", median(iops)},
                          {"p50_us", median(p50)},
                          {"p99_us", median(p99)},
                          {"engine", info.name},
                          {"huge_pages", huge},
                          {"file_state", a.file_state}};
      if (a.vs_fio) {
        j["fio_gbps"] = median(fio_gbps);
        j["ratio"] = median(ratios);
        j["pairs"] = runs;
        j["strata_runs_gbps"] = gbps;
        j["fio_runs_gbps"] = fio_gbps;
      }
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("{:>9} {:>8} {:>4} {:>5} {:>8.3f} {:>9.0f} {:>9.0f} {:>9.0f}{}\n", row.rw, format_bytes(row.bs_bytes),
                 row.qd, files.size(), median(gbps), median(iops), median(p50), median(p99),
                 a.vs_fio ? fmt::format(" {:>9.3f} {:>6.2f}x", median(fio_gbps), median(ratios)) : "");
    }
    std::fflush(stdout);
  }
  if (!a.keep_file) {
    for (auto& f : files) {
      f.fd.reset();
      ::unlink(f.path.c_str());
    }
  }
  return 0;
}

}  // namespace

void register_bench_io(CLI::App& bench, CommandTable& table) {
  auto args = std::make_shared<BenchIoArgs>();
  auto* cmd = bench.add_subcommand("io", "NVMe bandwidth/IOPS/latency of Strata's I/O engine (optionally beside fio)");
  cmd->add_option("--dir", args->dir, "directory for the test file (on the drive to measure)");
  cmd->add_option("--paths", args->paths, "comma-separated directories, one test file and stream each (one per drive)");
  cmd->add_option("--size", args->size, "bytes streamed per run, split over the paths (e.g. 1G, 4G)")->capture_default_str();
  cmd->add_option("--bs", args->bs, "block size per request; a comma list makes a matrix (4K,64K,1M)")->capture_default_str();
  cmd->add_option("--qd", args->qd, "requests in flight per path; comma list (1,8,32)")->capture_default_str();
  cmd->add_option("--rw", args->rw, "read, write, randread, randwrite; comma list")->capture_default_str();
  cmd->add_flag("--vs-fio", args->vs_fio, "alternate with fio on the same file and print the median ratio");
  cmd->add_option("--pairs", args->pairs, "Strata/fio pairs per row with --vs-fio (>= 3)")->capture_default_str();
  cmd->add_flag("--json", args->json, "one JSON object per row");
  cmd->add_option("--engine", args->engine, "auto, uring or threads")->capture_default_str();
  cmd->add_option("--request-size", args->request_size,
                  fmt::format("largest kernel read (auto: the engine default, {})",
                              format_bytes(offload::kDefaultMaxReadRequestBytes)))
      ->capture_default_str();
  cmd->add_option("--write-request-size", args->write_request_size,
                  fmt::format("largest kernel write (auto: the engine default, {} or --request-size if smaller)",
                              format_bytes(offload::kDefaultMaxWriteRequestBytes)))
      ->capture_default_str();
  cmd->add_option("--coalesce", args->coalesce, "merge adjacent requests into one kernel request (on|off)")
      ->capture_default_str();
  cmd->add_option("--huge-pages", args->huge_pages,
                  "back the I/O buffers with 2 MiB huge pages (on|off|auto: on except for random writes of blocks "
                  "<= 16 KiB)")
      ->capture_default_str();
  cmd->add_option("--fixed-buffers", args->fixed_buffers, "register the buffers with io_uring (on|off)")
      ->capture_default_str();
  cmd->add_option("--batch", args->batch, "most requests per io_uring_enter (0: the queue depth)")->capture_default_str();
  cmd->add_option("--file-state", args->file_state,
                  "blocks under the test file at each timed write run, for Strata and fio alike: written (filled once "
                  "before the first row) or fallocated (fresh preallocated blocks before every write run)")
      ->capture_default_str();
  cmd->add_flag("--sqpoll", args->sqpoll, "use a kernel submission-polling thread");
  cmd->add_option("--fio-option", args->fio_options,
                  "extra option for every fio job with --vs-fio, e.g. --fio-option=--mem=shmhuge (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag("--keep-file", args->keep_file, "keep the test file(s) afterwards");
  table[cmd] = [args]() -> int { return run_bench_io(*args); };
}

}  // namespace strata::tools
