// The engine-independent half of the I/O interface (see offload/io_engine.h): batch completion,
// handles, the file table, request splitting, error wording, the shared transfer loop, the
// engine factory with its io_uring -> thread pool fallback, and the disk's request-size limit
// (max_sectors_kb).
#include "offload/io_engine.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/units.h"
#include "offload/fault.h"
#include "offload/io_engine_impl.h"

namespace strata::offload {

const char* io_op_name(IoOp op) { return op == IoOp::Read ? "read" : "write"; }

EngineKind parse_engine_kind(const std::string& text, const std::string& where) {
  if (text == "auto") return EngineKind::Auto;
  if (text == "uring" || text == "io_uring") return EngineKind::Uring;
  if (text == "threads") return EngineKind::Threads;
  throw ConfigError(fmt::format("{}: unknown I/O engine '{}'; use auto, uring or threads", where, text));
}

const char* engine_kind_name(EngineKind kind) {
  switch (kind) {
    case EngineKind::Auto: return "auto";
    case EngineKind::Uring: return "uring";
    case EngineKind::Threads: return "threads";
  }
  return "?";
}

// ---- handles ----

bool IoHandle::poll() const {
  STRATA_CHECK(state_ != nullptr, "poll() on an empty IoHandle");
  return state_->done_flag.load(std::memory_order_acquire);
}

std::exception_ptr IoHandle::wait_error() const {
  STRATA_CHECK(state_ != nullptr, "wait() on an empty IoHandle");
  std::unique_lock lock(state_->mutex);
  state_->cv.wait(lock, [&] { return state_->done; });
  return state_->error;
}

void IoHandle::wait() const {
  if (auto err = wait_error()) std::rethrow_exception(err);
}

std::size_t IoHandle::bytes() const { return state_ ? state_->bytes : 0; }

IoHandle IoHandle::ready(std::exception_ptr error) {
  auto state = std::make_shared<detail::IoBatchState>();
  state->error = std::move(error);
  state->done = true;
  state->done_flag.store(true);
  return IoHandle(std::move(state));
}

void wait_all(std::span<const IoHandle> handles) {
  std::exception_ptr first;
  for (const IoHandle& h : handles) {
    if (!h.valid()) continue;
    auto err = h.wait_error();
    if (err && !first) first = err;
  }
  if (first) std::rethrow_exception(first);
}

void IoEngine::run(std::span<const IoRequest> requests) { submit(requests).wait(); }

RequestLimits request_limits(const IoEngineOptions& options) {
  const std::size_t read = options.max_request_bytes != 0 ? options.max_request_bytes : kDefaultMaxReadRequestBytes;
  const std::size_t write = options.max_write_request_bytes != 0 ? options.max_write_request_bytes
                                                                 : std::min(kDefaultMaxWriteRequestBytes, read);
  return RequestLimits{read, write};
}

namespace detail {

void IoBatchState::mark_submitted(std::chrono::steady_clock::time_point when) {
  if (times == nullptr) return;
  const std::int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count();
  std::int64_t seen = submitted_ns.load(std::memory_order_relaxed);
  while (seen < ns && !submitted_ns.compare_exchange_weak(seen, ns, std::memory_order_relaxed)) {
  }
}

void IoBatchState::piece_done(std::exception_ptr err) {
  if (err) {
    std::lock_guard lock(mutex);
    if (!error) error = std::move(err);
  }
  if (pending_pieces.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (times != nullptr) {
    times->submitted = std::chrono::steady_clock::time_point(
        std::chrono::nanoseconds(submitted_ns.load(std::memory_order_relaxed)));
  }
  std::exception_ptr final_error;
  {
    std::lock_guard lock(mutex);
    final_error = error;
  }
  if (callback) {
    try {
      callback(final_error);
    } catch (...) {
      final_error = std::current_exception();
    }
  }
  {
    std::lock_guard lock(mutex);
    error = final_error;
    done = true;
    done_flag.store(true, std::memory_order_release);
  }
  cv.notify_all();
}

// ---- file table ----

FileId FileTable::add(int fd, const std::string& path) {
  STRATA_CHECK(fd >= 0, "register_file({}) with fd {}", path, fd);
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].fd < 0) {
      entries_[i] = Entry{fd, path};
      return static_cast<FileId>(i);
    }
  }
  entries_.push_back(Entry{fd, path});
  return static_cast<FileId>(entries_.size() - 1);
}

void FileTable::remove(FileId id) {
  std::lock_guard lock(mutex_);
  if (id >= 0 && static_cast<std::size_t>(id) < entries_.size()) entries_[static_cast<std::size_t>(id)] = Entry{};
}

