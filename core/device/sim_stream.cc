// The sim device's streams (core/device/sim_stream.h): each Stream is an ordered queue run by its own
// worker thread, with CUDA's rules: a failed task's error is sticky, control tasks (event records and
// waits, frees) always run, device ranges must lie in one live allocation, and a copy of pageable
// host memory blocks its caller (Note [Pageable copies] below). Kernels are CPU functions the worker
// runs in stream order (Note [Sim kernels] in core/device/sim_kernel.h).
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
#include "core/device/sim_stream.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "core/device/schedule_chaos.h"
#include "core/device/sim_event.h"
#include "core/device/sim_kernel.h"
#include "core/device/sim_state.h"
#include "core/error.h"

namespace strata {
namespace sim_backend {

bool& on_sim_stream_worker() noexcept {
  thread_local bool inside = false;
  return inside;
}

void refuse_inside_kernel(std::string_view device_name, std::string_view what) {
  if (!on_sim_stream_worker()) return;
  throw DeviceError(fmt::format(
      "{}: {} inside a sim kernel: a kernel runs on the device and must never wait for the host or for other "
      "streams (a GPU would hang). Wait on events from a host thread, then enqueue the next work (Note [Sim "
      "kernels] in core/device/sim_kernel.h)",
      device_name, what));
}

namespace {

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
                 state.allocator.arena_bytes());
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

  // See Note [Pageable copies] above.
  // Queues a copy between the device and `host`; when [host, host + bytes)
  // is not inside one pinned buffer, counts it and blocks until it has run. Inside a sim kernel such
  // a copy would make the device wait (Note [Sim kernels] in core/device/sim_kernel.h): refused.
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
        // Pinned while the task runs: the arena outlives this copy (Note [Sim lifetimes] in
        // core/device/sim_state.h).
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

}  // namespace

std::unique_ptr<Stream> make_sim_stream(const std::shared_ptr<SimDeviceState>& device, std::string name) {
  return std::make_unique<SimStream>(device, std::move(name));
}

}  // namespace sim_backend

bool inside_sim_kernel() noexcept { return sim_backend::on_sim_stream_worker(); }

void launch_sim_kernel(Stream& stream, std::function<void()> kernel) {
  auto* queue = dynamic_cast<SimKernelQueue*>(&stream);
  if (queue == nullptr) {
    throw DeviceError(fmt::format("stream '{}' of {} is not a sim stream: a CPU kernel runs only on the sim device; "
                                  "use the device's own kernels",
                                  stream.name(), stream.device().name()));
  }
  queue->launch_kernel(std::move(kernel));
}

}  // namespace strata
