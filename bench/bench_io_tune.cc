// `strata bench io --tune` (bench/bench_io_tune.h).
#include "bench/bench_io_tune.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "core/units.h"
#include "plan/run_plan.h"
#include "train/output_file.h"
#include "train/trainer.h"

namespace strata::bench::bench_io {
namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct Cell {
  double read_gbps = 0, write_gbps = 0;
};

}  // namespace

int run_tune(const TuneArgs& t, const BenchIoArgs& base) {
  std::vector<std::size_t> sizes;
  for (const std::string& s : split(t.request_sizes)) {
    const std::size_t bytes = parse_bytes_or_throw(s, "--tune-request-sizes");
    if (bytes < 4096 || bytes % 4096 != 0 || bytes > (std::size_t{64} << 20)) {
      throw ConfigError(fmt::format("--tune-request-sizes {}: each size must be a multiple of 4 KiB up to 64 MiB "
                                    "(e.g. 256K,1M,4M)",
                                    s));
    }
    sizes.push_back(bytes);
  }
  std::vector<unsigned> qds;
  for (const std::string& s : split(t.qds)) {
    unsigned q = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), q);
    if (ec != std::errc() || end != s.data() + s.size() || q < 1 || q > 1024) {
      throw ConfigError(fmt::format("--tune-qd {}: each depth must be a whole number 1-1024 (e.g. 4,16,32)", s));
    }
    qds.push_back(q);
  }
  if (sizes.empty() || qds.empty()) throw ConfigError("--tune: --tune-request-sizes and --tune-qd need one value each at least");
  train::check_output_path(t.out, "--out", train::OutputWrite::Replaced);

  BenchIoArgs a = base;
  std::size_t dirs = 1;
  if (a.dir.empty() && a.paths.empty()) {  // the drive(s) the config swaps to
    const TrainConfig cfg = train::load_train_config_or_demo(t.config, t.overrides);
    const std::vector<std::string> nvme = nvme_dirs_of(cfg);
    if (nvme.empty()) {
      throw ConfigError(fmt::format("--tune: {} has no nvme_path; give --dir (or --paths) on the drive to tune, or a "
                                    "--config that swaps to NVMe",
                                    cfg.source));
    }
    for (const auto& d : nvme) ensure_directory(d, "nvme_path directory");
    std::string joined;
    for (const auto& d : nvme) joined += (joined.empty() ? "" : ",") + d;
    a.paths = joined;
    dirs = nvme.size();
  } else if (!a.paths.empty()) {
    dirs = split(a.paths).size();
  }
  if (!t.size_given) a.size = "256M";
  const std::size_t transfer = *std::max_element(sizes.begin(), sizes.end());
  a.rw = "read,write";
  a.bs = std::to_string(transfer);  // the transfer the engine splits into requests of each size
  std::string qd_list;
  for (unsigned q : qds) qd_list += (qd_list.empty() ? "" : ",") + std::to_string(q);
  a.qd = qd_list;
  a.vs_fio = false;

  std::map<std::pair<std::size_t, unsigned>, Cell> cells;
  for (std::size_t r : sizes) {
    a.request_size = a.write_request_size = std::to_string(r);
    for (const RowReport& row : measure_rows(a)) {
      const WorkloadResult& run = row.runs.front();
      Cell& c = cells[{r, row.row.qd}];
      (row.row.rw == "read" ? c.read_gbps : c.write_gbps) = run.gbps();
      if (a.json) {
        std::printf("%s\n", nlohmann::json{{"tune", row.row.rw}, {"request_size", r}, {"qd", row.row.qd},
                                           {"gbps", run.gbps()}}.dump().c_str());
      }
    }
  }
  // Per queue depth: the best read size and the best write size; the depth whose pair moves equal
  // bytes read and written in the least time wins.
  struct Pick {
    unsigned qd = 0;
    std::size_t read_size = 0, write_size = 0;
    double read_gbps = 0, write_gbps = 0;
    double seconds_per_gb = std::numeric_limits<double>::infinity();
  } best;
  if (!a.json) std::printf("%-12s %5s %10s %10s\n", "request", "qd", "read GB/s", "write GB/s");
  for (unsigned q : qds) {
    Pick p;
    p.qd = q;
    for (std::size_t r : sizes) {
      const Cell& c = cells[{r, q}];
      if (!a.json) std::printf("%-12s %5u %10.3f %10.3f\n", format_bytes(r).c_str(), q, c.read_gbps, c.write_gbps);
      if (c.read_gbps > p.read_gbps) p.read_gbps = c.read_gbps, p.read_size = r;
      if (c.write_gbps > p.write_gbps) p.write_gbps = c.write_gbps, p.write_size = r;
    }
    if (p.read_gbps > 0 && p.write_gbps > 0) p.seconds_per_gb = 1 / p.read_gbps + 1 / p.write_gbps;
    if (p.seconds_per_gb < best.seconds_per_gb) best = p;
  }
  if (best.qd == 0) throw Error("--tune: no row moved any bytes; nothing to choose from");
  const unsigned queue_depth = best.qd * static_cast<unsigned>(dirs);  // the engine's depth spans its files
  const nlohmann::json fragment = {{"aio",
                                    {{"queue_depth", queue_depth},
                                     {"request_size", best.read_size},
                                     {"write_request_size", best.write_size}}}};
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"tuned", fragment}, {"read_gbps", best.read_gbps}, {"write_gbps", best.write_gbps}}
                            .dump()
                            .c_str());
  } else {
    std::printf("best: queue depth %u, reads up to %s (%.3f GB/s), writes up to %s (%.3f GB/s)\n", best.qd,
                format_bytes(best.read_size).c_str(), best.read_gbps, format_bytes(best.write_size).c_str(),
                best.write_gbps);
    std::printf("config fragment: %s\n", fragment.dump().c_str());
  }
  if (!t.out.empty()) {
    AtomicFileWriter w(t.out);
    const std::string text = fragment.dump(2) + "\n";
    w.append(text.data(), text.size());
    w.commit();
    if (!a.json) std::printf("written to %s (strata train --config-fragment %s)\n", t.out.c_str(), t.out.c_str());
  }
  return 0;
}

}  // namespace strata::bench::bench_io
