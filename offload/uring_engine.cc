// The io_uring I/O engine (see offload/io_engine.h), over liburing.
//
// One engine thread owns the ring: it creates it (so SINGLE_ISSUER/DEFER_TASKRUN hold), registers
// files and buffers, fills SQEs from the pending pieces, submits and waits in one syscall, and
// drains every available completion. Callers hand pieces over through a mutex-guarded queue and
// wake the thread through an eventfd whose read is always armed in the ring, so the thread sleeps
// in io_uring_enter whenever nothing completes: no busy spinning when idle. Each in-flight kernel
// request is a slot whose index is the SQE's user_data; a short transfer advances the slot and
// resubmits the rest, -EAGAIN/-EINTR resubmit unchanged, anything else fails the slot's batches
// with path, offset and length.
//
// Note [Request size and merging]
// Measured on a virtio disk (max_sectors_kb 4096, max_segments 254) whose host serves requests
// about one at a time, so what counts is the shape of each request, in this order (figures and
// dates: docs/MEASUREMENTS.md, "NVMe request size and merging"):
// (1) Segments. The host handles every segment of a request separately. A buffer on 2 MiB huge
// pages (BufferPool and the bench use HugePages::Transparent, 2 MiB-aligned) makes a request one
// segment; 4 KiB pages make a 1 MiB request 256 segments, more than the disk's 254, so it reaches
// the disk split in two and cannot merge with its neighbours. This is nearly all of Strata's lead
// over fio, whose buffers are malloc'd (fio given hugetlb buffers matched Strata).
// (2) Size. Past a fixed per-request cost the best size moved with the disk's speed from day to
// day; whole requests of a few MiB never lost much, small ones did on fast days. So reads are
// split, and adjacent queued pieces coalesced, up to max_request_bytes
// (kDefaultMaxReadRequestBytes, 4 MiB = max_sectors_kb there) and writes up to
// max_write_request_bytes (kDefaultMaxWriteRequestBytes, 1 MiB, never above max_request_bytes).
// Coalescing gives small sequential requests those sizes even when completions trickle in one by
// one (the block layer's plug merges only within one submission).
// (3) No merging by batching. Submitting many SQEs per io_uring_enter lets the plug merge adjacent
// requests into 2-4 MiB ones behind the engine's back, which was slower for writes and for random
// 4 KiB reads, so submit_batch is 1. Re-measured with each refill going in before the next
// completion (Note [Refill before the next completion]): a batch of the queue depth still ran random
// 4 KiB reads and writes at qd 64 at 0.6-0.8x of one SQE per enter; 1 MiB rows moved within the
// noise (docs/MEASUREMENTS.md, "refill before the next completion"). The last SQE prepared goes to
// the kernel with the engine's wait for completions, one io_uring_enter for both: at queue depth 1,
// one system call a request.
// Fixed buffers, IOSQE_ASYNC, the ring flags and queue depth past 4 made no difference beyond the
// noise; random 4 KiB I/O is bound by the per-request cost whatever the engine. The state of the
// blocks written matters too: see Note [Bench file state] in bench/bench_io_files.h.
#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "offload/fault.h"
#include "offload/io_engine_impl.h"
#include "offload/uring_ring.h"

