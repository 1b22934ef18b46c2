// The `sim` backend of the Device abstraction (contract in core/device/device.h): device memory is
// host memory inside a capped arena (core/device/sim_allocator.h), each Stream is an ordered queue
// run by its own worker thread, Events are generation counters, and copies can be throttled to a
// modeled link so that overlap of copies with each other and with compute is real wall time.
//
// Note [Sim lifetimes]: the Device owns a shared SimDeviceState (arena, links, pin registry).
// DeviceMemory, Stream and Event hold it weakly, so every call after the Device is gone finds the
// state expired (or marked destroyed) and throws DeviceError, and destroying them afterwards does
// nothing harmful. A stream's worker pins the state only while it runs one task, so an arena is
// never unmapped under a copy that is in flight; work still queued when the Device dies fails with
// the same "destroyed" error instead of touching freed memory.
//
// Note [Modeled link]: each copy direction (h2d, d2h, d2d) is one shared link with a "busy until"
// time. A copy reserves [max(now, busy_until), + bytes/bandwidth) under the link's mutex, does its
// memcpy, then sleeps until the reserved end plus the fixed latency. Two concurrent copies in one
// direction therefore share its bandwidth (they queue on the link), while h2d and d2h overlap (full
// duplex, as PCIe). Latency does not occupy the link (requests pipeline), it only delays completion.
// The memcpy happens at the start of the window; nobody can observe the data before the modeled
// completion because completion is only visible through the stream's order. When the memcpy itself
// is slower than the model, the copy takes the memcpy's time: the model is a lower bound.
//
// Note [Pageable copies]: an "asynchronous" CUDA copy between the device and pageable host memory
// (not page-locked through pin_host) may be synchronous with the host: to pageable memory it
// returns only once the copy has run; from pageable memory the driver may wait for the stream and
// stage the data (the CUDA API reference, "API synchronization behavior"). Only pinned memory is
// sure to give an asynchronous copy. The sim device takes the worst case: copy_h2d and copy_d2h
// with a host range that is not inside one pinned buffer block the calling thread until the copy
// has run, after the stream's earlier work. So a pageable copy shows as the host synchronization
// it may be, an order that could hang on cuda (the host waits for a stream that waits for the
// host) hangs on sim too, and a pageable copy from inside a sim kernel, which would make the device
// wait (Note [Sim kernels] in core/device/sim_kernel.h), is refused with a DeviceError.
//
// Note [Pinning while streams run]: CUDA's programming guide lists a page-locked host allocation
// among the calls that synchronize streams implicitly (two commands of different streams cannot
// overlap when one is issued between them), and cudaHostRegister may wait for the device. A pin in
// the middle of a step, while streams work, therefore stalls every stream on cuda (no stream waits
// for a host thread, Note [Host-driven offload], so it cannot deadlock, but it costs time). Both backends count
// pin_host calls (MemoryStats::host_pins); `strata train` reports them per step, and the engine
// pins its host buffers before the first step's work, so every step pins nothing
// (train_offload_test.sh checks it). Counting every pin, rather than only those that met a
// working stream, keeps the check deterministic: whether a stream is still busy at the moment of a
// pin is a matter of timing.
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "core/device/device.h"
#include "core/device/schedule_chaos.h"
#include "core/device/sim_allocator.h"
#include "core/device/sim_kernel.h"
#include "core/error.h"
#include "core/units.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

// Note [Modeled link] above.
class ModeledLink {
 public:
  ModeledLink(double gbps, double latency_us)
      : bytes_per_s_(gbps * 1e9),
        latency_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(latency_us))) {}

  // Copies `bytes` from src to dst (memmove: d2d ranges may overlap) in the modeled time.
  void copy(void* dst, const void* src, std::size_t bytes) {
    const std::optional<Clock::time_point> finish = reserve(bytes);
    std::memmove(dst, src, bytes);
    if (finish) std::this_thread::sleep_until(*finish);
  }
  void fill(void* dst, int value, std::size_t bytes) {
    const std::optional<Clock::time_point> finish = reserve(bytes);
    std::memset(dst, value, bytes);
    if (finish) std::this_thread::sleep_until(*finish);
  }

 private:
  std::optional<Clock::time_point> reserve(std::size_t bytes) {
    if (bytes_per_s_ <= 0 && latency_ == Clock::duration::zero()) return std::nullopt;  // as fast as memcpy
    const auto transfer = bytes_per_s_ > 0 ? std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                                 static_cast<double>(bytes) / bytes_per_s_))
                                           : Clock::duration::zero();
    const auto now = Clock::now();
    std::lock_guard lock(mutex_);
    const auto start = std::max(now, busy_until_);
    busy_until_ = start + transfer;
    return busy_until_ + latency_;
  }

  const double bytes_per_s_;
  const Clock::duration latency_;
  std::mutex mutex_;
  Clock::time_point busy_until_{};
};


