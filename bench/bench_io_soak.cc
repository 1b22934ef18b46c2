// `strata bench io --soak` (bench/bench_io_soak.h; Note [Bench soak] in bench/bench_io_soak.h there).
#include "bench/bench_io_soak.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/host_buffer.h"
#include "core/units.h"
#include "offload/fault.h"
#include "offload/swap_store.h"

namespace strata::bench::bench_io {
namespace {

using Clock = std::chrono::steady_clock;

// A chunk's tensors and their bytes per parameter (Note [Bench soak] in bench/bench_io_soak.h).
struct TensorKind {
  const char* name;
  std::size_t bytes_per_param;
};
constexpr std::array<TensorKind, 3> kKinds = {{{"state", 12}, {"grad", 4}, {"param", 2}}};
constexpr std::uint64_t kAhead = 2;            // visits read ahead
constexpr std::uint64_t kBehind = 2;           // visits whose writes may be in flight
constexpr std::uint64_t kSets = kAhead + kBehind + 1;  // buffer sets: + the visit being updated

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// --soak-fault KIND:OP:N[,...]
std::vector<offload::FaultRule> parse_faults(const std::string& text) {
  std::vector<offload::FaultRule> rules;
  std::size_t begin = 0;
  while (begin < text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    begin = end + 1;
    const auto bad = [&] {
      return ConfigError(fmt::format("--soak-fault '{}': use KIND:OP:N, KIND one of eio, enospc, eagain, eintr, "
                                     "short, corrupt, OP read, write or any, N the 1-based operation (e.g. corrupt:read:20)",
                                     item));
    };
    const std::size_t c1 = item.find(':');
    const std::size_t c2 = c1 == std::string::npos ? c1 : item.find(':', c1 + 1);
    if (c2 == std::string::npos) throw bad();
    const std::string kind = item.substr(0, c1), op = item.substr(c1 + 1, c2 - c1 - 1), n = item.substr(c2 + 1);
    offload::FaultRule rule;
    const std::pair<const char*, offload::FaultKind> kinds[] = {
        {"eio", offload::FaultKind::Eio},       {"enospc", offload::FaultKind::Enospc},
        {"eagain", offload::FaultKind::Eagain}, {"eintr", offload::FaultKind::Eintr},
        {"short", offload::FaultKind::ShortTransfer}, {"corrupt", offload::FaultKind::Corrupt}};
    const auto k = std::find_if(std::begin(kinds), std::end(kinds), [&](const auto& p) { return kind == p.first; });
    if (k == std::end(kinds)) throw bad();
    rule.kind = k->second;
    if (op == "read") rule.op = offload::IoOp::Read;
    else if (op == "write") rule.op = offload::IoOp::Write;
    else if (op != "any") throw bad();
    const auto [ptr, ec] = std::from_chars(n.data(), n.data() + n.size(), rule.nth);
    if (ec != std::errc() || ptr != n.data() + n.size() || rule.nth == 0) throw bad();
    rules.push_back(rule);
  }
  return rules;
}

// The contents of one tensor generation: 64-bit words base + i * kStep, base from the seed, the
// chunk, the kind and the generation, so another tensor's or generation's bytes never match.
constexpr std::uint64_t kStep = 0x9E3779B97F4A7C15ull;
std::uint64_t pattern_base(std::uint64_t seed, std::uint64_t chunk, std::size_t kind, std::uint64_t generation) {
  std::uint64_t x = seed ^ (chunk << 20) ^ (static_cast<std::uint64_t>(kind) << 16) ^ (generation << 36);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void fill_pattern(std::byte* data, std::size_t bytes, std::uint64_t base) {
  auto* words = reinterpret_cast<std::uint64_t*>(data);
  const std::size_t n = bytes / 8;
  for (std::size_t i = 0; i < n; ++i) words[i] = base + i * kStep;
  for (std::size_t b = n * 8; b < bytes; ++b) data[b] = std::byte{0x5A};
}

// The first byte offset whose word differs from the pattern; bytes when none does.
std::size_t first_mismatch(const std::byte* data, std::size_t bytes, std::uint64_t base) {
  const auto* words = reinterpret_cast<const std::uint64_t*>(data);
  const std::size_t n = bytes / 8;
  for (std::size_t i = 0; i < n; ++i) {
    if (words[i] != base + i * kStep) return i * 8;
  }
  for (std::size_t b = n * 8; b < bytes; ++b) {
    if (data[b] != std::byte{0x5A}) return b;
  }
  return bytes;
}

struct SoakPlan {
  std::vector<std::string> dirs;
  std::chrono::nanoseconds duration{0};
  std::chrono::nanoseconds interval{0};
  std::vector<std::size_t> chunk_params;  // parameters per chunk
  std::uint64_t capacity_bytes = 0;
  std::size_t set_bytes = 0;  // one visit's three tensors, padded
  offload::IoEngineOptions engine;
  std::vector<offload::FaultRule> faults;
  std::uint64_t seed = 0;
  bool json = false;
  std::string interval_log;
};

std::size_t padded_chunk_bytes(std::size_t params) {
  std::size_t bytes = 0;
  for (const TensorKind& k : kKinds) bytes += offload::SwapStore::padded(params * k.bytes_per_param);
  return bytes;
}

SoakPlan make_soak_plan(const SoakArgs& s, const BenchIoArgs& a) {
  BenchIoArgs checked = a;
  const BenchPlan p = make_plan(checked);  // the drives, engine, interval and seed, checked as for rows
  if (p.devices) throw ConfigError("--soak runs through swap files; give --dir or --paths instead of --device");
  SoakPlan plan;
  for (const std::string& d : p.dirs) plan.dirs.push_back(offload::check_directory(d, "--dir"));
  plan.duration = parse_duration(s.duration, "--soak");
  plan.interval = p.interval.count() > 0 ? p.interval : std::chrono::seconds(1);
  plan.engine = p.engine_options;
  plan.engine.queue_depth = p.rows.front().qd;
  plan.seed = p.seed;
  plan.json = a.json;
  plan.interval_log = a.interval_log;
  plan.faults = s.faults.empty() ? std::vector<offload::FaultRule>{} : parse_faults(s.faults);
  const std::size_t chunk_bytes = parse_bytes_or_throw(s.chunk, "--soak-chunk");
  const std::size_t params = chunk_bytes / kKinds[0].bytes_per_param / 1024 * 1024;
  if (params == 0) throw ConfigError(fmt::format("--soak-chunk {}: use 12K or more (12 bytes a parameter)", s.chunk));
  plan.capacity_bytes = parse_bytes_or_throw(a.size, "--size");
  // Every fourth chunk is a group's tail: shorter and not a multiple of 4 KiB.
  const auto chunk_params = [&](std::size_t i) { return i % 4 == 3 ? params * 5 / 8 + 13 : params; };
  std::uint64_t used = 0;
  while (used + padded_chunk_bytes(chunk_params(plan.chunk_params.size())) <= plan.capacity_bytes) {
    used += padded_chunk_bytes(chunk_params(plan.chunk_params.size()));
    plan.chunk_params.push_back(chunk_params(plan.chunk_params.size()));
  }
  if (plan.chunk_params.size() < kSets) {
    throw ConfigError(fmt::format("--size {} holds {} chunks of --soak-chunk {} ({} each with gradients and "
                                  "weights); the soak needs {} ({} read ahead, {} written behind, 1 updated): raise "
                                  "--size or lower --soak-chunk",
                                  a.size, plan.chunk_params.size(), s.chunk, format_bytes(padded_chunk_bytes(params)),
                                  kSets, kAhead, kBehind));
  }
  plan.set_bytes = padded_chunk_bytes(params);
  return plan;
}

// One visit's buffers and what is in flight in them.
struct VisitSet {
  std::byte* base = nullptr;
  std::uint64_t visit = 0;
  std::array<std::uint64_t, kKinds.size()> offsets{};  // of each tensor in the set
  std::vector<offload::IoHandle> reads;
  std::vector<std::pair<std::string, offload::IoHandle>> writes;
};

class Soak {
 public:
  explicit Soak(const SoakPlan& plan)
      : plan_(plan), faults_(plan.faults), generation_(plan.chunk_params.size(), 0) {
    offload::IoEngineOptions eo = plan.engine;
    if (!plan.faults.empty()) eo.faults = &faults_;
    engine_ = offload::make_io_engine(eo);
    offload::SwapStoreOptions so;
    so.dirs = plan.dirs;
    so.capacity_bytes = plan.capacity_bytes;
    so.file_name = "strata-soak-swap.bin";
    store_ = std::make_unique<offload::SwapStore>(*engine_, so);
    HostBufferOptions ho;
    ho.alignment_bytes = 2 * MiB;
    ho.huge_pages = HugePages::Transparent;
    memory_ = HostBuffer::allocate(plan.set_bytes * kSets, ho);
    std::memset(memory_.data(), 0, memory_.size_bytes());
    const std::span<std::byte> all[] = {memory_.as<std::byte>()};
    engine_->register_buffers(all);
    for (std::uint64_t i = 0; i < kSets; ++i) sets_[i].base = memory_.as<std::byte>().data() + i * plan.set_bytes;
    if (plan.interval_log.empty()) return;
    log_.reset(std::fopen(plan.interval_log.c_str(), "w"));
    if (!log_) {
      throw ConfigError(fmt::format("--interval-log {}: cannot create it ({}); choose a writable path",
                                    plan.interval_log, errno_text(errno)));
    }
  }

  nlohmann::json run() {
    const auto f0 = Clock::now();
    t0_ = f0;  // a failure in the fill says how long it ran
    for (std::uint64_t c = 0; c < chunks(); ++c) {  // what a step starts from: generation 1 of everything
      write_visit(sets_[c % kSets], c);
      if (c + 1 >= kBehind + 1) wait_writes(sets_[(c + 1 - kBehind - 1) % kSets]);
    }
    for (VisitSet& s : sets_) wait_writes(s);
    const double fill_s = seconds_between(f0, Clock::now());
    reset_counters();
    t0_ = Clock::now();
    const auto end = t0_ + plan_.duration;
    last_tick_ = t0_;
    std::uint64_t issued = 0;  // visits whose reads are issued
    std::uint64_t v = 0;
    for (; issued < kAhead; ++issued) issue_reads(issued);
    for (;; ++v) {
      if (v == issued) break;  // time ran out: every issued visit is done
      if (Clock::now() < end) issue_reads(issued++);
      finish_visit(v);
      if (Clock::now() >= next_tick()) report_interval(Clock::now());
    }
    for (VisitSet& s : sets_) wait_writes(s);
    const auto t1 = Clock::now();
    // The drain after the last tick is an interval of its own when it is a fair sample (half an
    // interval or more, or the only one), else it only counts in the totals.
    const double tail_s = seconds_between(last_tick_, t1);
    if ((interval_ == 0 || tail_s >= std::chrono::duration<double>(plan_.interval).count() / 2) &&
        (read_bytes_ > tick_read_ || write_bytes_ > tick_write_)) {
      report_interval(t1);
    }
    return summary(seconds_between(t0_, t1), fill_s, v);
  }

 private:
  std::uint64_t chunks() const { return plan_.chunk_params.size(); }
  std::string key(std::uint64_t chunk, std::size_t kind) const { return fmt::format("chunk{}.{}", chunk, kKinds[kind].name); }
  std::size_t tensor_bytes(std::uint64_t chunk, std::size_t kind) const {
    return plan_.chunk_params[chunk] * kKinds[kind].bytes_per_param;
  }
  std::byte* tensor_data(VisitSet& s, std::size_t kind) { return s.base + s.offsets[kind]; }

  void layout(VisitSet& s, std::uint64_t chunk) {
    std::uint64_t off = 0;
    for (std::size_t k = 0; k < kKinds.size(); ++k) {
      s.offsets[k] = off;
      off += offload::SwapStore::padded(tensor_bytes(chunk, k));
    }
  }

  // Reads visit v's tensors into its set, once the set's last writes and the chunk's are done.
  void issue_reads(std::uint64_t v) {
    VisitSet& s = sets_[v % kSets];
    wait_writes(s);
    const std::uint64_t chunk = v % chunks();
    s.visit = v;
    s.reads.clear();
    layout(s, chunk);
    for (std::size_t k = 0; k < kKinds.size(); ++k) {
      const std::string name = key(chunk, k);
      const std::size_t extents = store_->extents(name).size();
      const std::size_t padded = offload::SwapStore::padded(tensor_bytes(chunk, k));
      s.reads.push_back(store_->read(name, {tensor_data(s, k), padded}, [this, extents, padded](std::exception_ptr& e) {
        if (e) return;
        verified_extents_ += extents;
        read_bytes_ += padded;
      }));
    }
  }

  // Waits for visit v's reads, checks them, writes the next generation behind.
  void finish_visit(std::uint64_t v) {
    VisitSet& s = sets_[v % kSets];
    const std::uint64_t chunk = v % chunks();
    for (std::size_t k = 0; k < kKinds.size(); ++k) {
      const std::string name = key(chunk, k);
      if (auto err = s.reads[k].wait_error()) fail_read(name, err);
      const std::size_t bytes = tensor_bytes(chunk, k);
      const std::uint64_t base = pattern_base(plan_.seed, chunk, k, generation_[chunk]);
      if (const std::size_t at = first_mismatch(tensor_data(s, k), bytes, base); at != bytes) mismatch(name, at);
      ++verified_tensors_;
    }
    write_visit(s, chunk);
  }

  // The update: the chunk's next generation of all three tensors, written behind.
  void write_visit(VisitSet& s, std::uint64_t chunk) {
    ++generation_[chunk];
    layout(s, chunk);
    s.writes.clear();
    for (std::size_t k = 0; k < kKinds.size(); ++k) {
      const std::size_t bytes = tensor_bytes(chunk, k);
      std::byte* data = tensor_data(s, k);
      fill_pattern(data, bytes, pattern_base(plan_.seed, chunk, k, generation_[chunk]));
      const std::size_t padded = offload::SwapStore::padded(bytes);
      s.writes.emplace_back(key(chunk, k), store_->write(key(chunk, k), {data, padded}, bytes,
                                                          [this, padded](std::exception_ptr& e) {
                                                            if (!e) write_bytes_ += padded;
                                                          }));
    }
  }

  void wait_writes(VisitSet& s) {
    for (auto& [name, handle] : s.writes) {
      if (auto err = handle.wait_error()) {
        fail(fmt::format("writing tensor '{}' failed: {}", name, what(err)));
      }
    }
    s.writes.clear();
  }

  // An I/O error names the extent it hit; a checksum failure names it already (the swap store's).
  [[noreturn]] void fail_read(const std::string& name, const std::exception_ptr& err) {
    try {
      std::rethrow_exception(err);
    } catch (const offload::IoRequestError& e) {
      const auto extents = store_->extents(name);
      for (std::size_t i = 0; i < extents.size(); ++i) {
        const offload::SwapExtent& x = extents[i];
        if (store_->file_path(x.file) == e.path() && e.offset_bytes() >= x.file_offset_bytes &&
            e.offset_bytes() < x.file_offset_bytes + x.length_bytes) {
          fail(fmt::format("reading tensor '{}' failed in extent {} of {} ({} at offset {} of {}): {}", name, i + 1,
                           extents.size(), format_bytes(x.length_bytes), x.file_offset_bytes,
                           store_->file_path(x.file), e.what()));
        }
      }
      fail(fmt::format("reading tensor '{}' failed: {}", name, e.what()));
    } catch (const std::exception& e) {
      fail(fmt::format("reading tensor '{}': {}", name, e.what()));
    }
  }

  [[noreturn]] void mismatch(const std::string& name, std::size_t at) {
    const auto extents = store_->extents(name);
    for (std::size_t i = 0; i < extents.size(); ++i) {
      const offload::SwapExtent& x = extents[i];
      if (at < x.key_offset_bytes || at >= x.key_offset_bytes + x.length_bytes) continue;
      fail(fmt::format("tensor '{}' read back other bytes than written at byte {} of it, in extent {} of {} (offset "
                       "{} of {}), though its checksum matched: the swap store returned another tensor's or an older "
                       "generation's data",
                       name, at, i + 1, extents.size(), x.file_offset_bytes + (at - x.key_offset_bytes),
                       store_->file_path(x.file)));
    }
    fail(fmt::format("tensor '{}' read back other bytes than written at byte {} of it", name, at));
  }

  // Ends the run: every request still in flight finishes first (its buffers and the store go next).
  [[noreturn]] void fail(const std::string& message) {
    for (VisitSet& s : sets_) {
      for (const auto& h : s.reads) h.wait_error();
      for (const auto& w : s.writes) w.second.wait_error();
    }
    throw Error(fmt::format("soak failed after {:.1f} s ({} extents verified before): {}",
                            seconds_between(t0_, Clock::now()), verified_extents_.load(), message));
  }

  static std::string what(const std::exception_ptr& err) {
    try {
      std::rethrow_exception(err);
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  Clock::time_point next_tick() const { return last_tick_ + plan_.interval; }

  void reset_counters() {
    read_bytes_ = write_bytes_ = verified_extents_ = 0;
    tick_read_ = tick_write_ = tick_extents_ = 0;
    verified_tensors_ = 0;
  }

  void report_interval(Clock::time_point now) {
    const double s = seconds_between(last_tick_, now);
    const std::uint64_t r = read_bytes_, w = write_bytes_, x = verified_extents_;
    nlohmann::json j = {{"soak_interval", interval_++},
                        {"t_s", seconds_between(t0_, now)},
                        {"seconds", s},
                        {"read_gbps", static_cast<double>(r - tick_read_) / s / 1e9},
                        {"write_gbps", static_cast<double>(w - tick_write_) / s / 1e9},
                        {"verified_extents", x - tick_extents_},
                        {"verified_extents_total", x}};
    tick_read_ = r;
    tick_write_ = w;
    tick_extents_ = x;
    last_tick_ = now;
    if (log_) fmt::print(log_.get(), "{}\n", j.dump());
    if (plan_.json) {
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("{:>7.1f}s read {:.3f} GB/s write {:.3f} GB/s, {} extents verified ({} in all)\n",
                 j["t_s"].get<double>(), j["read_gbps"].get<double>(), j["write_gbps"].get<double>(),
                 j["verified_extents"].get<std::uint64_t>(), x);
    }
    std::fflush(stdout);
  }

  nlohmann::json summary(double seconds, double fill_s, std::uint64_t visits) const {
    return {{"soak_s", seconds},
            {"fill_s", fill_s},
            {"chunks", chunks()},
            {"tensors", chunks() * kKinds.size()},
            {"steps", static_cast<double>(visits) / static_cast<double>(chunks())},
            {"read_bytes", read_bytes_.load()},
            {"write_bytes", write_bytes_.load()},
            {"read_gbps", static_cast<double>(read_bytes_) / seconds / 1e9},
            {"write_gbps", static_cast<double>(write_bytes_) / seconds / 1e9},
            {"verified_tensors", verified_tensors_},
            {"verified_extents", verified_extents_.load()},
            {"faults_injected", faults_.injected()},
            {"swap_files", plan_.dirs.size()},
            {"engine", engine_->info().name}};
  }

  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };

  const SoakPlan& plan_;
  offload::FaultInjector faults_;
  std::unique_ptr<offload::IoEngine> engine_;
  std::unique_ptr<offload::SwapStore> store_;
  HostBuffer memory_;
  std::array<VisitSet, kSets> sets_;
  std::vector<std::uint64_t> generation_;  // per chunk: the last generation written
  std::unique_ptr<std::FILE, FileCloser> log_;
  Clock::time_point t0_, last_tick_;
  std::atomic<std::uint64_t> read_bytes_{0}, write_bytes_{0}, verified_extents_{0};
  std::uint64_t tick_read_ = 0, tick_write_ = 0, tick_extents_ = 0, verified_tensors_ = 0;
  int interval_ = 0;
};

}  // namespace

int run_soak(const SoakArgs& soak, const BenchIoArgs& a) {
  const SoakPlan plan = make_soak_plan(soak, a);
  spdlog::info("soak: {} chunks ({} tensors) in {} of swap on {} drive(s) for {:.0f} s{}", plan.chunk_params.size(),
               plan.chunk_params.size() * kKinds.size(), format_bytes(plan.capacity_bytes), plan.dirs.size(),
               std::chrono::duration<double>(plan.duration).count(),
               plan.faults.empty() ? "" : fmt::format(", {} fault rule(s)", plan.faults.size()));
  Soak run(plan);
  const nlohmann::json j = run.run();
  if (a.json) {
    fmt::print("{}\n", j.dump());
    return 0;
  }
  const auto faults = j["faults_injected"].get<std::uint64_t>();
  fmt::print("soak: {:.1f} s, {} chunks ({} tensors), {:.1f} steps: read {} at {:.3f} GB/s and wrote {} at {:.3f} "
             "GB/s at once; {} tensors and {} extents read back and verified, no mismatch{}\n",
             j["soak_s"].get<double>(), j["chunks"].get<std::uint64_t>(), j["tensors"].get<std::uint64_t>(),
             j["steps"].get<double>(), format_bytes(j["read_bytes"].get<std::uint64_t>()), j["read_gbps"].get<double>(),
             format_bytes(j["write_bytes"].get<std::uint64_t>()), j["write_gbps"].get<double>(),
             j["verified_tensors"].get<std::uint64_t>(), j["verified_extents"].get<std::uint64_t>(),
             faults > 0 ? fmt::format("; {} injected fault(s) recovered by the engine's retries", faults) : "");
  return 0;
}

}  // namespace strata::bench::bench_io
