// The checked flags of `strata bench io` (see bench/bench_io_plan.h).
#include "bench/bench_io_plan.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"

namespace strata::bench::bench_io {
namespace {

std::vector<std::string> split_list(const std::string& text, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool parse_on_off(const std::string& text, const char* flag) {
  if (text == "on" || text == "1" || text == "true") return true;
  if (text == "off" || text == "0" || text == "false") return false;
  throw ConfigError(fmt::format("{} '{}': use on or off", flag, text));
}


// --steady-state: "5%" or a fraction such as 0.05.
double parse_bound(const std::string& text) {
  double value = 0;
  const char* last = text.data() + text.size();
  auto [end, ec] = std::from_chars(text.data(), last, value);
  const bool percent = end != last && *end == '%' && end + 1 == last;
  if (ec != std::errc() || (end != last && !percent) || value <= 0 || (percent ? value >= 100 : value >= 1)) {
    throw ConfigError(fmt::format("--steady-state '{}': use a bound such as 5% (or 0.05) of the mean bandwidth", text));
  }
  return percent ? value / 100 : value;
}

bool known_single(const std::string& rw) {
  return rw == "read" || rw == "write" || rw == "randread" || rw == "randwrite" || rw == "randrw";
}

// "A+B": readers (read or randread) and writers (write or randwrite) at once.
bool is_concurrent(const std::string& rw) { return rw.find('+') != std::string::npos; }

void check_rw(const std::string& rw) {
  if (known_single(rw)) return;
  const auto parts = split_list(rw, '+');
  if (parts.size() == 2 && (parts[0] == "read" || parts[0] == "randread") &&
      (parts[1] == "write" || parts[1] == "randwrite") && rw.back() != '+') {
    return;
  }
  throw ConfigError(fmt::format("--rw '{}': use read, write, randread, randwrite, randrw, or readers+writers at once "
                                "as read+write (randread+randwrite, ...); comma-separated",
                                rw));
}

std::vector<Row> parse_matrix(const BenchIoArgs& a, std::uint64_t file_bytes) {
  std::vector<Row> rows;
  for (const auto& rw : split_list(a.rw)) {
    check_rw(rw);
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
      }
    }
  }
  if (rows.empty()) throw ConfigError("strata bench io: the matrix is empty (check --rw, --bs, --qd)");
  return rows;
}

// The I/O engine's options from the flags (the queue depth is set per row).
offload::IoEngineOptions engine_options(const BenchIoArgs& a) {
  offload::IoEngineOptions eo;
  eo.kind = offload::parse_engine_kind(a.engine, "--engine");
  eo.coalesce = parse_on_off(a.coalesce, "--coalesce") ? offload::Coalesce::On : offload::Coalesce::Off;
  eo.fixed_buffers =
      parse_on_off(a.fixed_buffers, "--fixed-buffers") ? offload::FixedBuffers::On : offload::FixedBuffers::Off;
  eo.sqpoll = a.sqpoll ? offload::SqPoll::On : offload::SqPoll::Off;
  eo.iopoll = a.iopoll ? offload::IoPoll::On : offload::IoPoll::Off;
  eo.submit_batch = a.batch;
  // "auto": the engine's defaults (Note [Request size and merging] in offload/uring_engine.cc), as Strata swaps with
  // them.
  eo.max_request_bytes = a.request_size == "auto" ? 0 : parse_bytes_or_throw(a.request_size, "--request-size");
  eo.max_write_request_bytes =
      a.write_request_size == "auto" ? 0 : parse_bytes_or_throw(a.write_request_size, "--write-request-size");
  return eo;
}

// --inject-fault KIND[@BLOCK]; the middle block of the file by default.
void parse_fault(const BenchIoArgs& a, BenchPlan& p) {
  const auto at = a.inject_fault.find('@');
  p.fault_kind = a.inject_fault.substr(0, at);
  if (p.fault_kind != "flip" && p.fault_kind != "stale" && p.fault_kind != "misdirect") {
    throw ConfigError(fmt::format("--inject-fault '{}': use flip, stale or misdirect, optionally @BLOCK", a.inject_fault));
  }
  if (at != std::string::npos) {
    const std::string n = a.inject_fault.substr(at + 1);
    const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), p.fault_block);
    if (ec != std::errc() || end != n.data() + n.size()) {
      throw ConfigError(fmt::format("--inject-fault '{}': the block after @ must be a whole number", a.inject_fault));
    }
  } else {
    p.fault_block = ~std::uint64_t{0};  // the middle block of the row's file, chosen per row
  }
}