// What DeviceMemory, Stream and Event share with the Device (Note [Sim lifetimes]).
class SimDeviceState final : public detail::DeviceMemoryReleaser {
 public:
  explicit SimDeviceState(const SimDeviceOptions& o)
      : name(fmt::format("sim:{}", o.ordinal)),
        allocator(SimAllocatorOptions{.device_name = name, .capacity_bytes = o.capacity_bytes,
                                      .alignment_bytes = o.alignment_bytes, .capacity_knob = o.capacity_knob}),
        h2d(o.h2d_gbps, o.latency_us),
        d2h(o.d2h_gbps, o.latency_us),
        d2d(o.d2d_gbps, o.latency_us),
        chaos_seed(o.chaos_seed),
        chaos_max_us(o.chaos_max_us) {}

  void release(void* ptr) noexcept override { allocator.release(ptr); }

  // Each stream's own generator (Note [Schedule chaos] in core/device/schedule_chaos.h), seeded
  // from the device's seed and the stream's creation index.
  ScheduleChaos chaos_for_next_stream() {
    const std::uint64_t index = streams_created.fetch_add(1);
    return ScheduleChaos(chaos_seed == 0 ? 0 : chaos_seed * 0x9E3779B97F4A7C15ULL + index + 1, chaos_max_us);
  }

  const std::string name;
  SimAllocator allocator;
  ModeledLink h2d;
  ModeledLink d2h;
  ModeledLink d2d;
  std::atomic<Device*> device{nullptr};  // null once the Device is destroyed
  const std::uint64_t chaos_seed;
  const double chaos_max_us;
  std::atomic<std::uint64_t> streams_created{0};

  std::mutex pinned_mutex;
  std::map<const void*, std::size_t> pinned;  // ptr -> bytes
  std::size_t pinned_bytes = 0;

  std::uint64_t pageable_copies = 0;  // under pinned_mutex, as the registry they are judged by
  std::uint64_t pageable_copy_bytes = 0;
  std::uint64_t host_pins = 0;  // under pinned_mutex (Note [Pinning while streams run])

  bool pinned_range(const void* ptr, std::size_t bytes) {
    std::lock_guard lock(pinned_mutex);
    return detail::inside_one_range(pinned, ptr, bytes);
  }
  void count_pageable(std::size_t bytes) {
    std::lock_guard lock(pinned_mutex);
    ++pageable_copies;
    pageable_copy_bytes += bytes;
  }
};

// True on a sim stream's worker thread, where kernels run (Note [Sim kernels] in
// core/device/sim_kernel.h).
bool& on_sim_stream_worker() noexcept {
  thread_local bool inside = false;
  return inside;
}

// What a GPU kernel cannot do (see Note [Sim kernels] in core/device/sim_kernel.h), a sim kernel may not do either.
void refuse_inside_kernel(std::string_view device_name, std::string_view what) {
  if (!on_sim_stream_worker()) return;
  throw DeviceError(fmt::format(
      "{}: {} inside a sim kernel: a kernel runs on the device and must never wait for the host or for other "
      "streams (a GPU would hang). Wait on events from a host thread, then enqueue the next work (Note [Sim "
      "kernels] in core/device/sim_kernel.h)",
      device_name, what));
}


[[noreturn]] void throw_destroyed(std::string_view device_name, std::string_view owner, std::string_view what) {
  throw DeviceError(fmt::format("device {} was destroyed; {} was used afterwards ({}). Streams, events and device "
                                "memory must not outlive their Device: destroy them first",
                                device_name, owner, what));
}