namespace strata::offload::detail {
namespace {

constexpr std::uint64_t kWakeTag = ~std::uint64_t{0};
constexpr unsigned kSparseFiles = 64;

struct Part {
  std::shared_ptr<IoBatchState> batch;
};

// One kernel request in flight (or waiting to be resubmitted).
struct Slot {
  IoOp op = IoOp::Read;
  FileId file = -1;
  std::uint64_t offset_bytes = 0;
  std::byte* buffer = nullptr;
  std::size_t length_bytes = 0;
  std::size_t done_bytes = 0;
  int buf_index = -1;  // fixed buffer slot, or -1
  unsigned retries = 0;
  std::vector<Part> parts;
};

struct RegisteredBuffer {
  std::byte* begin;
  std::byte* end;
};

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(const IoEngineOptions& options) : options_(options) {
    limits_ = request_limits(options);
    submit_batch_ = options.submit_batch != 0 ? options.submit_batch : options.queue_depth;
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
    if (wake_fd_ < 0) throw IoError(fmt::format("eventfd for the io_uring engine: {}", errno_text(errno)), errno);
    std::promise<std::exception_ptr> started;
    auto started_future = started.get_future();
    thread_ = std::thread([this, &started] { thread_main(started); });
    if (auto err = started_future.get()) {
      thread_.join();
      ::close(wake_fd_);
      std::rethrow_exception(err);
    }
  }

  ~UringEngine() override {
    post([this] { stop_ = true; });
    thread_.join();
    ::close(wake_fd_);
  }

  FileId register_file(int fd, const std::string& path) override {
    FileId id = files_.add(fd, path);
    call([&] {
      if (fixed_files_ && id < static_cast<FileId>(kSparseFiles)) {
        int r = io_uring_register_files_update(&ring_, static_cast<unsigned>(id), &fd, 1);
        fixed_file_ok_.resize(std::max<std::size_t>(fixed_file_ok_.size(), static_cast<std::size_t>(id) + 1), false);
        fixed_file_ok_[static_cast<std::size_t>(id)] = r >= 0;
        if (r < 0) spdlog::debug("io_uring: registering {} as a fixed file failed: {}", path, errno_text(-r));
      }
    });
    return id;
  }

  void unregister_file(FileId file) override {
    call([&] {
      if (file >= 0 && static_cast<std::size_t>(file) < fixed_file_ok_.size() &&
          fixed_file_ok_[static_cast<std::size_t>(file)]) {
        int minus_one = -1;
        io_uring_register_files_update(&ring_, static_cast<unsigned>(file), &minus_one, 1);
        fixed_file_ok_[static_cast<std::size_t>(file)] = false;
      }
    });
    files_.remove(file);
  }

