// `strata bench io --tune` (bench/bench_io_tune.h).
#include "bench/bench_io_tune.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/file_io.h"
#include "core/topology.h"
#include "core/units.h"
#include "sim/doctor_measure.h"
#include "plan/machine.h"
#include "plan/run_plan.h"
#include "train/output_file.h"
#include "train/trainer.h"
#include "bench/bench_io_plot.h"

namespace strata::bench::bench_io {
namespace {

std::vector<std::string> split(const std::string& text, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, sep);) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// `noun`: what each value is, for the message ("depth").
unsigned parse_count(const std::string& s, const char* flag, const char* noun, unsigned max, const char* example) {
  unsigned v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 1 || v > max) {
    throw ConfigError(fmt::format("{} {}: each {} must be a whole number 1-{} (e.g. {})", flag, s, noun, max, example));
  }
  return v;
}

struct RwPair {
  unsigned read_qd = 0, write_qd = 0;
};

// What the flags ask for, checked before anything is measured.
struct TuneLists {
  std::vector<std::size_t> sizes;
  std::vector<unsigned> qds, jobs;
  std::vector<RwPair> rw;
};

TuneLists parse_lists(const TuneArgs& t) {
  TuneLists l;
  for (const std::string& s : split(t.request_sizes)) {
    const std::size_t bytes = parse_bytes_or_throw(s, "--tune-request-sizes");
    if (bytes < 4096 || bytes % 4096 != 0 || bytes > (std::size_t{64} << 20)) {
      throw ConfigError(fmt::format("--tune-request-sizes {}: each size must be a multiple of 4 KiB up to 64 MiB "
                                    "(e.g. 256K,1M,4M)",
                                    s));
    }
    l.sizes.push_back(bytes);
  }
  for (const std::string& s : split(t.qds)) l.qds.push_back(parse_count(s, "--tune-qd", "depth", 1024, "4,16,32"));
  for (const std::string& s : split(t.jobs)) l.jobs.push_back(parse_count(s, "--tune-jobs", "number of rings", 64, "1,2,4"));
  if (l.sizes.empty() || l.qds.empty() || l.jobs.empty()) {
    throw ConfigError("--tune: --tune-request-sizes, --tune-qd and --tune-jobs need one value each at least");
  }
  for (auto* list : {&l.qds, &l.jobs}) {
    std::sort(list->begin(), list->end());
    list->erase(std::unique(list->begin(), list->end()), list->end());
  }
  std::sort(l.sizes.begin(), l.sizes.end());
  l.sizes.erase(std::unique(l.sizes.begin(), l.sizes.end()), l.sizes.end());
  if (t.rw_qds == "auto") {
    for (unsigned q : l.qds) {
      if (q >= 2) l.rw.push_back(RwPair{q / 2, q - q / 2});
    }
  } else if (t.rw_qds != "none") {
    for (const std::string& pair : split(t.rw_qds)) {
      const std::vector<std::string> sides = split(pair, '+');
      if (sides.size() != 2) {
        throw ConfigError(fmt::format("--tune-rw-qd {}: give reader+writer depths, e.g. 8+8,16+16 (or auto, or none)", pair));
      }
      l.rw.push_back(RwPair{parse_count(sides[0], "--tune-rw-qd", "depth", 1024, "8+8"),
                            parse_count(sides[1], "--tune-rw-qd", "depth", 1024, "8+8")});
    }
  }
  return l;
}

// The rows' flags and the drives they run on: --dir/--paths, else the config's nvme_path.
struct Target {
  BenchIoArgs a;
  std::vector<std::string> dirs;
};

Target tune_target(const TuneArgs& t, const BenchIoArgs& base) {
  Target target{base, {}};
  BenchIoArgs& a = target.a;
  if (a.dir.empty() && a.paths.empty()) {
    const TrainConfig cfg = train::load_train_config_or_demo(t.config, t.overrides);
    target.dirs = nvme_dirs_of(cfg);
    if (target.dirs.empty()) {
      throw ConfigError(fmt::format("--tune: {} has no nvme_path; give --dir (or --paths) on the drive to tune, or a "
                                    "--config that swaps to NVMe",
                                    cfg.source));
    }
    for (const auto& d : target.dirs) ensure_directory(d, "nvme_path directory");
    for (const auto& d : target.dirs) a.paths += (a.paths.empty() ? "" : ",") + d;
  } else {
    target.dirs = a.paths.empty() ? std::vector<std::string>{a.dir} : split(a.paths);
  }
  if (!t.size_given) a.size = "256M";
  a.vs_fio = false;
  a.plot.clear();  // --plot draws the heat maps of the whole sweep, not each row
  return target;
}