// `owner` and `what` only go into the message: nothing is formatted on the happy path.
std::shared_ptr<SimDeviceState> lock_alive(const std::weak_ptr<SimDeviceState>& weak, std::string_view device_name,
                                           std::string_view owner, std::string_view what) {
  auto state = weak.lock();
  if (!state || state->device.load() == nullptr) throw_destroyed(device_name, owner, what);
  return state;
}

// One event's record generations. gen 0 means "never recorded"; a generation is complete once
// the stream it was recorded on has passed it (exactly, even when records on several streams
// complete out of order).
struct SimEventState {
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t latest_gen = 0;
  std::set<std::uint64_t> pending_gens;
  Clock::time_point latest_completed_at{};

  std::uint64_t begin_record() {
    std::lock_guard lock(mutex);
    pending_gens.insert(++latest_gen);
    return latest_gen;
  }
  void complete(std::uint64_t gen) {
    {
      std::lock_guard lock(mutex);
      pending_gens.erase(gen);
      if (gen == latest_gen) latest_completed_at = Clock::now();
    }
    cv.notify_all();
  }
  void wait_for(std::uint64_t gen) {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return !pending_gens.contains(gen); });
  }
};

class SimEvent final : public Event {
 public:
  SimEvent(std::weak_ptr<SimDeviceState> device, std::string device_name)
      : device_(std::move(device)), device_name_(std::move(device_name)), state_(std::make_shared<SimEventState>()) {}

  bool query() override {
    lock_alive(device_, device_name_, "an event", "Event::query");
    std::lock_guard lock(state_->mutex);
    const std::uint64_t gen = recorded_gen_locked("Event::query");
    return !state_->pending_gens.contains(gen);
  }

  void synchronize() override {
    lock_alive(device_, device_name_, "an event", "Event::synchronize");
    refuse_inside_kernel(device_name_, "Event::synchronize");
    std::uint64_t gen = 0;
    {
      std::lock_guard lock(state_->mutex);
      gen = recorded_gen_locked("Event::synchronize");
    }
    state_->wait_for(gen);
  }

  double elapsed_ms_since(const Event& start_event) override {
    lock_alive(device_, device_name_, "an event", "Event::elapsed_ms_since");
    const auto* start = dynamic_cast<const SimEvent*>(&start_event);
    if (start == nullptr) {
      throw DeviceError(fmt::format("Event::elapsed_ms_since on {}: the start event belongs to another backend",
                                    device_name_));
    }
    const Clock::time_point start_at = start->completed_at("Event::elapsed_ms_since (start event)");
    const Clock::time_point end_at = completed_at("Event::elapsed_ms_since (end event)");
    return std::chrono::duration<double, std::milli>(end_at - start_at).count();
  }

  // The generation the latest record() created; throws if there was none.
  std::uint64_t recorded_gen_locked(std::string_view what, std::string_view stream_name = {}) const {
    if (state_->latest_gen == 0) {
      const std::string where = stream_name.empty() ? std::string() : fmt::format(" (stream '{}')", stream_name);
      throw DeviceError(fmt::format("{}{} on an event of {} that was never recorded: record it on a stream "
                                    "(Stream::record) before waiting on or querying it",
                                    what, where, device_name_));
    }
    return state_->latest_gen;
  }

  const std::shared_ptr<SimEventState>& state() const { return state_; }

 private:
  Clock::time_point completed_at(std::string_view what) const {
    std::lock_guard lock(state_->mutex);
    const std::uint64_t gen = recorded_gen_locked(what);
    if (state_->pending_gens.contains(gen)) {
      throw DeviceError(fmt::format("{} on {}: the event has not completed yet; synchronize it first", what,
                                    device_name_));
    }
    return state_->latest_completed_at;
  }

  std::weak_ptr<SimDeviceState> device_;
  std::string device_name_;
  std::shared_ptr<SimEventState> state_;
};

const SimEvent& as_sim_event(const Event& event, std::string_view what) {
  const auto* sim = dynamic_cast<const SimEvent*>(&event);
  if (sim == nullptr) {
    throw DeviceError(fmt::format("{}: the event was not created by a sim device; use Device::create_event of "
                                  "the stream's device",
                                  what));
  }
  return *sim;
}

class SimStream final : public Stream, public SimKernelQueue {
 public:
  SimStream(const std::shared_ptr<SimDeviceState>& device, std::string name)
      : device_(device),
        device_name_(device->name),
        name_(std::move(name)),
        owner_(fmt::format("stream '{}'", name_)),
        chaos_(device->chaos_for_next_stream()) {
    worker_ = std::thread([this] { worker_loop(); });
  }