bool FileTable::valid(FileId id) const {
  std::lock_guard lock(mutex_);
  return id >= 0 && static_cast<std::size_t>(id) < entries_.size() && entries_[static_cast<std::size_t>(id)].fd >= 0;
}

FileTable::Entry FileTable::get(FileId id) const {
  std::lock_guard lock(mutex_);
  if (id < 0 || static_cast<std::size_t>(id) >= entries_.size() || entries_[static_cast<std::size_t>(id)].fd < 0) {
    throw ConfigError(fmt::format("I/O request names file id {}, which is not registered with the engine", id));
  }
  return entries_[static_cast<std::size_t>(id)];
}

std::size_t FileTable::capacity() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

// ---- splitting ----

SplitBatch split_requests(std::span<const IoRequest> requests, std::size_t max_piece_bytes, IoCallback callback,
                          const FileTable& files) {
  return split_requests(requests, max_piece_bytes, max_piece_bytes, std::move(callback), files);
}


SplitBatch split_requests(std::span<const IoRequest> requests, std::size_t max_read_piece_bytes,
                          std::size_t max_write_piece_bytes, IoCallback callback, const FileTable& files,
                          IoTimes* times) {
  STRATA_CHECK(max_read_piece_bytes >= 4096 && max_write_piece_bytes >= 4096, "max piece {}/{} bytes",
               max_read_piece_bytes, max_write_piece_bytes);
  SplitBatch out;
  out.batch = std::make_shared<IoBatchState>();
  out.batch->callback = std::move(callback);
  out.batch->times = times;
  for (const IoRequest& r : requests) {
    if (!files.valid(r.file)) {
      throw ConfigError(fmt::format("I/O request names file id {}, which is not registered with the engine", r.file));
    }
    if (r.buffer == nullptr || r.length_bytes == 0) {
      throw ConfigError(fmt::format("I/O request on {} at offset {} has {} buffer and length {}",
                                    files.get(r.file).path, r.offset_bytes, r.buffer ? "a" : "no", r.length_bytes));
    }
    out.batch->bytes += r.length_bytes;
    const std::size_t max_piece_bytes = r.op == IoOp::Write ? max_write_piece_bytes : max_read_piece_bytes;
    for (std::size_t done = 0; done < r.length_bytes; done += max_piece_bytes) {
      IoPiece p;
      p.op = r.op;
      p.file = r.file;
      p.offset_bytes = r.offset_bytes + done;
      p.buffer = static_cast<std::byte*>(r.buffer) + done;
      p.length_bytes = std::min(max_piece_bytes, r.length_bytes - done);
      p.batch = out.batch;
      out.pieces.push_back(p);
    }
  }
  out.batch->pending_pieces.store(out.pieces.size());
  if (out.pieces.empty()) {
    // An empty batch completes at once (with its callback).
    out.batch->pending_pieces.store(1);
    out.batch->piece_done(nullptr);
  }
  return out;
}

// ---- errors ----

std::exception_ptr make_io_error(IoOp op, const std::string& path, std::uint64_t offset_bytes,
                                 std::size_t length_bytes, int err, const std::string& what) {
  std::string hint;
  switch (err) {
    case ENOSPC: hint = "; the drive is full: free space or point the swap directory at a larger drive"; break;
    case EDQUOT: hint = "; the disk quota is exhausted"; break;
    case EINVAL:
      hint = "; O_DIRECT needs 4 KiB-aligned buffers, offsets and lengths (and a file system that supports it)";
      break;
    case EIO: hint = "; the device reported an I/O error: check the drive (dmesg, smartctl)"; break;
    case ENODATA: hint = "; the file is shorter than expected: it was truncated or is not the file Strata wrote"; break;
    default: break;
  }
  std::string detail = what.empty() ? errno_text(err) : what;
  return std::make_exception_ptr(IoRequestError(fmt::format("cannot {} {} ({} bytes) at offset {} of {}: {}{}",
                                                            io_op_name(op), format_bytes(length_bytes), length_bytes,
                                                            offset_bytes, path, detail, hint),
                                                err, path, offset_bytes));
}

