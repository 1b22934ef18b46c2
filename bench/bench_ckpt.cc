// `strata bench ckpt`: how close a checkpoint of NVMe-resident state comes to the disk's speed.
// It trains a config whose optimizer state lives on NVMe (default: configs/bench-ckpt.json, 25M
// parameters, 291 MiB of fp32 master and moments on NVMe) with a checkpoint after every third
// step, twice: once copying the state after the step (engine/zero_engine_state.cc, Note
// [Checkpoint copy]: every byte read from the swap file and written to the checkpoint), once
// capturing it during the step (engine/state_home_tiered_state.cc, Note [Checkpoint capture] in
// engine/state_home_tiered_state.cc: every byte written once, no read). Right after each checkpoint it measures the
// disk in the checkpoint directory through the same I/O engine on the checkpoint's byte count, one sequential write
// pass and one read pass over written blocks, as `strata bench io` does (checkpoint, disk, checkpoint,
// disk, ...: a virtual disk's speed drifts between runs, docs/MEASUREMENTS.md). The figures,
// medians over the pairs after one warm-up:
//   copy:    checkpoint seconds / (bytes / read bandwidth + bytes / write bandwidth)
//   capture: (checkpoint seconds + how much longer the capturing step took than the steps between
//            checkpoints) / (bytes / write bandwidth)
// Target <= 1.2. A benchmark, never a test.
#include "bench/bench_commands.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "config/config.h"
#include "plan/bench_disk.h"
#include "train/trainer.h"

