// The tracing Device decorator (see core/device/traced_device.h).
#include "core/device/traced_device.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string_view>

#include <fmt/format.h>

#include "core/device/sim_kernel.h"
#include "core/error.h"
#include "core/file_io.h"

namespace strata {

double TraceRecorder::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
}

void TraceRecorder::add(TraceSlice slice) {
  std::lock_guard<std::mutex> lock(mutex_);
  slices_.push_back(std::move(slice));
}

void TraceRecorder::set_origin(std::shared_ptr<Event> origin, double origin_us) {
  std::lock_guard<std::mutex> lock(mutex_);
  origin_event_ = std::move(origin);
  origin_event_us_ = origin_us;
}

void TraceRecorder::add_timed(std::string stream, const char* op, std::size_t bytes, std::shared_ptr<Event> begin,
                              std::shared_ptr<Event> end) {
  std::lock_guard<std::mutex> lock(mutex_);
  timed_.push_back(Timed{TraceSlice{std::move(stream), op, bytes, 0, 0}, std::move(begin), std::move(end)});
  // Completed ones become slices now, so their events are not held for the whole run.
  while (!timed_.empty() && timed_.front().end->query()) resolve_front_locked();
}

void TraceRecorder::resolve_front_locked() const {
  Timed& t = timed_.front();
  STRATA_CHECK(origin_event_ != nullptr, "a timed trace slice without an origin event (make_traced_device sets it)");
  t.slice.begin_us = origin_event_us_ + 1000.0 * t.begin->elapsed_ms_since(*origin_event_);
  t.slice.end_us = origin_event_us_ + 1000.0 * t.end->elapsed_ms_since(*origin_event_);
  slices_.push_back(std::move(t.slice));
  timed_.pop_front();
}

std::vector<TraceSlice> TraceRecorder::slices() const {
  std::lock_guard<std::mutex> lock(mutex_);
  // A host thread waits on the events here, never a stream (Note [Host-driven offload] in docs/DESIGN.md).
  while (!timed_.empty()) {
    timed_.front().end->synchronize();
    resolve_front_locked();
  }
  return slices_;
}