// Refuses flags that only mean something with another flag or row kind.
void check_combinations(const BenchIoArgs& a, const BenchPlan& p) {
  auto any_row = [&](auto pred) { return std::any_of(p.rows.begin(), p.rows.end(), pred); };
  const bool timed = p.time.count() > 0;
  if (!timed && !a.ramp.empty()) throw ConfigError("--ramp needs --time (a ramp is the start of a timed run)");
  if (a.mix >= 0 && !any_row([](const Row& r) { return r.rw == "randrw"; })) {
    throw ConfigError("--mix is the read share of --rw randrw; add randrw to --rw or drop --mix");
  }
  if ((a.read_qd > 0 || a.write_qd > 0) && !any_row([](const Row& r) { return is_concurrent(r.rw); })) {
    throw ConfigError("--read-qd/--write-qd are for readers and writers at once; use --rw read+write (or drop them)");
  }
  if (a.precondition && !any_row(row_writes)) {
    throw ConfigError("--precondition prepares the drive for writes; add a write row to --rw or drop --precondition");
  }
  if (a.precondition && p.file_state == FileState::Fallocated) {
    throw ConfigError("--precondition writes the blocks that --file-state fallocated frees again; use one of them");
  }
  if (a.verify && p.file_state == FileState::Fallocated) {
    throw ConfigError("--verify needs written blocks to check; use --file-state written with --verify");
  }
  if (!a.inject_fault.empty() && !a.verify) throw ConfigError("--inject-fault tests --verify; add --verify");
  if (a.vs_fio) {
    if (a.verify) throw ConfigError("--vs-fio compares engines on equal work; run --verify without --vs-fio");
    if (p.steady) throw ConfigError("--vs-fio needs runs of equal length; drop --steady-state (or --vs-fio)");
    if (timed && !a.ramp.empty()) throw ConfigError("--vs-fio does not pass --ramp to fio; drop --ramp (or --vs-fio)");
    if (a.pairs < 3) throw ConfigError("--pairs: at least 3 alternating pairs are needed for a median");
  }
  // Timed groups draw blocks while others are in flight and skip busy ones, so each needs more
  // blocks than requests in flight.
  for (const Row& r : timed ? p.rows : std::vector<Row>{}) {
    for (const Group& whole : row_groups(p, a, r)) {
      const Group g = job_share(whole, 0, p.jobs);  // the smallest share
      if (g.blocks <= g.qd) {
        throw ConfigError(fmt::format("--size: a timed {} row of --bs {} has {} blocks per file{}, not more than its "
                                      "queue depth {}; raise --size or lower the queue depth{}",
                                      r.rw, format_bytes(r.bs_bytes), g.blocks,
                                      is_concurrent(r.rw) ? " half" : "", g.qd, p.jobs > 1 ? " or --jobs" : ""));
      }
    }
  }
  for (const Row& r : p.rows) {
    if (is_concurrent(r.rw) && p.file_bytes / r.bs_bytes < 2) {
      throw ConfigError(fmt::format("--size: the {} row of --bs {} needs two blocks per file; raise --size", r.rw,
                                    format_bytes(r.bs_bytes)));
    }
  }
}

// --jobs, --pin, --iopoll and --device: the values, and what the drive and the rows allow.
void check_scale(const BenchIoArgs& a, BenchPlan& p) {
  if (a.jobs < 1 || a.jobs > 64) throw ConfigError(fmt::format("--jobs {}: use 1..64 workers per path", a.jobs));
  p.jobs = a.jobs;
  p.pin = a.pin;
  if (p.devices && !a.destructive) {
    for (const Row& r : p.rows) {
      if (row_writes(r)) {
        throw ConfigError(fmt::format("--rw {} would overwrite {}: a --device is measured read-only; add "
                                      "--destructive to allow writing over its contents (they are lost)",
                                      r.rw, a.device));
      }
    }
  }
  if (p.devices && (a.precondition || a.verify || p.file_state == FileState::Fallocated) && !a.destructive) {
    throw ConfigError("--precondition, --verify and --file-state fallocated write the --device; add --destructive");
  }
  if (a.iopoll) {
    if (a.engine == "threads") throw ConfigError("--iopoll is an io_uring mode; drop --engine threads");
    for (const std::string& d : p.dirs) {
      if (const std::string why = offload::polled_io_refusal(d); !why.empty()) {
        throw ConfigError(fmt::format("--iopoll: {}; or drop --iopoll", why));
      }
    }
  }
}

}  // namespace

std::chrono::nanoseconds parse_duration(const std::string& text, const char* flag) {
  double value = 0;
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(text.data(), last, value);
  const std::string unit(end, last);
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1;
  else if (unit == "ms") scale = 1e-3;
  else if (unit == "m" || unit == "min") scale = 60;
  else if (unit == "h") scale = 3600;
  if (ec != std::errc() || scale == 0 || value <= 0) {
    throw ConfigError(fmt::format("{} '{}': use a positive time such as 500ms, 30s, 10m or 1h", flag, text));
  }
  return std::chrono::nanoseconds(static_cast<std::int64_t>(value * scale * 1e9));
}

bool row_writes(const Row& row) { return row.rw.find("write") != std::string::npos || row.rw == "randrw"; }