  // Lets queued work finish (as cudaStreamDestroy does), then joins the worker. Errors are dropped:
  // a destructor cannot report them, and synchronize() was the place to see them.
  ~SimStream() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    worker_.join();
  }

  SimStream(const SimStream&) = delete;
  SimStream& operator=(const SimStream&) = delete;

  Device& device() override {
    auto state = lock_alive(device_, device_name_, owner_, "device");
    return *state->device.load();
  }
  const std::string& name() const override { return name_; }

  void copy_h2d(void* dst_device, const void* src_host, std::size_t bytes) override {
    auto state = usable_state("copy_h2d");
    if (bytes == 0) return rethrow_if_failed();  // a no-op, but a failed stream still says so
    check_device_range(*state, "copy_h2d", "destination", dst_device, bytes);
    check_host_pointer("copy_h2d", "source", src_host);
    enqueue_host_copy(*state, "copy_h2d", "source", src_host, bytes,
                      [=](SimDeviceState& s) { s.h2d.copy(dst_device, src_host, bytes); });
  }

  void copy_d2h(void* dst_host, const void* src_device, std::size_t bytes) override {
    auto state = usable_state("copy_d2h");
    if (bytes == 0) return rethrow_if_failed();  // a no-op, but a failed stream still says so
    check_host_pointer("copy_d2h", "destination", dst_host);
    check_device_range(*state, "copy_d2h", "source", src_device, bytes);
    enqueue_host_copy(*state, "copy_d2h", "destination", dst_host, bytes,
                      [=](SimDeviceState& s) { s.d2h.copy(dst_host, src_device, bytes); });
  }

  void copy_d2d(void* dst_device, const void* src_device, std::size_t bytes) override {
    auto state = usable_state("copy_d2d");
    if (bytes == 0) return rethrow_if_failed();  // a no-op, but a failed stream still says so
    check_device_range(*state, "copy_d2d", "destination", dst_device, bytes);
    check_device_range(*state, "copy_d2d", "source", src_device, bytes);
    enqueue_work([=](SimDeviceState& s) { s.d2d.copy(dst_device, src_device, bytes); });
  }

  // Device memory bandwidth is what a memset spends, so it shares the d2d link.
  void memset(void* dst_device, int value, std::size_t bytes) override {
    auto state = usable_state("memset");
    if (bytes == 0) return rethrow_if_failed();  // a no-op, but a failed stream still says so
    check_device_range(*state, "memset", "destination", dst_device, bytes);
    enqueue_work([=](SimDeviceState& s) { s.d2d.fill(dst_device, value, bytes); });
  }

  // Note [Sim kernels] in core/device/sim_kernel.h.
  void launch_kernel(std::function<void()> kernel) override {
    usable_state("launch_kernel");
    if (!kernel) {
      throw DeviceError(fmt::format("stream '{}' on {}: launch_kernel got an empty function", name_, device_name_));
    }
    enqueue_work([kernel = std::move(kernel)](SimDeviceState&) { kernel(); });
  }

  void release_after(DeviceMemory memory) override {
    auto state = usable_state("release_after");
    // As the cuda backend, which calls cudaFreeAsync now (Note [Released memory] in
    // core/device/sim_allocator.h): work issued from here on may not name the memory, though
    // queued work still may.
    if (!memory.empty()) state->allocator.retire(memory.data());
    // std::function needs a copyable callable; the shared_ptr carries the move-only owner.
    auto held = std::make_shared<DeviceMemory>(std::move(memory));
    enqueue(Task{TaskKind::Control, [held](SimDeviceState*) { held->reset(); }}, nullptr);
  }

  void record(Event& event) override {
    usable_state("record");
    const std::shared_ptr<SimEventState> event_state = as_sim_event(event, "Stream::record").state();
    std::uint64_t gen = 0;
    // The generation is created under the stream's lock, after the sticky-error check, so a
    // record that fails to enqueue never leaves a generation that would stay pending forever.
    enqueue(Task{TaskKind::Control, nullptr}, [&](Task& task) {
      gen = event_state->begin_record();
      task.run = [event_state, gen](SimDeviceState*) { event_state->complete(gen); };
    });
  }

  void wait(const Event& event) override {
    usable_state("wait");
    const SimEvent& sim_event = as_sim_event(event, "Stream::wait");
    const std::shared_ptr<SimEventState>& event_state = sim_event.state();
    std::uint64_t gen = 0;
    {
      std::lock_guard lock(event_state->mutex);
      gen = sim_event.recorded_gen_locked("Stream::wait", name_);
    }
    enqueue(Task{TaskKind::Control, [event_state, gen](SimDeviceState*) { event_state->wait_for(gen); }}, nullptr);
  }

  void synchronize() override {
    lock_alive(device_, device_name_, owner_, "synchronize");
    refuse_inside_kernel(device_name_, fmt::format("Stream::synchronize of stream '{}'", name_));
    std::unique_lock lock(mutex_);
    idle_cv_.wait(lock, [&] { return completed_ == enqueued_; });
    rethrow_if_failed_locked();
  }

  void* native_handle() override {
    lock_alive(device_, device_name_, owner_, "native_handle");
    return nullptr;
  }

 private:
  // Work touches device memory and is skipped once the stream has failed; control tasks (record,
  // wait, release_after) always run so other streams waiting on this one never hang and memory
  // handed to release_after is always freed.
  enum class TaskKind { Work, Control };
  struct Task {
    TaskKind kind;
    std::function<void(SimDeviceState*)> run;
  };

  std::shared_ptr<SimDeviceState> usable_state(std::string_view what) {
    return lock_alive(device_, device_name_, owner_, what);
  }

  void check_device_range(const SimDeviceState& state, std::string_view what, std::string_view role,
                          const void* ptr, std::size_t bytes) const {
    STRATA_CHECK(state.allocator.contains(ptr, bytes),
                 "stream '{}' {}: {} [{}, +{} bytes) is not inside the device memory of {} ([{}, +{} bytes)); "
                 "pass memory from this device's allocate()",
                 name_, what, role, ptr, bytes, state.name, static_cast<const void*>(state.allocator.arena_base()),
                 state.allocator.capacity_bytes());
    if (bytes == 0) return;
    // As cudaMemcpyAsync, which refuses a range outside one live allocation ("invalid argument").
    const std::string why = state.allocator.usable(ptr, bytes);
    STRATA_CHECK(why.empty(), "stream '{}' {}: {} [{}, +{} bytes) on {}: {}", name_, what, role, ptr, bytes, state.name,
                 why);
  }

  void check_host_pointer(std::string_view what, std::string_view role, const void* ptr) const {
    STRATA_CHECK(ptr != nullptr, "stream '{}' on {} {}: {} host pointer is null", name_, device_name_, what, role);
  }

  std::uint64_t enqueue_work(std::function<void(SimDeviceState&)> fn) {
    return enqueue(Task{TaskKind::Work, [fn = std::move(fn)](SimDeviceState* state) { fn(*state); }}, nullptr);
  }

  // Appends `task` (after `prepare`, run under the stream's lock) unless the stream has failed;
  // returns its ticket (the count of tasks enqueued with it).
  std::uint64_t enqueue(Task task, const std::function<void(Task&)>& prepare) {
    std::uint64_t ticket = 0;
    {
      std::lock_guard lock(mutex_);
      rethrow_if_failed_locked();
      if (prepare) prepare(task);
      queue_.push_back(std::move(task));
      ticket = ++enqueued_;
    }
    work_cv_.notify_one();
    return ticket;
  }

  // Blocks until the task with `ticket` has run; rethrows the stream's error when it came from that
  // task or an earlier one (a synchronous copy reports its own failure, or the failure that made the
  // stream skip it, as cudaMemcpyAsync from pageable memory does). A failure of work queued after
  // it (by another thread, say) is not this copy's: that copy's data arrived, and the error stays
  // sticky for the stream's next enqueue or synchronize.
  void wait_for_ticket(std::uint64_t ticket) {
    std::unique_lock lock(mutex_);
    idle_cv_.wait(lock, [&] { return completed_ >= ticket; });
    if (error_ticket_ <= ticket) rethrow_if_failed_locked();
  }

  // See Note [Pageable copies] in core/device/sim_device.cc.
  // Queues a copy between the device and `host`; when [host, host + bytes)
  // is not inside one pinned buffer, counts it and blocks until it has run. Inside a sim kernel such
  // a copy would make the device wait (Note [Sim kernels]): refused.
  void enqueue_host_copy(SimDeviceState& state, std::string_view what, std::string_view role, const void* host,
                         std::size_t bytes, std::function<void(SimDeviceState&)> fn) {
    if (state.pinned_range(host, bytes)) {
      enqueue_work(std::move(fn));
      return;
    }
    if (on_sim_stream_worker()) throw_pageable_inside_kernel(what, role);
    const std::uint64_t ticket = enqueue_work(std::move(fn));
    state.count_pageable(bytes);
    wait_for_ticket(ticket);
  }

  [[noreturn]] void throw_pageable_inside_kernel(std::string_view what, std::string_view role) const {
    throw DeviceError(fmt::format(
        "stream '{}' on {}: {} from inside a sim kernel with a {} in pageable host memory: the copy is synchronous "
        "(Note [Pageable copies]), and a kernel must never wait (Note [Sim kernels] in core/device/sim_kernel.h); "
        "issue the copy from a host thread, or pin the host memory (HostBuffer)",
        name_, device_name_, what, role));
  }

  void rethrow_if_failed() {
    std::lock_guard lock(mutex_);
    rethrow_if_failed_locked();
  }

  void rethrow_if_failed_locked() const {
    if (error_) {
      throw DeviceError(fmt::format("stream '{}' on {}: earlier work on this stream failed: {}", name_, device_name_,
                                    *error_));
    }
  }

  void worker_loop() {
    on_sim_stream_worker() = true;
    for (;;) {
      Task task;
      bool skip = false;
      {
        std::unique_lock lock(mutex_);
        work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything queued has run
        task = std::move(queue_.front());
        queue_.pop_front();
        skip = error_.has_value() && task.kind == TaskKind::Work;
      }
      chaos_.pause();  // see Note [Schedule chaos] in core/device/schedule_chaos.h
      std::optional<std::string> failure;
      if (!skip) failure = run_task(task);
      task.run = nullptr;  // drop captures (release_after's memory) before the task counts as done
      {
        std::lock_guard lock(mutex_);
        if (failure && !error_) {
          error_ = std::move(failure);
          error_ticket_ = completed_ + 1;  // tasks run in ticket order: this one's ticket
        }
        ++completed_;
      }
      idle_cv_.notify_all();
    }
  }

  std::optional<std::string> run_task(Task& task) {
    try {
      if (task.kind == TaskKind::Control) {
        task.run(nullptr);
      } else {
        // Pinned while the task runs: the arena outlives this copy (Note [Sim lifetimes]).
        auto state = lock_alive(device_, device_name_, owner_, "work queued before the device was destroyed");
        task.run(state.get());
      }
    } catch (const std::exception& e) {
      return std::string(e.what());
    } catch (...) {
      return std::string("a non-standard exception was thrown");
    }
    return std::nullopt;
  }

  const std::weak_ptr<SimDeviceState> device_;
  const std::string device_name_;
  const std::string name_;
  const std::string owner_;  // "stream 'name'", for messages
  ScheduleChaos chaos_;  // used by the worker only

  std::mutex mutex_;
  std::condition_variable work_cv_;  // worker waits for tasks
  std::condition_variable idle_cv_;  // synchronize waits for completed_ == enqueued_
  std::deque<Task> queue_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t completed_ = 0;
  bool stopping_ = false;
  std::optional<std::string> error_;  // sticky: the first failure's message
  std::uint64_t error_ticket_ = UINT64_MAX;  // the ticket of the task that failed first
  std::thread worker_;                // last: starts after everything above exists
};

