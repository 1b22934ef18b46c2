// Rows and intervals of `strata bench io` (see bench/bench_io_report.h).
#include "bench/bench_io_report.h"

#include <unistd.h>

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "core/units.h"

namespace strata::bench::bench_io {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The run whose GB/s is the median (the lower middle one of an even count).
template <typename Run, typename Gbps>
const Run& median_by_gbps(const std::vector<Run>& runs, Gbps gbps) {
  std::vector<std::size_t> idx(runs.size());
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return gbps(runs[a]) < gbps(runs[b]); });
  return runs[idx[(idx.size() - 1) / 2]];
}

const WorkloadResult& median_run(const std::vector<WorkloadResult>& runs) {
  return median_by_gbps(runs, [](const WorkloadResult& r) { return r.gbps(); });
}

const FioResult& median_fio(const std::vector<FioResult>& runs) {
  return median_by_gbps(runs, [](const FioResult& r) { return r.gbps; });
}

// Short enough that the live line fits a terminal with both operations on it.
std::string op_text(const char* name, const nlohmann::json& j) {
  return fmt::format("{} {:.3f} GB/s p99 {:.0f} us", name, j.at("gbps").get<double>(), j.at("p99_us").get<double>());
}

// fio's short form of the split: "slat p50 2 p99 6 max 90 us, clat p50 48 p99 95 max 4100 us".
std::string split_text(const nlohmann::json& j) {
  std::string out;
  for (const char* part : {"slat", "clat"}) {
    if (!j.contains(part)) continue;
    const auto& l = j.at(part);
    out += fmt::format("{}{} p50 {:.0f} p99 {:.0f} max {:.0f} us", out.empty() ? "" : ", ", part,
                       l.at("p50_us").get<double>(), l.at("p99_us").get<double>(), l.at("max_us").get<double>());
  }
  return out;
}

}  // namespace

nlohmann::json ops_json(const OpStats& read, const OpStats& write, double seconds, double read_seconds,
                        double write_seconds) {
  OpStats all = read;
  all.merge(write);
  nlohmann::json j = all.json(seconds);
  if (read.ios > 0 && write.ios > 0) {
    j["read"] = read.json(read_seconds > 0 ? read_seconds : seconds);
    j["write"] = write.json(write_seconds > 0 ? write_seconds : seconds);
  }
  return j;
}

void print_table_header(bool vs_fio) {
  fmt::print("{:>16} {:>8} {:>4} {:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}{}\n", "rw", "bs", "qd", "paths", "GB/s",
             "IOPS", "p50_us", "p99_us", "p99.9_us", "max_us", "cpu_s/GB",
             vs_fio ? fmt::format(" {:>9} {:>7}", "fio_GB/s", "ratio") : "");
}