BenchPlan make_plan(const BenchIoArgs& a) {
  BenchPlan p;
  p.dirs = split_list(a.paths);
  if (!a.device.empty()) {
    if (!p.dirs.empty() || !a.dir.empty()) throw ConfigError("--device measures block devices; drop --dir/--paths");
    p.dirs = split_list(a.device);
    p.devices = true;
  }
  if (p.dirs.empty()) {
    if (a.dir.empty()) throw ConfigError("strata bench io: give --dir DIR (or --paths D1,D2, or --device /dev/X)");
    p.dirs.push_back(a.dir);
  }
  if (a.destructive && !p.devices) throw ConfigError("--destructive allows writes to a --device; give --device or drop it");
  const std::uint64_t total_bytes = parse_bytes_or_throw(a.size, "--size");
  p.file_bytes = total_bytes / p.dirs.size() / (4 * MiB) * (4 * MiB);
  if (p.file_bytes == 0) {
    throw ConfigError(fmt::format("--size {}: each path needs at least 4 MiB; raise --size", a.size));
  }
  p.rows = parse_matrix(a, p.file_bytes);
  p.file_state = parse_file_state(a.file_state);
  if (a.huge_pages != "auto") p.huge_always = parse_on_off(a.huge_pages, "--huge-pages (or auto)");
  p.engine_options = engine_options(a);
  if (!a.time.empty()) p.time = parse_duration(a.time, "--time");
  if (!a.ramp.empty()) p.ramp = parse_duration(a.ramp, "--ramp");
  // Timed runs report every second unless told otherwise; one pass only when asked.
  if (!a.interval.empty()) {
    p.interval = parse_duration(a.interval, "--interval");
    if (p.interval < std::chrono::milliseconds(10)) throw ConfigError("--interval: use 10ms or more");
  } else if (p.time.count() > 0) {
    p.interval = std::chrono::seconds(1);
  }
  if (!a.interval_log.empty() && p.interval.count() == 0) {
    throw ConfigError("--interval-log needs intervals: give --time (or --interval)");
  }
  if (!a.steady_state.empty()) {
    if (p.time.count() == 0) throw ConfigError("--steady-state needs --time (the longest the run may take)");
    const double bound = parse_bound(a.steady_state);
    p.steady_window = parse_duration(a.steady_window, "--steady-window");
    const auto window = static_cast<std::size_t>(p.steady_window / p.interval);
    if (window < 3) {
      throw ConfigError(fmt::format("--steady-window {} holds {} intervals of --interval; the test needs at least 3",
                                    a.steady_window, window));
    }
    if (p.steady_window >= p.time) {
      throw ConfigError("--steady-window is as long as --time; the run would end before the test could pass; "
                        "raise --time or lower --steady-window");
    }
    p.steady = SteadySpec{bound, window};
  }
  if (a.mix >= 0) {
    if (a.mix > 100) throw ConfigError(fmt::format("--mix {}: use the read share in percent, 0..100", a.mix));
    p.mix = static_cast<unsigned>(a.mix);
  }
  if (a.read_qd > 1024 || a.write_qd > 1024) throw ConfigError("--read-qd/--write-qd: use 1..1024");
  p.precondition = a.precondition;
  p.verify = a.verify;
  if (!a.inject_fault.empty()) parse_fault(a, p);
  p.seed = a.seed != 0 ? a.seed
                       : static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  check_scale(a, p);
  check_combinations(a, p);
  for (const Row& r : p.rows) {
    WorkloadSpec spec;
    spec.groups = row_groups(p, a, r);
    spec.bs_bytes = r.bs_bytes;
    p.buffer_bytes = std::max(p.buffer_bytes, workload_buffer_bytes(spec, p.dirs.size() * p.jobs));
  }
  p.buffer_bytes = std::max<std::size_t>(p.buffer_bytes, 64 * MiB);
  return p;
}

std::vector<Group> row_groups(const BenchPlan& plan, const BenchIoArgs& a, const Row& row) {
  const std::uint64_t blocks = plan.file_bytes / row.bs_bytes;
  auto pattern = [](const std::string& rw) { return rw.rfind("rand", 0) == 0 ? Pattern::Random : Pattern::Sequential; };
  if (!is_concurrent(row.rw)) {
    unsigned read_percent = row.rw.find("read") != std::string::npos ? 100 : 0;
    if (row.rw == "randrw") read_percent = plan.mix;
    return {Group{read_percent, pattern(row.rw), row.qd, 0, blocks}};
  }
  const auto parts = split_list(row.rw, '+');
  const std::uint64_t half = blocks / 2;
  return {Group{100, pattern(parts[0]), a.read_qd > 0 ? a.read_qd : row.qd, 0, half},
          Group{0, pattern(parts[1]), a.write_qd > 0 ? a.write_qd : row.qd, half, blocks - half}};
}

}  // namespace strata::bench::bench_io