class SimDevice final : public Device {
 public:
  explicit SimDevice(const SimDeviceOptions& options) : state_(std::make_shared<SimDeviceState>(options)) {
    state_->device.store(this);
  }
  ~SimDevice() override { state_->device.store(nullptr); }
  SimDevice(const SimDevice&) = delete;
  SimDevice& operator=(const SimDevice&) = delete;

  DeviceKind kind() const override { return DeviceKind::Sim; }
  std::string name() const override { return state_->name; }
  std::size_t capacity_bytes() const override { return state_->allocator.capacity_bytes(); }

  DeviceMemory allocate(std::size_t bytes, std::string_view tag) override {
    void* ptr = state_->allocator.allocate(bytes, tag);
    return DeviceMemory(ptr, bytes, std::weak_ptr<detail::DeviceMemoryReleaser>(state_));
  }

  MemoryStats memory_stats() const override {
    MemoryStats stats = state_->allocator.stats();
    std::lock_guard lock(state_->pinned_mutex);
    stats.pinned_host_bytes = state_->pinned_bytes;
    stats.pageable_copies = state_->pageable_copies;
    stats.pageable_copy_bytes = state_->pageable_copy_bytes;
    stats.host_pins = state_->host_pins;
    return stats;
  }

  void reset_peak_stats() override { state_->allocator.reset_peak(); }