void print_row(const RowReport& r, bool json) {
  const WorkloadResult& m = median_run(r.runs);
  std::vector<double> gbps, ratios, fio_gbps, fio_cpu;
  for (std::size_t i = 0; i < r.runs.size(); ++i) {
    gbps.push_back(r.runs[i].gbps());
    if (i < r.fio.size()) {
      fio_gbps.push_back(r.fio[i].gbps);
      fio_cpu.push_back(r.fio[i].cpu_s_per_gb);
      ratios.push_back(r.fio[i].gbps > 0 ? r.runs[i].gbps() / r.fio[i].gbps : 0);
    }
  }
  nlohmann::json j = ops_json(m.read, m.write, m.seconds, m.read_seconds, m.write_seconds);
  j["gbps"] = median(gbps);
  if (json) {
    j.update(r.extra);
    j["rw"] = r.row.rw;
    j["bs"] = r.row.bs_bytes;
    j["qd"] = r.row.qd;
    j["paths"] = r.paths;
    j["engine"] = r.engine_name;
    j["huge_pages"] = r.huge;
    j["seconds"] = m.seconds;
    j["cpu_s_per_gb"] = m.cpu_s_per_gb();
    if (m.verified_blocks > 0) j["verified_blocks"] = m.verified_blocks;
    if (r.histogram) {
      LatencyHistogram h = m.read.latency;
      h.merge(m.write.latency);
      j["latency_histogram_us"] = h.buckets_json();
    }
    if (!r.fio.empty()) {
      j["fio_gbps"] = median(fio_gbps);
      j["ratio"] = median(ratios);
      j["pairs"] = r.runs.size();
      j["strata_runs_gbps"] = gbps;
      j["fio_runs_gbps"] = fio_gbps;
      j["fio_cpu_s_per_gb"] = median(fio_cpu);
      j["fio_latency"] = median_fio(r.fio).latency;
    }
    fmt::print("{}\n", j.dump());
  } else {
    auto line = [&](const std::string& rw, const nlohmann::json& o, double cpu, const std::string& tail) {
      fmt::print("{:>16} {:>8} {:>4} {:>5} {:>8.3f} {:>9.0f} {:>9.0f} {:>9.0f} {:>9.0f} {:>9.0f} {:>8}{}\n", rw,
                 format_bytes(r.row.bs_bytes), r.row.qd, r.paths, o.at("gbps").get<double>(),
                 o.at("iops").get<double>(), o.at("p50_us").get<double>(), o.at("p99_us").get<double>(),
                 o.at("p99_9_us").get<double>(), o.at("max_us").get<double>(),
                 cpu >= 0 ? fmt::format("{:.3f}", cpu) : "", tail);
    };
    line(r.row.rw, j, m.cpu_s_per_gb(),
         r.fio.empty() ? "" : fmt::format(" {:>9.3f} {:>6.2f}x", median(fio_gbps), median(ratios)));
    for (const char* op : {"read", "write"}) {
      if (j.contains(op)) line(fmt::format("- {}", op), j.at(op), -1, "");
    }
    fmt::print("{:>16} {}\n", "slat/clat", split_text(j));
    if (r.extra.contains("fio_mem")) {
      fmt::print("{:>16} Strata {} on {} pages, fio the same bytes from its --mem={} on {} pages ({}); fio's CPU "
                 "{:.3f} s/GB\n",
                 "buffers", format_bytes(r.extra.at("buffer_bytes").get<std::size_t>()),
                 r.extra.at("buffer_pages").get<std::string>(), r.extra.at("fio_mem").get<std::string>(),
                 r.extra.at("fio_pages").get<std::string>(),
                 r.extra.at("equal_memory").get<bool>() ? "equal memory" : "NOT equal memory: the ratio includes it",
                 median(fio_cpu));
    }
    if (!r.fio.empty()) {
      for (const auto& [op, l] : median_fio(r.fio).latency.items()) {
        const std::string split = split_text(l);
        fmt::print("{:>16} p50 {:.0f} us, p99 {:.0f} us, p99.9 {:.0f} us, max {:.0f} us{}\n", "fio " + op,
                   l.at("p50_us").get<double>(), l.at("p99_us").get<double>(), l.at("p99_9_us").get<double>(),
                   l.at("max_us").get<double>(), split.empty() ? "" : "; " + split);
      }
    }
    if (r.extra.contains("steady")) fmt::print("{:>16} {}\n", "steady state", r.extra.at("steady").dump());
    if (r.extra.contains("verified_at_end")) {
      fmt::print("{:>16} {} blocks checked during the run and {} read back at the end, all good\n", "verify",
                 m.verified_blocks, r.extra.at("verified_at_end").get<std::uint64_t>());
    }
  }
  std::fflush(stdout);
}

IntervalPrinter::IntervalPrinter(bool json, std::FILE* log, nlohmann::json row_keys)
    : json_(json), log_(log), row_keys_(std::move(row_keys)), live_(!json && ::isatty(STDOUT_FILENO) == 1) {}

void IntervalPrinter::print(const IntervalReport& rep) {
  nlohmann::json j = ops_json(rep.read, rep.write, rep.seconds);
  j.update(row_keys_);
  j["interval"] = rep.index;
  j["t_s"] = rep.end_s;
  j["seconds"] = rep.seconds;
  j["ramp"] = rep.ramp;
  if (log_ != nullptr) {
    fmt::print(log_, "{}\n", j.dump());
    std::fflush(log_);
  }
  if (json_) {
    fmt::print("{}\n", j.dump());
  } else {
    std::string text = fmt::format("{:>7.1f}s {:.0f} IOPS {:.3f} GB/s p99 {:.0f} us", rep.end_s, j.at("iops").get<double>(),
                                   j.at("gbps").get<double>(), j.at("p99_us").get<double>());
    for (const char* op : {"read", "write"}) {
      if (j.contains(op)) text += " | " + op_text(op, j.at(op));
    }
    if (rep.ramp) text += " (ramp)";
    // On a terminal the line is redrawn in place; in a log each interval keeps its line.
    if (live_) {
      fmt::print("\r\x1b[K{}", text);
    } else {
      fmt::print("{}\n", text);
    }
    drawn_ = true;
  }
  std::fflush(stdout);
}

void IntervalPrinter::finish() {
  if (live_ && drawn_) fmt::print("\n");
  drawn_ = false;
}

}  // namespace strata::bench::bench_io