std::exception_ptr transfer_piece(const IoPiece& piece, const std::string& path, unsigned max_retries,
                                  FaultInjector* faults, const std::function<long(const IoPiece&, std::size_t)>& io) {
  std::size_t done = 0;
  unsigned retries = 0;
  while (done < piece.length_bytes) {
    long res = io(piece, done);
    if (faults != nullptr) {
      res = faults->on_complete(piece.op, res, piece.buffer + done, piece.length_bytes - done);
    }
    if (res == -EAGAIN || res == -EINTR) {
      if (++retries > max_retries) {
        return make_io_error(piece.op, path, piece.offset_bytes + done, piece.length_bytes - done, -static_cast<int>(res),
                             fmt::format("{} still after {} retries", errno_text(-static_cast<int>(res)), max_retries));
      }
      continue;
    }
    if (res < 0) {
      return make_io_error(piece.op, path, piece.offset_bytes + done, piece.length_bytes - done, -static_cast<int>(res));
    }
    if (res == 0) {
      if (piece.op == IoOp::Read) {
        return make_io_error(piece.op, path, piece.offset_bytes + done, piece.length_bytes - done, ENODATA,
                             "end of file reached");
      }
      if (++retries > max_retries) {
        return make_io_error(piece.op, path, piece.offset_bytes + done, piece.length_bytes - done, EIO,
                             "the kernel keeps writing 0 bytes");
      }
      continue;
    }
    retries = 0;
    done += static_cast<std::size_t>(res);
  }
  return nullptr;
}

int io_uring_disabled_setting() {
  std::ifstream in("/proc/sys/kernel/io_uring_disabled");
  int v = -1;
  if (in >> v) return v;
  return -1;
}

}  // namespace detail

std::unique_ptr<IoEngine> make_io_engine(const IoEngineOptions& options) {
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    throw ConfigError(fmt::format("I/O queue depth {} is out of range; use 1..4096", options.queue_depth));
  }
  if (options.max_request_bytes != 0 && (options.max_request_bytes % 4096 != 0)) {
    throw ConfigError(fmt::format("I/O block size {} is not a multiple of 4 KiB", options.max_request_bytes));
  }
  if (options.max_write_request_bytes != 0 && (options.max_write_request_bytes % 4096 != 0)) {
    throw ConfigError(
        fmt::format("I/O write block size {} is not a multiple of 4 KiB", options.max_write_request_bytes));
  }
  if (options.iopoll == IoPoll::On && options.kind == EngineKind::Threads) {
    throw ConfigError("polled I/O (IOPOLL) is an io_uring mode; use the uring engine for it");
  }
  switch (options.kind) {
    case EngineKind::Threads: return detail::make_thread_engine(options);
    case EngineKind::Uring: return detail::make_uring_engine(options);
    case EngineKind::Auto: break;
  }
  try {
    return detail::make_uring_engine(options);
  } catch (const IoError& e) {
    if (options.iopoll == IoPoll::On) throw;  // no polled fallback
    spdlog::warn("io_uring is unavailable ({}); using the pread/pwrite thread pool instead", e.what());
    return detail::make_thread_engine(options);
  }
}

std::optional<std::size_t> disk_max_request_bytes(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return std::nullopt;
  // /sys/dev/block/MAJ:MIN is the partition or the disk; the queue lives on the disk.
  const std::string base = fmt::format("/sys/dev/block/{}:{}", major(st.st_dev), minor(st.st_dev));
  for (const char* rel : {"/queue/max_sectors_kb", "/../queue/max_sectors_kb"}) {
    std::ifstream in(base + rel);
    std::size_t kb = 0;
    if (in >> kb && kb > 0) return kb * KiB;
  }
  return std::nullopt;
}

std::optional<std::string> block_device_name(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  const dev_t dev = S_ISBLK(st.st_mode) ? st.st_rdev : st.st_dev;
  std::error_code ec;
  // /sys/dev/block/MAJ:MIN links to .../block/DISK or .../block/DISK/PARTITION.
  auto dir = std::filesystem::canonical(fmt::format("/sys/dev/block/{}:{}", major(dev), minor(dev)), ec);
  if (ec) return std::nullopt;
  if (std::filesystem::exists(dir / "partition", ec)) dir = dir.parent_path();
  return dir.filename().string();
}

std::string polled_io_refusal(const std::string& path) {
  const auto name = block_device_name(path);
  if (!name) {
    return fmt::format("{} is on no block device that sysfs names (a tmpfs, overlay or network file system?); polled "
                       "I/O needs a drive with poll queues",
                       path);
  }
  std::ifstream in("/sys/block/" + *name + "/queue/io_poll");
  int poll = 0;
  if (in >> poll && poll == 1) return {};
  return fmt::format("/dev/{} (holding {}) has no poll queues (/sys/block/{}/queue/io_poll is not 1); for NVMe load "
                     "the driver with some (modprobe nvme poll_queues=4, or nvme.poll_queues=4 on the kernel command "
                     "line)",
                     *name, path, *name);
}

}  // namespace strata::offload