  std::unique_ptr<Stream> create_stream(std::string_view name) override {
    return std::make_unique<SimStream>(state_, std::string(name));
  }

  std::unique_ptr<Event> create_event() override { return std::make_unique<SimEvent>(state_, state_->name); }

  // Sim copies need no page-locking; the registry tells pinned from pageable copies (Note [Pageable
  // copies]), feeds the pinned_host_bytes statistic and catches double registration, which
  // cudaHostRegister also refuses. Page-locking may wait for the device (Note [Pinning while
  // streams run]), so inside a kernel it is refused (Note [Sim kernels]).
  void pin_host(void* ptr, std::size_t bytes) override {
    refuse_inside_kernel(state_->name, "pin_host");
    if (ptr == nullptr || bytes == 0) {
      throw DeviceError(fmt::format("{}: pin_host({}, {} bytes): nothing to pin; pass a non-empty host buffer",
                                    state_->name, ptr, bytes));
    }
    std::lock_guard lock(state_->pinned_mutex);
    if (!state_->pinned.emplace(ptr, bytes).second) {
      throw DeviceError(fmt::format("{}: pin_host({}): this host memory is already pinned; unpin it first",
                                    state_->name, ptr));
    }
    state_->pinned_bytes += bytes;
    ++state_->host_pins;  // Note [Pinning while streams run]
  }