void TraceRecorder::write_chrome_trace(const std::string& path, int rank) const {
  const auto all = slices();
  std::vector<std::string> streams;
  std::string out = "{\"traceEvents\":[\n";
  bool first = true;
  auto tid_of = [&](const std::string& s) {
    for (std::size_t i = 0; i < streams.size(); ++i) {
      if (streams[i] == s) return i;
    }
    streams.push_back(s);
    return streams.size() - 1;
  };
  for (const auto& s : all) {
    const std::size_t tid = tid_of(s.stream);
    out += fmt::format("{}{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f},"
                       "\"args\":{{\"bytes\":{}}}}}",
                       first ? "" : ",\n", s.op, s.stream, rank, tid, s.begin_us, s.end_us - s.begin_us, s.bytes);
    first = false;
  }
  for (std::size_t i = 0; i < streams.size(); ++i) {
    out += fmt::format("{}{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"{}\"}}}}",
                       first ? "" : ",\n", rank, i, streams[i]);
    first = false;
  }
  out += "\n]}\n";
  // Never through a planted link (Note [No writing through links] in core/file_io.h).
  const UniqueFd fd = open_output_file(path, "the trace", OutputOpen::Truncate);
  std::string_view rest = out;
  while (!rest.empty()) {
    const ssize_t n = ::write(fd.get(), rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      throw IoError(fmt::format("cannot write the trace to '{}': {}", path, errno_text(err)), err);
    }
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
}

namespace {

class TracedStream final : public Stream, public SimKernelQueue {
 public:
  TracedStream(Device& device, std::unique_ptr<Stream> inner, std::shared_ptr<TraceRecorder> recorder)
      : device_(device),
        inner_(std::move(inner)),
        recorder_(std::move(recorder)),
        sim_(dynamic_cast<SimKernelQueue*>(inner_.get())) {}

  Device& device() override { return device_; }
  const std::string& name() const override { return inner_->name(); }

  void copy_h2d(void* dst, const void* src, std::size_t bytes) override {
    traced("h2d", bytes, [&] { inner_->copy_h2d(dst, src, bytes); });
  }
  void copy_d2h(void* dst, const void* src, std::size_t bytes) override {
    traced("d2h", bytes, [&] { inner_->copy_d2h(dst, src, bytes); });
  }
  void copy_d2d(void* dst, const void* src, std::size_t bytes) override {
    traced("d2d", bytes, [&] { inner_->copy_d2d(dst, src, bytes); });
  }
  void memset(void* dst, int value, std::size_t bytes) override {
    traced("memset", bytes, [&] { inner_->memset(dst, value, bytes); });
  }
  // A sim kernel stamps its own slice: it runs on the sim stream's worker (Note [Sim kernels] in
  // core/device/sim_kernel.h).
  void launch_kernel(std::function<void()> kernel) override {
    if (sim_ == nullptr) {
      throw DeviceError(fmt::format("stream '{}' of {} is not a sim stream: a CPU kernel runs only on the sim device",
                                    inner_->name(), device_.name()));
    }
    auto rec = recorder_;
    std::string stream = inner_->name();
    sim_->launch_kernel([kernel = std::move(kernel), rec, stream = std::move(stream)] {
      const double begin = rec->now_us();
      kernel();
      rec->add(TraceSlice{stream, "kernel", 0, begin, rec->now_us()});
    });
  }
  void release_after(DeviceMemory memory) override { inner_->release_after(std::move(memory)); }
  void record(Event& event) override { inner_->record(event); }
  void wait(const Event& event) override { inner_->wait(event); }
  void synchronize() override { inner_->synchronize(); }
  void* native_handle() override { return inner_->native_handle(); }

 private:
  // Brackets an operation with two stamps in stream order: on sim two kernels that read the host
  // clock (exact); elsewhere two events, turned into times later (TraceRecorder::add_timed).
  template <typename Enqueue>
  void traced(const char* op, std::size_t bytes, Enqueue enqueue) {
    if (sim_ == nullptr) {
      std::shared_ptr<Event> begin = inner_->device().create_event(), end = inner_->device().create_event();
      inner_->record(*begin);
      enqueue();
      inner_->record(*end);
      recorder_->add_timed(inner_->name(), op, bytes, std::move(begin), std::move(end));
      return;
    }
    auto begin = std::make_shared<double>(0.0);
    auto rec = recorder_;
    sim_->launch_kernel([begin, rec] { *begin = rec->now_us(); });
    enqueue();
    std::string stream = inner_->name();
    sim_->launch_kernel([begin, rec, stream = std::move(stream), op, bytes] {
      rec->add(TraceSlice{stream, op, bytes, *begin, rec->now_us()});
    });
  }

  Device& device_;
  std::unique_ptr<Stream> inner_;
  std::shared_ptr<TraceRecorder> recorder_;
  SimKernelQueue* sim_;  // inner_ as a sim stream, or null
};

class TracedDevice final : public Device {
 public:
  TracedDevice(Device& inner, std::shared_ptr<TraceRecorder> recorder) : inner_(inner), recorder_(std::move(recorder)) {}
  DeviceKind kind() const override { return inner_.kind(); }
  std::string name() const override { return inner_.name(); }
  std::size_t capacity_bytes() const override { return inner_.capacity_bytes(); }
  DeviceMemory allocate(std::size_t bytes, std::string_view tag) override { return inner_.allocate(bytes, tag); }
  MemoryStats memory_stats() const override { return inner_.memory_stats(); }
  void reset_peak_stats() override { inner_.reset_peak_stats(); }
  std::unique_ptr<Stream> create_stream(std::string_view name) override {
    return std::make_unique<TracedStream>(*this, inner_.create_stream(name), recorder_);
  }
  std::unique_ptr<Event> create_event() override { return inner_.create_event(); }
  void pin_host(void* ptr, std::size_t bytes) override { inner_.pin_host(ptr, bytes); }
  void unpin_host(void* ptr) noexcept override { inner_.unpin_host(ptr); }

 private:
  Device& inner_;
  std::shared_ptr<TraceRecorder> recorder_;
};

}  // namespace

std::unique_ptr<Device> make_traced_device(Device& inner, std::shared_ptr<TraceRecorder> recorder) {
  if (inner.kind() != DeviceKind::Sim) {
    // Event times are relative: one event, completed now, ties them to the recorder's clock.
    std::unique_ptr<Stream> stream = inner.create_stream("trace.origin");
    std::shared_ptr<Event> origin = inner.create_event();
    stream->record(*origin);
    origin->synchronize();
    recorder->set_origin(std::move(origin), recorder->now_us());
  }
  return std::make_unique<TracedDevice>(inner, std::move(recorder));
}

}  // namespace strata