std::string join(const std::vector<unsigned>& values) {
  std::string out;
  for (unsigned v : values) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

void print_json(const nlohmann::json& j) { std::printf("%s\n", j.dump().c_str()); }

// Stage 1: request size x queue depth, reads and writes apart.
TuneGrid sweep_grid(BenchIoArgs a, const TuneLists& l) {
  TuneGrid grid{l.sizes, l.qds, {}, {}};
  grid.read_gbps.assign(l.sizes.size(), std::vector<double>(l.qds.size(), 0));
  grid.write_gbps = grid.read_gbps;
  // Each request at an offset of its own: the swap store's keys lie in extents scattered over the
  // swap file, so a step's requests are not one sequential stream (Note [Drive curves] in plan/machine_curve.h).
  a.rw = "randread,randwrite";
  a.qd = join(l.qds);
  for (std::size_t s = 0; s < l.sizes.size(); ++s) {
    a.bs = a.request_size = a.write_request_size = std::to_string(l.sizes[s]);
    for (const RowReport& row : measure_rows(a)) {
      const std::size_t q = static_cast<std::size_t>(std::find(l.qds.begin(), l.qds.end(), row.row.qd) - l.qds.begin());
      const double gbps = row.runs.front().gbps();
      const bool read = row.row.rw == "randread";
      (read ? grid.read_gbps : grid.write_gbps)[s][q] = gbps;
      if (a.json) {
        print_json(
            {{"tune", read ? "read" : "write"}, {"request_size", l.sizes[s]}, {"qd", row.row.qd}, {"gbps", gbps}});
      }
    }
  }
  if (!a.json) {
    std::printf("%-12s %5s %10s %10s\n", "request", "qd", "read GB/s", "write GB/s");
    for (std::size_t q = 0; q < l.qds.size(); ++q) {
      for (std::size_t s = 0; s < l.sizes.size(); ++s) {
        std::printf("%-12s %5u %10.3f %10.3f\n", format_bytes(l.sizes[s]).c_str(), l.qds[q], grid.read_gbps[s][q],
                    grid.write_gbps[s][q]);
      }
    }
  }
  return grid;
}

// Stage 1's winner: per depth the best read and write size; the depth whose pair moves equal
// bytes read and written in the least time.
struct Pick {
  unsigned qd = 0;
  std::size_t read_size = 0, write_size = 0;
  double read_gbps = 0, write_gbps = 0;
};

Pick pick_sizes(const TuneGrid& g) {
  Pick best;
  double best_seconds = std::numeric_limits<double>::infinity();
  for (std::size_t q = 0; q < g.queue_depths.size(); ++q) {
    Pick p;
    p.qd = g.queue_depths[q];
    for (std::size_t s = 0; s < g.request_bytes.size(); ++s) {
      if (g.read_gbps[s][q] > p.read_gbps) p.read_gbps = g.read_gbps[s][q], p.read_size = g.request_bytes[s];
      if (g.write_gbps[s][q] > p.write_gbps) p.write_gbps = g.write_gbps[s][q], p.write_size = g.request_bytes[s];
    }
    if (p.read_gbps <= 0 || p.write_gbps <= 0) continue;
    const double seconds = 1 / p.read_gbps + 1 / p.write_gbps;
    if (seconds < best_seconds) best_seconds = seconds, best = p;
  }
  if (best.qd == 0) throw Error("--tune: no row moved any bytes; nothing to choose from");
  return best;
}

BenchIoArgs at_pick(BenchIoArgs a, const Pick& p, std::size_t transfer) {
  a.request_size = std::to_string(p.read_size);
  a.write_request_size = std::to_string(p.write_size);
  a.bs = std::to_string(transfer);
  return a;
}

// Stage 2: rings per drive at stage 1's settings; jobs 1 is stage 1's own cell.
void sweep_jobs(const BenchIoArgs& base, const TuneLists& l, const Pick& p) {
  if (!base.json) std::printf("%-6s %10s %10s   (rings per drive at qd %u each)\n", "jobs", "read GB/s", "write GB/s", p.qd);
  double gain = 0;
  unsigned gain_jobs = 1;
  for (unsigned jobs : l.jobs) {
    double read = p.read_gbps, write = p.write_gbps;
    if (jobs != 1) {
      BenchIoArgs a = at_pick(base, p, l.sizes.back());
      a.rw = "read,write";
      a.qd = std::to_string(p.qd);
      a.jobs = jobs;
      for (const RowReport& row : measure_rows(a)) (row.row.rw == "read" ? read : write) = row.runs.front().gbps();
    }
    if (base.json) {
      print_json({{"tune_jobs", jobs}, {"qd", p.qd}, {"read_gbps", read}, {"write_gbps", write}});
    } else {
      std::printf("%-6u %10.3f %10.3f\n", jobs, read, write);
    }
    if (read <= 0 || write <= 0) continue;
    const double ratio = (1 / p.read_gbps + 1 / p.write_gbps) / (1 / read + 1 / write) - 1;
    if (ratio > gain) gain = ratio, gain_jobs = jobs;
  }
  if (!base.json && gain_jobs != 1) {
    std::printf("%u rings per drive move a read and a write %.0f%% faster than one; the engine runs one ring per "
                "drive (no config key changes that), so this is not written\n",
                gain_jobs, 100 * gain);
  }
}

// Stage 3: readers and writers at once; returns the per-drive depth (R+W) whose equal bytes each
// way finished first, or 0 when no pair was swept.
unsigned sweep_concurrent(const BenchIoArgs& base, const TuneLists& l, const Pick& p) {
  if (l.rw.empty()) return 0;
  if (!base.json) std::printf("%-10s %10s %10s %10s\n", "read+write", "read GB/s", "write GB/s", "s/GB each");
  unsigned best_qd = 0;
  double best_seconds = std::numeric_limits<double>::infinity();
  for (const RwPair& pair : l.rw) {
    BenchIoArgs a = at_pick(base, p, l.sizes.back());
    a.rw = "read+write";
    a.qd = std::to_string(pair.read_qd + pair.write_qd);
    a.read_qd = pair.read_qd;
    a.write_qd = pair.write_qd;
    const WorkloadResult run = measure_rows(a).front().runs.front();
    const auto side = [](const OpStats& op, double seconds) {
      return seconds > 0 ? static_cast<double>(op.bytes) / seconds / 1e9 : 0;
    };
    const double read = side(run.read, run.read_seconds), write = side(run.write, run.write_seconds);
    // Readers and writers each cover half of every file: equal bytes each way, done when both are.
    const double seconds_per_gb = run.read.bytes > 0 ? run.seconds / (static_cast<double>(run.read.bytes) / 1e9) : 0;
    if (base.json) {
      print_json({{"tune_rw", fmt::format("{}+{}", pair.read_qd, pair.write_qd)}, {"read_gbps", read},
                  {"write_gbps", write}, {"seconds_per_gb", seconds_per_gb}});
    } else {
      std::printf("%-10s %10.3f %10.3f %10.3f\n", fmt::format("{}+{}", pair.read_qd, pair.write_qd).c_str(), read, write,
                  seconds_per_gb);
    }
    if (seconds_per_gb > 0 && seconds_per_gb < best_seconds) best_seconds = seconds_per_gb, best_qd = pair.read_qd + pair.write_qd;
  }
  return best_qd;
}

// The machine file --machine-file names: read now, so a bad one is refused before the sweep.
std::optional<MachineSpec> existing_machine(const std::string& path) {
  if (path.empty()) return std::nullopt;
  train::check_output_path(path, "--machine-file", train::OutputWrite::Replaced);
  if (!std::filesystem::exists(path)) return std::nullopt;
  return load_machine(path);
}

// Writes stage 1's grid, per drive, as the drive curve of the machine file.
void write_machine_file(const std::string& path, std::optional<MachineSpec> machine, const TuneGrid& grid,
                        const std::vector<std::string>& dirs, bool json) {
  std::string how = "updated";
  if (!machine) {  // a new file: this machine as strata doctor --measure describes it
    Topology topo;
    machine = sim::measure_machine(sim::MeasureOptions{dirs.front(), 0}, topo);
    how = "measured as strata doctor --measure does";
  }
  MachineDrives& d = machine->drives;
  const double drives = static_cast<double>(dirs.size());
  d.curve = DriveCurve{{grid.request_bytes.begin(), grid.request_bytes.end()}, grid.queue_depths, grid.read_gbps,
                       grid.write_gbps};
  for (auto* g : {&d.curve.read_gbps, &d.curve.write_gbps}) {
    for (auto& row : *g) {
      for (double& v : row) v /= drives;
    }
  }
  d.count = static_cast<int>(dirs.size());
  d.paths.clear();
  for (const auto& dir : dirs) d.paths.push_back(std::filesystem::absolute(dir).lexically_normal().string());
  d.read_gbps = d.curve.best_gbps(DriveOp::Read);
  d.write_gbps = d.curve.best_gbps(DriveOp::Write);
  machine->note += fmt::format("{}drives: curve (GB/s of one drive by request size x queue depth, each request "
                               "at a random offset, one ring per drive, {} drive(s) at once) and "
                               "read_gbps/write_gbps (its best points) from strata bench io --tune",
                               machine->note.empty() ? "" : ". ", dirs.size());
  const nlohmann::json j = machine_to_json(*machine);
  (void)parse_machine(j, path);  // what is written must read back as any machine file
  AtomicFileWriter w(path);
  const std::string text = j.dump(2) + "\n";
  w.append(text.data(), text.size());
  w.commit();
  if (!json) std::printf("machine file %s %s, with the drive curve (strata simulate --machine %s)\n", path.c_str(), how.c_str(), path.c_str());
}

}  // namespace