  void unpin_host(void* ptr) noexcept override {
    std::lock_guard lock(state_->pinned_mutex);
    auto it = state_->pinned.find(ptr);
    if (it == state_->pinned.end()) return;
    state_->pinned_bytes -= it->second;
    state_->pinned.erase(it);
  }

 private:
  std::shared_ptr<SimDeviceState> state_;
};

void check_option(bool ok, std::string_view what, double value, std::string_view fix) {
  if (!ok) throw ConfigError(fmt::format("sim device option {} = {} is invalid; {}", what, value, fix));
}

}  // namespace

bool inside_sim_kernel() noexcept { return on_sim_stream_worker(); }

void launch_sim_kernel(Stream& stream, std::function<void()> kernel) {
  auto* queue = dynamic_cast<SimKernelQueue*>(&stream);
  if (queue == nullptr) {
    throw DeviceError(fmt::format("stream '{}' of {} is not a sim stream: a CPU kernel runs only on the sim device; "
                                  "use the device's own kernels",
                                  stream.name(), stream.device().name()));
  }
  queue->launch_kernel(std::move(kernel));
}

std::unique_ptr<Device> make_sim_device(const SimDeviceOptions& options) {
  check_option(options.ordinal >= 0, "ordinal", options.ordinal, "use 0 or above");
  const auto rate_ok = [](double v) { return std::isfinite(v) && v >= 0; };
  check_option(rate_ok(options.h2d_gbps), "h2d_gbps", options.h2d_gbps, "use 0 (unthrottled) or a positive GB/s");
  check_option(rate_ok(options.d2h_gbps), "d2h_gbps", options.d2h_gbps, "use 0 (unthrottled) or a positive GB/s");
  check_option(rate_ok(options.d2d_gbps), "d2d_gbps", options.d2d_gbps, "use 0 (unthrottled) or a positive GB/s");
  check_option(rate_ok(options.latency_us), "latency_us", options.latency_us, "use 0 or a positive microsecond count");
  check_option(rate_ok(options.chaos_max_us) && options.chaos_max_us <= 100000, "chaos_max_us", options.chaos_max_us,
               "use 0 to 100000 microseconds");
  return std::make_unique<SimDevice>(options);
}

}  // namespace strata
