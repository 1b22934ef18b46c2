// `strata bench io`'s command line: the flags of the rows (bench/bench_io.cc) and of the modes --soak, --replay and
// --tune, and the one mode a run takes, each mode's options refused without it.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench/bench_commands.h"
#include "bench/bench_io_plan.h"
#include "bench/bench_io_replay.h"
#include "bench/bench_io_soak.h"
#include "bench/bench_io_tune.h"
#include "core/error.h"

namespace strata::bench {
namespace bench_io {
namespace {

// The options that choose a mode (--soak, --replay, --tune) and those that belong to one.
struct IoModes {
  CLI::Option* soak = nullptr;
  CLI::Option* soak_chunk = nullptr;
  CLI::Option* soak_fault = nullptr;
  CLI::Option* replay = nullptr;
  CLI::Option* set = nullptr;
  CLI::Option* machine = nullptr;
  CLI::Option* steps = nullptr;
  CLI::Option* tbw = nullptr;
  CLI::Option* tune = nullptr;
  CLI::Option* out = nullptr;
  CLI::Option* config = nullptr;
  CLI::Option* sizes = nullptr;
  CLI::Option* qds = nullptr;
  CLI::Option* jobs = nullptr;
  CLI::Option* rw = nullptr;
  CLI::Option* machine_file = nullptr;
  CLI::Option* size = nullptr;
  CLI::App* cmd = nullptr;  // every option, for what a mode does not read
};

// What `strata bench io` parsed into, shared by the flags and the command.
struct IoCommand {
  BenchIoArgs args;
  ReplayArgs replay;
  TuneArgs tune;
  SoakArgs soak;
  IoModes modes;
};

// The rows: drive, request shape, engine settings, fio's side, scale.
void add_run_flags(CLI::App* cmd, BenchIoArgs& a) {
  cmd->add_option("--dir", a.dir, "directory for the test file (on the drive to measure)");
  cmd->add_option("--paths", a.paths, "comma-separated directories, one test file and stream each (one per drive)");
  cmd->add_option("--size", a.size, "bytes per run (with --time: the working set), split over the paths (e.g. 1G, 4G)")->capture_default_str();
  cmd->add_option("--bs", a.bs, "block size per request; a comma list makes a matrix (4K,64K,1M)")->capture_default_str();
  cmd->add_option("--qd", a.qd, "requests in flight per path; comma list (1,8,32)")->capture_default_str();
  cmd->add_option("--rw", a.rw, "read, write, randread, randwrite, randrw, read+write (readers and writers at once); comma list")->capture_default_str();
  cmd->add_flag("--vs-fio", a.vs_fio, "alternate with fio on the same file and print the median ratio");
  cmd->add_option("--pairs", a.pairs, "Strata/fio pairs per row with --vs-fio (>= 3)")->capture_default_str();
  cmd->add_flag("--json", a.json, "one JSON object per row");
  cmd->add_option("--engine", a.engine, "auto, uring or threads")->capture_default_str();
  cmd->add_option("--request-size", a.request_size,
                  fmt::format("largest kernel read (auto: the engine default, {})",
                              format_bytes(offload::kDefaultMaxReadRequestBytes)))
      ->capture_default_str();
  cmd->add_option("--write-request-size", a.write_request_size,
                  fmt::format("largest kernel write (auto: the engine default, {} or --request-size if smaller)",
                              format_bytes(offload::kDefaultMaxWriteRequestBytes)))
      ->capture_default_str();
  cmd->add_option("--coalesce", a.coalesce, "merge adjacent requests into one kernel request (on|off)")
      ->capture_default_str();
  cmd->add_option("--huge-pages", a.huge_pages,
                  "back the I/O buffers with 2 MiB huge pages (on|off|auto: on except for random writes of blocks "
                  "<= 16 KiB)")
      ->capture_default_str();
  cmd->add_option("--fixed-buffers", a.fixed_buffers, "register the buffers with io_uring (on|off)")
      ->capture_default_str();
  cmd->add_option("--batch", a.batch, "most requests per io_uring_enter (0: the queue depth)")->capture_default_str();
  cmd->add_option("--file-state", a.file_state,
                  "blocks under the test file at each timed write run, for Strata and fio alike: written (filled once "
                  "before the first row) or fallocated (fresh preallocated blocks before every write run)")
      ->capture_default_str();
  cmd->add_flag("--sqpoll", a.sqpoll, "use a kernel submission-polling thread");
  cmd->add_option("--fio-option", a.fio_options,
                  "extra option for every fio job with --vs-fio, e.g. --fio-option=--mem=shmhuge (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--jobs", a.jobs, "workers per path, each with its own io_uring ring and thread and --qd "
                                       "requests in flight, on its own slice of the file (as fio's numjobs)")
      ->capture_default_str();
  cmd->add_flag("--pin", a.pin, "pin each job's engine thread to its own core, cores near the drive's NUMA node "
                                    "first (hwloc); the placement is logged and in the JSON rows");
  cmd->add_flag("--iopoll", a.iopoll, "poll completions (IORING_SETUP_IOPOLL); refused unless the drive has poll "
                                          "queues (/sys/block/DEV/queue/io_poll = 1)");
  cmd->add_option("--device", a.device, "measure raw block devices (comma list, e.g. /dev/nvme0n1) instead of a "
                                            "file; read-only unless --destructive");
  cmd->add_flag("--destructive", a.destructive, "with --device: allow write rows, overwriting the device's first "
                                                    "--size bytes (refused while it is mounted)");
  cmd->add_option("--fio-mem", a.fio_mem,
                  "fio's buffer memory with --vs-fio: same (the page size Strata uses: hugetlb shmhuge for huge "
                  "pages when reserved, else both on 4 KiB pages) or a fio --mem kind (malloc, shmhuge, ...)")
      ->capture_default_str();
  cmd->add_flag("--keep-file", a.keep_file, "keep the test file(s) afterwards");
}

// Timed runs, intervals, steady state, mixes, verification, pictures.
void add_time_and_check_flags(CLI::App* cmd, BenchIoArgs& a) {
  cmd->add_option("--time", a.time,
                  "run each row this long (30s, 10m, 1h) over --size as the working set, blocks drawn uniformly");
  cmd->add_option("--ramp", a.ramp, "with --time: run this long first without counting it (e.g. 5s)");
  cmd->add_option("--interval", a.interval,
                  "report every interval (JSON lines with --json, else a live line; default 1s with --time)");
  cmd->add_option("--interval-log", a.interval_log, "also write the interval JSON lines to this file");
  cmd->add_option("--steady-state", a.steady_state,
                  "with --time: stop once range and drift of the bandwidth over --steady-window are within this "
                  "bound of its mean (e.g. 5%)");
  cmd->add_option("--steady-window", a.steady_window, "the window of --steady-state")->capture_default_str();
  cmd->add_flag("--precondition", a.precondition,
                "before each write row, fill the file sequentially then overwrite it in random order");
  cmd->add_option("--mix", a.mix, "read percent of --rw randrw (default 50)");
  cmd->add_option("--read-qd", a.read_qd, "queue depth of the readers of a read+write row (default: --qd)");
  cmd->add_option("--write-qd", a.write_qd, "queue depth of the writers of a read+write row (default: --qd)");
  cmd->add_flag("--verify", a.verify,
                "stamp every block (offset, generation, seed, XXH3), check every read and read the file back at "
                "the end; a wrong block fails the run");
  cmd->add_option("--seed", a.seed, "seed of the random order and of --verify's headers (default: the clock)");
  cmd->add_flag("--histogram", a.histogram, "add the latency histogram to each JSON row");
  cmd->add_option("--plot", a.plot,
                  "draw a picture (FILE.svg or FILE.png, with gnuplot): bandwidth and latency per interval of a "
                  "--time/--interval run, or with --tune the heat maps of GB/s by request size x queue depth");
  // Test hook: damages one block on disk before --verify's read-back (Note [Bench verify] in bench/bench_io_verify.h).
  cmd->add_option("--inject-fault", a.inject_fault)->group("");
}

void add_soak_flags(CLI::App* cmd, SoakArgs& soak, IoModes& m) {
  m.soak = cmd->add_option("--soak", soak.duration,
                           "run the swap store for this long (20s, 1h) under an optimizer step's traffic: "
                           "--size of chunk tensors read ahead and written behind at once, every extent's "
                           "checksum and every byte checked; a mismatch or I/O error fails naming the tensor, "
                           "extent and offset");
  m.soak_chunk = cmd->add_option("--soak-chunk", soak.chunk,
                                 "with --soak: fp32 optimizer state of one chunk (its gradient and bf16 "
                                 "weights are stored beside it)")
                     ->capture_default_str();
  m.soak_fault = cmd->add_option("--soak-fault", soak.faults,
                                 "with --soak: inject faults, KIND:OP:N[,...] (KIND eio, enospc, eagain, "
                                 "eintr, short, corrupt; OP read, write, any; N the Nth such operation)");
}

void add_replay_flags(CLI::App* cmd, ReplayArgs& replay, IoModes& m) {
  m.replay = cmd->add_option(
      "--replay", replay.config,
      "replay the NVMe I/O of one ZeRO-Infinity step of this training config (or 'demo') through the engine's swap "
      "store on its nvme_path, beside the step's simulated compute");
  m.set = cmd->add_option("--set", replay.overrides, "with --replay or --tune: override a config key (repeatable)");
  m.machine = cmd->add_option("--machine", replay.machine,
                              "with --replay: the compute side, a machine file or 'measure' (this host as "
                              "the sim device)")
                  ->capture_default_str();
  m.steps = cmd->add_option("--replay-steps", replay.steps, "with --replay: steps measured after one untimed")
                ->capture_default_str();
  m.tbw = cmd->add_option("--drive-tbw", replay.drive_tbw,
                          "with --replay: rated TB written of one drive, for the days to its endurance");
}

void add_tune_flags(CLI::App* cmd, TuneArgs& tune, IoModes& m) {
  m.tune = cmd->add_flag("--tune", tune.enabled,
                         "sweep kernel request size x queue depth (reads and writes) on the drive of the "
                         "config's nvme_path (or --dir/--paths) and print the best aio settings");
  m.out = cmd->add_option("--out", tune.out, "with --tune: write the winning settings as a config fragment "
                                               "(`strata train --config-fragment FILE` reads it)");
  m.config = cmd->add_option("--config", tune.config, "with --tune: the training config whose nvme_path is "
                                                       "tuned (default: the built-in demo)");
  m.sizes = cmd->add_option("--tune-request-sizes", tune.request_sizes,
                            "with --tune: kernel request sizes swept")->capture_default_str();
  m.qds = cmd->add_option("--tune-qd", tune.qds, "with --tune: queue depths swept")->capture_default_str();
  m.jobs = cmd->add_option("--tune-jobs", tune.jobs,
                           "with --tune: rings per drive swept at the best request sizes and depth (reported; "
                           "the engine runs one ring per drive)")
               ->capture_default_str();
  m.rw = cmd->add_option("--tune-rw-qd", tune.rw_qds,
                         "with --tune: reader+writer depths of read+write rows (readers and writers at once, "
                         "as the optimizer step reads ahead and writes behind), which set aio.queue_depth; "
                         "auto: Q/2+Q/2 for every --tune-qd Q; none: skip")
             ->capture_default_str();
  m.machine_file = cmd->add_option("--machine-file", tune.machine_file,
                                   "with --tune: write the drive's curve (GB/s by request size x queue depth) "
                                   "into this machine file for strata simulate: an existing one (strata doctor "
                                   "--json --measure --out M.json) is updated, a new one measured as doctor "
                                   "--measure does");
}

// --replay reads its config (the drive is the config's nvme_path) and its own options; a row's option given beside
// it (--dir, --bs, --qd, ...) would be silently unused, so it is refused.
void refuse_unread_by_replay(const IoModes& m) {
  const std::vector<const CLI::Option*> read = {m.replay, m.set, m.machine, m.steps, m.tbw, m.cmd->get_option("--json")};
  for (const CLI::Option* o : m.cmd->get_options()) {
    if (o->count() == 0 || std::find(read.begin(), read.end(), o) != read.end()) continue;
    throw ConfigError(fmt::format("{} is not an option of --replay, which replays one step of the config on its "
                                  "nvme_path (change that with --set zero_optimization.offload_optimizer.nvme_path=...)"
                                  ": drop {}",
                                  o->get_name(), o->get_name()));
  }
}

// One mode per run: --soak, --tune, --replay or the rows; a mode's options without it are refused.
int run_io_command(IoCommand& io) {
  if (io.modes.soak->count() > 0) {
    const BenchIoArgs& a = io.args;
    if (io.modes.tune->count() > 0 || io.modes.replay->count() > 0 || a.vs_fio || !a.time.empty() || a.verify ||
        !a.plot.empty()) {
      throw ConfigError("--soak runs alone: drop --tune, --replay, --vs-fio, --time, --plot and --verify (it "
                        "verifies every read itself)");
    }
    return bench_io::run_soak(io.soak, io.args);
  }
  for (const CLI::Option* o : {io.modes.soak_chunk, io.modes.soak_fault}) {
    if (o->count() > 0) throw ConfigError(fmt::format("{} is an option of --soak: add --soak DURATION", o->get_name()));
  }
  if (io.modes.tune->count() > 0) {
    if (io.modes.replay->count() > 0) throw ConfigError("--tune and --replay: run one at a time");
    if ((!io.args.dir.empty() || !io.args.paths.empty()) && (io.modes.config->count() > 0 || io.modes.set->count() > 0)) {
      throw ConfigError("--tune: --dir/--paths name the drive to tune, and so do --config/--set (through the config's "
                        "nvme_path); give one of them");
    }
    io.tune.overrides = io.replay.overrides;
    io.tune.size_given = io.modes.size->count() > 0;
    return bench_io::run_tune(io.tune, io.args);
  }
  const IoModes& m = io.modes;
  for (const CLI::Option* o : {m.out, m.config, m.sizes, m.qds, m.jobs, m.rw, m.machine_file}) {
    if (o->count() > 0) throw ConfigError(fmt::format("{} is an option of --tune: add --tune", o->get_name()));
  }
  if (io.modes.replay->count() == 0) {
    for (const CLI::Option* o : {io.modes.set, io.modes.machine, io.modes.steps, io.modes.tbw}) {
      if (o->count() > 0) {
        throw ConfigError(fmt::format("{} is an option of --replay{}: add --replay CONFIG", o->get_name(),
                                      o == io.modes.set ? " and --tune" : ""));
      }
    }
    return bench_io::run_bench_io(io.args);
  }
  if (!io.args.plot.empty()) {
    throw ConfigError("--plot draws a --time/--interval run or --tune's heat maps, not --replay: drop it");
  }
  refuse_unread_by_replay(io.modes);
  io.replay.json = io.args.json;
  return bench_io::run_replay(io.replay);
}

}  // namespace
}  // namespace bench_io

void register_bench_io(CLI::App& bench, CommandTable& table) {
  auto io = std::make_shared<bench_io::IoCommand>();
  auto* cmd = bench.add_subcommand("io", "NVMe bandwidth/IOPS/latency of Strata's I/O engine (optionally beside fio)");
  bench_io::add_run_flags(cmd, io->args);
  bench_io::add_time_and_check_flags(cmd, io->args);
  bench_io::add_soak_flags(cmd, io->soak, io->modes);
  bench_io::add_replay_flags(cmd, io->replay, io->modes);
  bench_io::add_tune_flags(cmd, io->tune, io->modes);
  io->modes.size = cmd->get_option("--size");
  io->modes.cmd = cmd;
  cmd->footer(
      "Latency, as fio splits it: lat is a request's whole time, from the bench queueing it (the engine's "
      "submit call) to its completion being reaped (the batch's callback on the engine thread); slat from the queueing "
      "to its submission to the kernel (io_uring_submit returning, the SQE consumed; when the SQE goes in with the "
      "engine's wait for completions, the moment that io_uring_enter is entered; the thread engine: its pread/pwrite "
      "starting), which includes the hand-over to the engine thread for the first --qd requests (later ones are "
      "queued from a completion's callback, on that thread); clat from there to the completion "
      "reaped. lat = slat + clat for every request; rows give p50-p99.99, max and mean of each (JSON \"slat\" and "
      "\"clat\"), fio's beside them with --vs-fio.");
  table[cmd] = [io]() -> int { return bench_io::run_io_command(*io); };
}

}  // namespace strata::bench