nlohmann::json tuned_fragment(const TuneChoice& c) {
  return {{"aio",
           {{"queue_depth", c.queue_depth},
            {"request_size", c.read_request_bytes},
            {"write_request_size", c.write_request_bytes}}}};
}

int run_tune(const TuneArgs& t, const BenchIoArgs& base) {
  const TuneLists lists = parse_lists(t);
  train::check_output_path(t.out, "--out", train::OutputWrite::Replaced);
  std::optional<MachineSpec> machine = existing_machine(t.machine_file);
  if (!base.plot.empty()) check_plot_output(base.plot);
  const Target target = tune_target(t, base);
  const BenchIoArgs& a = target.a;

  const TuneGrid grid = sweep_grid(a, lists);
  const Pick pick = pick_sizes(grid);
  sweep_jobs(a, lists, pick);
  const unsigned rw_qd = sweep_concurrent(a, lists, pick);
  const unsigned per_drive_qd = rw_qd != 0 ? rw_qd : pick.qd;
  // The engine's depth spans its files, one per drive.
  const TuneChoice choice{per_drive_qd * static_cast<unsigned>(target.dirs.size()), pick.read_size, pick.write_size};
  const nlohmann::json fragment = tuned_fragment(choice);
  if (a.json) {
    print_json({{"tuned", fragment}, {"read_gbps", pick.read_gbps}, {"write_gbps", pick.write_gbps},
                {"depth_from", rw_qd != 0 ? "read+write" : "reads and writes apart"}});
  } else {
    std::printf("best: reads up to %s (%.3f GB/s), writes up to %s (%.3f GB/s) at qd %u; queue depth %u per drive (%s)\n",
                format_bytes(pick.read_size).c_str(), pick.read_gbps, format_bytes(pick.write_size).c_str(),
                pick.write_gbps, pick.qd, per_drive_qd,
                rw_qd != 0 ? "readers and writers at once" : "reads and writes apart");
    std::printf("config fragment: %s\n", fragment.dump().c_str());
  }
  if (!t.out.empty()) {
    AtomicFileWriter w(t.out);
    const std::string text = fragment.dump(2) + "\n";
    w.append(text.data(), text.size());
    w.commit();
    if (!a.json) std::printf("written to %s (strata train --config-fragment %s)\n", t.out.c_str(), t.out.c_str());
  }
  if (!t.machine_file.empty()) write_machine_file(t.machine_file, std::move(machine), grid, target.dirs, a.json);
  if (!base.plot.empty()) {
    draw_heat_maps(base.plot, grid);
    if (!a.json) std::printf("heat maps drawn to %s\n", base.plot.c_str());
  }
  return 0;
}

}  // namespace strata::bench::bench_io