namespace strata::bench {
namespace {

struct BenchCkptOptions {
  std::string config = "configs/bench-ckpt.json";
  std::vector<std::string> overrides;
  int pairs = 3;
  bool json = false;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Pair {
  double checkpoint = 0;  // seconds the run spent in the checkpoint (begin + save)
  double step_delta = 0;  // the step before it minus the step before that (capture: it wrote the state)
  DiskPassSeconds disk;
};

struct ModeResult {
  std::vector<Pair> pairs;
  std::uint64_t bytes = 0;
};

ModeResult run_mode(const BenchCkptOptions& o, const TrainConfig& cfg, const std::vector<std::string>& overrides,
                    bool capture) {
  ModeResult m;
  // The mode's own checkpoint directory, emptied first (the bench made it).
  const std::string dir = cfg.strata.checkpoint.dir + (capture ? "/bench-capture" : "/bench-copy");
  std::filesystem::remove_all(dir);
  std::vector<std::string> mode_overrides = overrides;
  mode_overrides.push_back("strata.checkpoint.dir=" + dir);
  train::TrainOptions t;
  t.config_path = o.config;
  t.overrides = mode_overrides;
  t.steps = 3 * (o.pairs + 1);
  t.quiet = true;
  t.capture_checkpoints = capture;
  t.on_checkpoint = [&](double seconds, std::uint64_t bytes) {
    m.bytes = bytes;
    Pair p;
    p.checkpoint = seconds;
    p.disk = time_disk_passes(cfg, dir, bytes, bytes);
    m.pairs.push_back(p);
  };
  const train::TrainSummary s = run_training(t);
  // Checkpoint k (0-based) follows step 3k+3 (index 3k+2); the step before it (index 3k+1) wrote
  // none and, like it, does not follow a disk measurement.
  for (std::size_t k = 0; k < m.pairs.size() && 3 * k + 2 < s.step_seconds.size(); ++k) {
    m.pairs[k].step_delta = s.step_seconds[3 * k + 2] - s.step_seconds[3 * k + 1];
  }
  if (m.pairs.size() < 2) throw ConfigError("the run wrote fewer than 2 checkpoints; nothing to measure");
  m.pairs.erase(m.pairs.begin());  // warm-up
  return m;
}

int run_bench_ckpt(const BenchCkptOptions& o) {
  if (o.pairs < 1) throw ConfigError(fmt::format("--pairs {} must be at least 1", o.pairs));
  std::vector<std::string> overrides = o.overrides;
  overrides.push_back("strata.checkpoint.interval_steps=3");
  const TrainConfig cfg = load_train_config(o.config, overrides);
  if (cfg.strata.checkpoint.dir.empty()) {
    throw ConfigError(fmt::format("{} sets no strata.checkpoint.dir; give one with --set strata.checkpoint.dir=DIR",
                                  o.config));
  }
  if (cfg.zero.offload_optimizer.device != OffloadDevice::Nvme) {
    std::fprintf(stderr, "note: %s keeps the optimizer state off NVMe; the figure is for its tier\n", o.config.c_str());
  }
  const ModeResult copy = run_mode(o, cfg, overrides, false);
  const ModeResult capture = run_mode(o, cfg, overrides, true);
  const double gb = static_cast<double>(copy.bytes) / 1e9;
  std::vector<double> copy_ratio, capture_ratio, copy_s, capture_s, capture_delta, read_gbps, write_gbps;
  for (const Pair& p : copy.pairs) {
    copy_s.push_back(p.checkpoint);
    copy_ratio.push_back(p.checkpoint / (p.disk.read + p.disk.write));
    read_gbps.push_back(gb / p.disk.read);
    write_gbps.push_back(gb / p.disk.write);
  }
  for (const Pair& p : capture.pairs) {
    capture_s.push_back(p.checkpoint);
    capture_delta.push_back(p.step_delta);
    capture_ratio.push_back((p.checkpoint + p.step_delta) / p.disk.write);
    read_gbps.push_back(gb / p.disk.read);
    write_gbps.push_back(gb / p.disk.write);
  }
  if (o.json) {
    const nlohmann::json j = {{"config", o.config},
                              {"pairs", o.pairs},
                              {"checkpoint_bytes", copy.bytes},
                              {"disk_read_gbps", median(read_gbps)},
                              {"disk_write_gbps", median(write_gbps)},
                              {"copy_seconds", median(copy_s)},
                              {"copy_ratio", median(copy_ratio)},
                              {"capture_seconds", median(capture_s)},
                              {"capture_step_delta_seconds", median(capture_delta)},
                              {"capture_ratio", median(capture_ratio)}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("config %s: checkpoints of %s (state on %s), %d measured pairs per mode after a warm-up\n",
              o.config.c_str(), format_bytes(copy.bytes).c_str(),
              cfg.zero.offload_optimizer.device == OffloadDevice::Nvme ? "NVMe" : "its tier", o.pairs);
  std::printf("%-8s %5s %10s %12s %11s %11s %8s\n", "mode", "pair", "ckpt s", "step delta s", "read GB/s",
              "write GB/s", "ratio");
  for (std::size_t i = 0; i < copy.pairs.size(); ++i) {
    const Pair& p = copy.pairs[i];
    std::printf("%-8s %5zu %10.3f %12s %11.2f %11.2f %8.2f\n", "copy", i + 1, p.checkpoint, "-", gb / p.disk.read,
                gb / p.disk.write, copy_ratio[i]);
  }
  for (std::size_t i = 0; i < capture.pairs.size(); ++i) {
    const Pair& p = capture.pairs[i];
    std::printf("%-8s %5zu %10.3f %12.3f %11.2f %11.2f %8.2f\n", "capture", i + 1, p.checkpoint, p.step_delta,
                gb / p.disk.read, gb / p.disk.write, capture_ratio[i]);
  }
  std::printf("copy after the step:  %.3f s = %.2f x (bytes / read + bytes / write bandwidth)\n", median(copy_s),
              median(copy_ratio));
  std::printf("captured in the step: %.3f s + %.3f s longer step = %.2f x (bytes / write bandwidth)   (target <= 1.2)\n",
              median(capture_s), median(capture_delta), median(capture_ratio));
  return 0;
}

}  // namespace

void register_bench_ckpt(CLI::App& bench, CommandTable& table) {
  auto o = std::make_shared<BenchCkptOptions>();
  auto* cmd = bench.add_subcommand("ckpt", "checkpoint time of NVMe-resident state against the disk's speed (same run)");
  cmd->add_option("--config", o->config, "training config with strata.checkpoint.dir (default: configs/bench-ckpt.json)")
      ->capture_default_str();
  cmd->add_option("--set", o->overrides, "override a config key (repeatable)");
  cmd->add_option("--pairs", o->pairs, "measured checkpoint / disk pairs per mode (after one warm-up)")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "one JSON object");
  table[cmd] = [o]() -> int { return run_bench_ckpt(*o); };
}

}  // namespace strata::bench