  void register_buffers(std::span<const std::span<std::byte>> buffers) override {
    if (options_.fixed_buffers == FixedBuffers::Off) return;
    std::vector<iovec> iov;
    std::vector<RegisteredBuffer> ranges;
    for (auto b : buffers) {
      // The kernel caps one registered buffer at 1 GiB; larger ones are registered in parts.
      constexpr std::size_t kMaxReg = std::size_t{1} << 30;
      for (std::size_t off = 0; off < b.size(); off += kMaxReg) {
        const std::size_t n = std::min(kMaxReg, b.size() - off);
        iov.push_back(iovec{b.data() + off, n});
        ranges.push_back(RegisteredBuffer{b.data() + off, b.data() + off + n});
      }
    }
    call([&] {
      STRATA_CHECK(inflight_ == 0, "register_buffers() called with {} requests in flight", inflight_);
      if (!registered_.empty()) io_uring_unregister_buffers(&ring_);
      registered_.clear();
      if (iov.empty()) return;
      int r = io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size()));
      if (r < 0) {
        spdlog::debug("io_uring: fixed buffers refused ({}); using plain reads/writes", errno_text(-r));
        buffers_note_ = fmt::format("fixed-buffers refused ({})", errno_text(-r));
        return;
      }
      registered_ = std::move(ranges);
      buffers_note_ = fmt::format("fixed-buffers({})", registered_.size());
    });
  }

  IoHandle queue_batch(std::span<const IoRequest> requests, IoCallback callback, IoTimes* times) override {
    SplitBatch split =
        split_requests(requests, limits_.read_bytes, limits_.write_bytes, std::move(callback), files_, times);
    if (split.pieces.empty()) return IoHandle(split.batch);
    const bool from_engine_thread = std::this_thread::get_id() == engine_thread_;
    {
      std::lock_guard lock(mutex_);
      if (broken_) std::rethrow_exception(broken_);
      // A callback's request goes straight to the engine's own queue: reap() fills the freed slot
      // before it handles the next completion (Note [Refill before the next completion]).
      auto& queue = from_engine_thread ? pending_ : incoming_;
      for (auto& p : split.pieces) queue.push_back(std::move(p));
    }
    if (!from_engine_thread) wake();
    return IoHandle(split.batch);
  }

  IoEngineInfo info() const override {
    std::lock_guard lock(mutex_);
    std::string f = flags_text_;
    if (fixed_files_) f += " fixed-files";
    if (!buffers_note_.empty()) f += " " + buffers_note_;
    if (options_.coalesce == Coalesce::On) f += " coalesce";
    return IoEngineInfo{"io_uring", f, options_.queue_depth, limits_.read_bytes, limits_.write_bytes};
  }

 private:
  // ---- hand-over from caller threads ----
  void wake() {
    if (idle_.exchange(false)) {
      const std::uint64_t one = 1;
      [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof one);
    }
  }
  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      if (!broken_) {
        control_.push_back(std::move(task));
        task = nullptr;
      }
    }
    if (task) {
      task();  // the engine thread has stopped (broken ring); nothing else touches the ring now
      return;
    }
    wake();
  }
  // Runs `fn` on the engine thread and waits (ring registration must come from the ring's owner).
  void call(const std::function<void()>& fn) {
    std::promise<std::exception_ptr> done;
    auto f = done.get_future();
    post([&] {
      try {
        fn();
        done.set_value(nullptr);
      } catch (...) {
        done.set_value(std::current_exception());
      }
    });
    if (auto err = f.get()) std::rethrow_exception(err);
  }

  // ---- the engine thread ----
  void thread_main(std::promise<std::exception_ptr>& started) {
    engine_thread_ = std::this_thread::get_id();  // read by callers only after `started` is set
    try {
      pin_engine_thread(options_.cpu);
      setup_ring();
    } catch (...) {
      started.set_value(std::current_exception());
      return;
    }
    started.set_value(nullptr);
    try {
      loop();
    } catch (...) {
      // A failed ring (a CHECK above) fails every queued and in-flight batch instead of hanging them.
      auto err = std::current_exception();
      spdlog::error("io_uring engine stopped; failing all queued I/O");
      std::vector<std::function<void()>> control;
      {
        std::lock_guard lock(mutex_);
        broken_ = err;
      }
      take_incoming(control);
      for (auto& p : pending_) p.batch->piece_done(err);
      pending_.clear();
      for (unsigned i = 0; i < slots_.size(); ++i) {
        if (!slots_[i].parts.empty()) finish_slot(i, err);
      }
      for (auto& c : control) c();
    }
    io_uring_queue_exit(&ring_);
  }

  void setup_ring() {
    const unsigned entries = options_.queue_depth + 2;  // + the armed eventfd read, + rounding slack
    const RingSetup setup = setup_uring(ring_, options_, entries, kSparseFiles);
    options_.sqpoll = setup.sqpoll;
    flags_text_ = setup.flags_text;
    fixed_files_ = setup.fixed_files;
    slots_.resize(options_.queue_depth);
    for (unsigned i = 0; i < options_.queue_depth; ++i) free_slots_.push_back(options_.queue_depth - 1 - i);
    if (options_.iopoll == IoPoll::Off) arm_wake();  // an IOPOLL ring takes only O_DIRECT reads/writes
  }

  void arm_wake() {
    io_uring_sqe* sqe = get_sqe();
    io_uring_prep_read(sqe, wake_fd_, &wake_value_, sizeof wake_value_, 0);
    io_uring_sqe_set_data64(sqe, kWakeTag);
    ++unsubmitted_;
  }

  io_uring_sqe* get_sqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {  // SQ full: push what is queued to the kernel, then retry
      submit_pending_sqes(0);
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  // Submits the prepared SQEs and waits for `wait_nr` completions, retrying EINTR/EAGAIN/EBUSY.
  // The slots submitted for the first time are stamped (IoTimes): when the call returned, or when
  // it was entered if it also slept.
  void submit_pending_sqes(unsigned wait_nr) {
    for (;;) {
      const auto entered = std::chrono::steady_clock::now();
      int r = wait_nr > 0 ? io_uring_submit_and_wait(&ring_, wait_nr) : io_uring_submit(&ring_);
      if (r >= 0) {
        unsubmitted_ = 0;
        stamp_submitted(wait_nr > 0 ? entered : std::chrono::steady_clock::now());
        return;
      }
      if (r == -EINTR || r == -EAGAIN || r == -EBUSY) {
        if (wait_nr == 0) return;  // the SQEs stay queued; the next submit takes them
        continue;
      }
      STRATA_CHECK(false, "io_uring_submit failed: {}", errno_text(-r));
    }
  }

  void stamp_submitted(std::chrono::steady_clock::time_point when) {
    for (const unsigned index : unstamped_) {
      for (const Part& part : slots_[index].parts) part.batch->mark_submitted(when);
    }
    unstamped_.clear();
  }

  int find_buffer(const std::byte* p, std::size_t n) const {
    for (std::size_t i = 0; i < registered_.size(); ++i) {
      if (p >= registered_[i].begin && p + n <= registered_[i].end) return static_cast<int>(i);
    }
    return -1;
  }

  void prep_slot(unsigned index) {
    Slot& s = slots_[index];
    io_uring_sqe* sqe = get_sqe();
    const std::size_t left = s.length_bytes - s.done_bytes;
    std::byte* buf = s.buffer + s.done_bytes;
    const std::uint64_t off = s.offset_bytes + s.done_bytes;
    const bool fixed_file = static_cast<std::size_t>(s.file) < fixed_file_ok_.size() &&
                            fixed_file_ok_[static_cast<std::size_t>(s.file)];
    const int fd = fixed_file ? s.file : files_.get(s.file).fd;
    const std::size_t issue = options_.faults != nullptr ? options_.faults->submit_length(s.op, left) : left;
    const auto n = static_cast<unsigned>(issue);
    if (s.buf_index >= 0) {
      if (s.op == IoOp::Read) io_uring_prep_read_fixed(sqe, fd, buf, n, off, s.buf_index);
      else io_uring_prep_write_fixed(sqe, fd, buf, n, off, s.buf_index);
    } else {
      if (s.op == IoOp::Read) io_uring_prep_read(sqe, fd, buf, n, off);
      else io_uring_prep_write(sqe, fd, buf, n, off);
    }
    if (fixed_file) io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
    io_uring_sqe_set_data64(sqe, index);
    ++unsubmitted_;
    if (s.done_bytes == 0 && s.retries == 0) unstamped_.push_back(index);  // a first submission
  }

  // Moves pending pieces into free slots, merging adjacent ones (Note [Request size and merging]).
  void fill_slots() {
    // A full batch goes to the kernel before the next SQE is prepared; the last, partial one goes
    // with the loop's wait, in the same io_uring_enter (Note [Request size and merging], (3)).
    while (!resubmit_.empty()) {
      if (unsubmitted_ >= submit_batch_) submit_pending_sqes(0);
      prep_slot(resubmit_.front());
      resubmit_.pop_front();
    }
    while (!free_slots_.empty() && !pending_.empty()) {
      const unsigned index = free_slots_.back();
      free_slots_.pop_back();
      Slot& s = slots_[index];
      IoPiece& first = pending_.front();
      s.op = first.op;
      s.file = first.file;
      s.offset_bytes = first.offset_bytes;
      s.buffer = first.buffer;
      s.length_bytes = first.length_bytes;
      s.done_bytes = 0;
      s.retries = 0;
      s.buf_index = find_buffer(first.buffer, first.length_bytes);
      s.parts.clear();
      s.parts.push_back(Part{std::move(first.batch)});
      pending_.pop_front();
      const std::size_t max_bytes = s.op == IoOp::Write ? limits_.write_bytes : limits_.read_bytes;
      while (options_.coalesce == Coalesce::On && !pending_.empty()) {
        IoPiece& next = pending_.front();
        const bool adjacent = next.op == s.op && next.file == s.file &&
                              next.offset_bytes == s.offset_bytes + s.length_bytes &&
                              next.buffer == s.buffer + s.length_bytes &&
                              s.length_bytes + next.length_bytes <= max_bytes &&
                              find_buffer(next.buffer, next.length_bytes) == s.buf_index;
        if (!adjacent) break;
        s.length_bytes += next.length_bytes;
        s.parts.push_back(Part{std::move(next.batch)});
        pending_.pop_front();
      }
      ++inflight_;
      if (unsubmitted_ >= submit_batch_) submit_pending_sqes(0);
      prep_slot(index);
    }
  }

  void finish_slot(unsigned index, const std::exception_ptr& err) {
    Slot& s = slots_[index];
    for (Part& part : s.parts) part.batch->piece_done(err);
    s.parts.clear();
    free_slots_.push_back(index);
    --inflight_;
  }

  void complete(unsigned index, long res) {
    Slot& s = slots_[index];
    const std::size_t left = s.length_bytes - s.done_bytes;
    if (options_.faults != nullptr) res = options_.faults->on_complete(s.op, res, s.buffer + s.done_bytes, left);
    auto path = [&] { return files_.get(s.file).path; };
    if (res == -EAGAIN || res == -EINTR || (res == 0 && s.op == IoOp::Write)) {
      if (++s.retries > options_.max_retries) {
        const int e = res == 0 ? EIO : static_cast<int>(-res);
        finish_slot(index, make_io_error(s.op, path(), s.offset_bytes + s.done_bytes, left, e,
                                         fmt::format("{} still after {} retries", errno_text(e), options_.max_retries)));
        return;
      }
      resubmit_.push_back(index);
      return;
    }
    if (res < 0) {
      finish_slot(index, make_io_error(s.op, path(), s.offset_bytes + s.done_bytes, left, static_cast<int>(-res)));
      return;
    }
    if (res == 0) {
      finish_slot(index, make_io_error(s.op, path(), s.offset_bytes + s.done_bytes, left, ENODATA, "end of file reached"));
      return;
    }
    s.retries = 0;
    s.done_bytes += std::min(static_cast<std::size_t>(res), left);
    if (s.done_bytes < s.length_bytes) {
      resubmit_.push_back(index);  // short transfer: the rest goes again
      return;
    }
    finish_slot(index, nullptr);
  }

  void take_incoming(std::vector<std::function<void()>>& control) {
    std::lock_guard lock(mutex_);
    for (auto& p : incoming_) pending_.push_back(std::move(p));
    incoming_.clear();
    for (auto& c : control_) control.push_back(std::move(c));
    control_.clear();
  }

  bool has_incoming() {
    std::lock_guard lock(mutex_);
    return !incoming_.empty() || !control_.empty();
  }

  void loop() {
    std::vector<std::function<void()>> control;
    std::vector<io_uring_cqe*> cqes(options_.queue_depth + 2);
    for (;;) {
      control.clear();
      take_incoming(control);
      for (auto& c : control) c();
      if (stop_ && pending_.empty() && inflight_ == 0 && resubmit_.empty()) break;
      fill_slots();
      if (options_.iopoll == IoPoll::On) {
        poll_once(cqes);
        continue;
      }
      // Sleep in the kernel until a completion (I/O or the wake eventfd) arrives.
      idle_.store(true);
      if (has_incoming()) {
        idle_.store(false);
        if (unsubmitted_ > 0) submit_pending_sqes(0);
        reap(cqes);
        continue;
      }
      submit_pending_sqes(1);
      idle_.store(false);
      reap(cqes);
    }
  }

  // IOPOLL: the eventfd cannot be read through the ring, so the thread sleeps on it outside the
  // ring when nothing is in flight, and otherwise polls the device in io_uring_enter until one
  // request completes (a caller's new requests wait at most that long).
  void poll_once(std::vector<io_uring_cqe*>& cqes) {
    if (inflight_ == 0 && resubmit_.empty()) {
      idle_.store(true);
      if (!has_incoming()) {
        std::uint64_t value = 0;
        while (::read(wake_fd_, &value, sizeof value) < 0 && errno == EINTR) {
        }
      }
      idle_.store(false);
      return;
    }
    submit_pending_sqes(1);
    reap(cqes);
  }

  // Note [Refill before the next completion]
  // A slot freed by a completion is refilled, and its SQE submitted, before the next completion is
  // handled: from the pending queue, from a resubmission (EAGAIN, short transfer), or from the
  // completion's own callback queueing the next request (the bench keeps its depth so, and so does
  // any caller that chains I/O from callbacks; on the engine thread queue_batch goes straight to
  // pending_). Refilling only after the whole reaped batch left each new request waiting for the
  // batch's other callbacks and for one io_uring_enter per earlier refill: at queue depth 64 on a
  // virtio disk ~20 completions a reap and ~4 us an enter, 68 us slat p50 (docs/MEASUREMENTS.md,
  // "Bench io 4 KiB rows: refill before the next completion"). The last refill of a reap still
  // goes with the loop's wait, so the system calls per request are as before (one at qd 1).
  void reap(std::vector<io_uring_cqe*>& cqes) {
    for (;;) {
      const unsigned n = io_uring_peek_batch_cqe(&ring_, cqes.data(), static_cast<unsigned>(cqes.size()));
      if (n == 0) return;
      bool rearm = false;
      for (unsigned i = 0; i < n; ++i) {
        const std::uint64_t tag = io_uring_cqe_get_data64(cqes[i]);
        const long res = cqes[i]->res;
        if (tag == kWakeTag) {
          rearm = true;
          continue;
        }
        if (unsubmitted_ >= submit_batch_) submit_pending_sqes(0);  // the last refill, before this completion
        complete(static_cast<unsigned>(tag), res);
        fill_slots();
      }
      io_uring_cq_advance(&ring_, n);
      if (rearm) arm_wake();
    }
  }

  IoEngineOptions options_;
  RequestLimits limits_{};
  unsigned submit_batch_ = 0;
  FileTable files_;
  int wake_fd_ = -1;
  std::uint64_t wake_value_ = 0;
  std::atomic<bool> idle_{false};

  mutable std::mutex mutex_;  // guards incoming_, control_, broken_, and the info strings
  std::deque<IoPiece> incoming_;
  std::deque<std::function<void()>> control_;
  std::exception_ptr broken_;
  std::string flags_text_;
  std::string buffers_note_;

  // Engine thread only:
  io_uring ring_{};
  bool fixed_files_ = false;
  bool stop_ = false;
  std::vector<bool> fixed_file_ok_;
  std::vector<RegisteredBuffer> registered_;
  std::deque<IoPiece> pending_;
  std::vector<Slot> slots_;
  std::vector<unsigned> free_slots_;
  std::deque<unsigned> resubmit_;
  std::vector<unsigned> unstamped_;  // slots prepared for their first submission, not yet submitted
  unsigned inflight_ = 0;
  unsigned unsubmitted_ = 0;
  std::thread thread_;
  std::thread::id engine_thread_;
};

}  // namespace

std::unique_ptr<IoEngine> make_uring_engine(const IoEngineOptions& options) {
  return std::make_unique<UringEngine>(options);
}

}  // namespace strata::offload::detail
