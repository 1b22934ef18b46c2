// `strata bench io --replay CONFIG` (bench/bench_io_replay.h; Note [Step replay] in bench/bench_io_replay.h there).
#include "bench/bench_io_replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <condition_variable>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/bench_io_replay_profile.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/units.h"
#include "engine/chunk_fields.h"
#include "plan/machine.h"
#include "engine/offload_tier.h"
#include "offload/buffer_pool.h"
#include "offload/swap_store.h"
#include "sim/estimate_plan.h"
#include "sim/sim_machine_measure.h"
#include "sim/step_sim.h"
#include "train/trainer.h"

namespace strata::bench::bench_io {
namespace {

using Clock = std::chrono::steady_clock;

// The step's I/O in the engine's order (Note [Step replay] in bench/bench_io_replay.h): the parameter fetches and the
// gradient combines, each at the moment the simulated step (drives taking no time) starts it.
struct StepIo {
  struct Fetch {
    std::size_t group = 0;
    double at = 0;
  };
  struct Combine {
    std::size_t group = 0;
    int unit = 0;
    double at = 0;
  };
  std::vector<Fetch> fetches;
  std::vector<Combine> combines;
  int units = 1;
  bool exact = false;
  bool overlap = false;
};

StepIo step_io_of(const sim::StepWorkload& w, const sim::SimResult& free_run) {
  StepIo io;
  io.units = w.micro_batches;
  io.exact = w.exact;
  io.overlap = w.overlap_update;
  // The simulator's names (sim/step_sim.cc): a fetch is "nvme read params <group>" on the drives'
  // queue, a combine's first chunk job "sum <group>.0 unit <u>" on the worker's lane.
  std::map<std::string, std::size_t> fetch_names;
  std::map<std::string, std::pair<std::size_t, int>> combine_names;
  for (std::size_t g = 0; g < w.group_names.size(); ++g) {
    fetch_names["nvme read params " + w.group_names[g]] = g;
    if (w.plan.groups[g].chunks.empty()) continue;
    for (int u = 0; u < w.micro_batches; ++u) combine_names[fmt::format("sum {}.0 unit {}", w.group_names[g], u)] = {g, u};
  }
  for (const sim::SimOp& op : free_run.ops) {
    if (op.queue == sim::SimQueue::Nvme) {
      if (const auto it = fetch_names.find(op.name); it != fetch_names.end()) io.fetches.push_back({it->second, op.begin});
    } else if (op.lane == sim::SimLane::Worker && op.queue == sim::SimQueue::Cpu) {
      if (const auto it = combine_names.find(op.name); it != combine_names.end()) {
        io.combines.push_back({it->second.first, it->second.second, op.begin});
      }
    }
  }
  const auto by_time = [](const auto& x, const auto& y) { return x.at < y.at; };
  std::stable_sort(io.fetches.begin(), io.fetches.end(), by_time);
  std::stable_sort(io.combines.begin(), io.combines.end(), by_time);
  std::size_t expected = 0;
  for (const GroupPlan& P : w.plan.groups) expected += P.chunks.empty() ? 0 : static_cast<std::size_t>(w.micro_batches);
  STRATA_CHECK(io.combines.size() == expected, "the simulated step has {} gradient combines, the plan {}",
               io.combines.size(), expected);
  return io;
}

// The engine's offloaded tiers for one rank, built as TieredStateHome builds them, with a swap
// file of its own beside the training run's.
// A chunk job of the engine's with its I/O and no work: what the replay runs.
ChunkJob io_only_job(std::vector<ChunkField> fields, std::vector<std::string> remove_after) {
  ChunkJob job;
  job.fields = std::move(fields);
  job.remove_after = std::move(remove_after);
  job.work = [](std::span<const std::span<std::byte>>) {};
  return job;
}

class ReplayTiers {
 public:
  explicit ReplayTiers(const RunPlan& plan) : plan_(plan) {
    const OffloadPlan& op = plan.offload;
    if (op.nvme_dirs.empty() || op.swap_bytes == 0) {
      throw ConfigError("--replay: the config keeps nothing on NVMe (offload_optimizer / offload_param device "
                        "\"nvme\" with an nvme_path); there is no I/O to replay");
    }
    for (const auto& d : op.nvme_dirs) ensure_directory(d, "nvme_path directory");
    auto recorder = std::make_unique<RecordingIoEngine>(offload::make_io_engine(op.io));
    recorder_ = recorder.get();
    io_ = std::move(recorder);
    offload::SwapStoreOptions so;
    so.dirs = op.nvme_dirs;
    so.capacity_bytes = op.swap_capacity_bytes;
    so.file_name = "strata-replay-swap.bin";  // never the run's own (a training may hold it)
    swap_ = std::make_unique<offload::SwapStore>(*io_, so);
    store_ = std::make_unique<TierStore>(swap_.get(), nullptr);
    offload::BufferPoolOptions po;
    po.slot_count = op.slot_count;
    po.slot_bytes = op.slot_bytes;
    pool_ = std::make_unique<offload::BufferPool>(po, io_.get());
    if (op.param_slot_count > 0) {
      offload::BufferPoolOptions pp;
      pp.slot_count = op.param_slot_count;
      pp.slot_bytes = op.param_slot_bytes;
      param_pool_ = std::make_unique<offload::BufferPool>(pp, nullptr);
    }
  }

  // What a step starts from: every NVMe chunk's state and working weights stored (init_group).
  void store_initial_state() {
    const std::size_t wbytes = plan_.working_bytes();
    const std::size_t most = static_cast<std::size_t>(plan_.state_arrays) * 4 * plan_.offload.chunk_elems;
    HostBuffer staging = HostBuffer::allocate(offload::SwapStore::padded(std::max(most, wbytes * plan_.offload.chunk_elems)));
    std::fill_n(staging.as<std::byte>().data(), staging.size_bytes(), std::byte{1});
    for (std::size_t g = 0; g < plan_.groups.size(); ++g) {
      for (std::size_t k = 0; k < plan_.groups[g].chunks.size(); ++k) {
        const StateChunk& c = plan_.groups[g].chunks[k];
        if (c.state == Home::Nvme) {
          store_->write_now(state_key(g, k), staging.as<std::byte>(),
                            static_cast<std::size_t>(plan_.state_arrays) * 4 * c.elems);
        }
        if (weights_on_tier(plan_, g) && c.params == Home::Nvme) {
          store_->write_now(param_key(g, k), staging.as<std::byte>(), wbytes * c.elems);
        }
      }
    }
  }

  // One step's I/O; returns its seconds. A combine waits for the fetches the simulated step made
  // before it (its group's backward needed them), as the engine's worker waits for backward.
  double run_step(const StepIo& io) {
    const auto t0 = Clock::now();
    std::mutex mutex;
    std::condition_variable fetched_cv;
    std::size_t fetched = 0;
    bool fetch_failed = false;
    std::exception_ptr fetch_error;
    std::thread fetcher([&] {
      try {
        for (const StepIo::Fetch& f : io.fetches) {
          fetch(f.group);
          std::lock_guard lock(mutex);
          ++fetched;
          fetched_cv.notify_all();
        }
      } catch (...) {
        std::lock_guard lock(mutex);
        fetch_error = std::current_exception();
        fetch_failed = true;
        fetched_cv.notify_all();
      }
    });
    std::exception_ptr error;
    try {
      std::size_t needed = 0;
      for (const StepIo::Combine& c : io.combines) {
        while (needed < io.fetches.size() && io.fetches[needed].at <= c.at) ++needed;
        {
          std::unique_lock lock(mutex);
          fetched_cv.wait(lock, [&] { return fetched >= needed || fetch_failed; });
          if (fetch_failed) break;
        }
        combine(c.group, c.unit, io);
      }
    } catch (...) {
      error = std::current_exception();
    }
    fetcher.join();
    if (error == nullptr) error = fetch_error;
    if (error != nullptr) std::rethrow_exception(error);
    if (!io.overlap) update();
    for (std::size_t g = 0; g < plan_.groups.size(); ++g) {  // drop_grads
      for (std::size_t k = 0; k < plan_.groups[g].chunks.size(); ++k) store_->remove(grad_key(g, k));
    }
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  TierIoStats stats() const { return store_->stats(); }
  const offload::IoEngine& engine() const { return *io_; }
  RecordingIoEngine& recorder() { return *recorder_; }

 private:
  // TieredStateHome::upload_params: the group's NVMe chunks read into one parameter slot, waited for.
  void fetch(std::size_t g) {
    if (param_pool_ == nullptr) return;
    offload::BufferLease slot = param_pool_->acquire();
    const std::size_t wbytes = plan_.working_bytes();
    std::vector<offload::IoHandle> reads;
    for (std::size_t k = 0; k < plan_.groups[g].chunks.size(); ++k) {
      const StateChunk& c = plan_.groups[g].chunks[k];
      if (c.params != Home::Nvme) continue;
      reads.push_back(store_->swap().read(param_key(g, k), slot.span().subspan(c.begin * wbytes, c.elems * wbytes)));
      store_->count_read(c.elems * wbytes);
    }
    offload::wait_all(reads);
  }

  // TieredStateHome::combine with empty work.
  void combine(std::size_t g, int unit, const StepIo& io) {
    std::vector<ChunkJob> jobs;
    const bool overlap = unit + 1 == io.units && io.overlap;
    for (std::size_t k = 0; k < plan_.groups[g].chunks.size(); ++k) {
      CombineFields f = combine_fields(plan_, g, k, unit, io.exact, overlap);
      jobs.push_back(io_only_job(std::move(f.fields), std::move(f.remove_after)));
    }
    if (!jobs.empty()) ChunkPipeline(*store_, *pool_).run(jobs);
  }

  // TieredStateHome::update with empty work.
  void update() {
    std::vector<ChunkJob> jobs;
    for (std::size_t g = 0; g < plan_.groups.size(); ++g) {
      for (std::size_t k = 0; k < plan_.groups[g].chunks.size(); ++k) {
        UpdateFields f = update_fields(plan_, g, k);
        jobs.push_back(io_only_job(std::move(f.fields), std::move(f.remove_after)));
      }
    }
    if (!jobs.empty()) ChunkPipeline(*store_, *pool_).run(jobs);
  }

  const RunPlan& plan_;
  std::unique_ptr<offload::IoEngine> io_;
  RecordingIoEngine* recorder_ = nullptr;  // io_ itself
  std::unique_ptr<offload::SwapStore> swap_;
  std::unique_ptr<TierStore> store_;
  std::unique_ptr<offload::BufferPool> pool_;
  std::unique_ptr<offload::BufferPool> param_pool_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The index of the element median() returns.
std::size_t median_index(const std::vector<double>& v) {
  std::vector<std::size_t> order(v.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return v[x] < v[y]; });
  return order.empty() ? 0 : order[order.size() / 2];
}

}  // namespace

namespace {

// The config, the machine and the step `strata train` would run (Note [One plan for estimate and
// train] in sim/estimate_plan.h), for rank 0.
struct ReplaySetup {
  TrainConfig cfg;
  bool measure = false;  // the machine is this host, measured now
  sim::SimMachine machine;
  sim::StepWorkload workload;
  MachineDrives yardstick;  // the sequential yardstick of `strata bench step` (plan/bench_disk.h), when measured
};

ReplaySetup plan_replay(const ReplayArgs& a) {
  if (a.steps < 1 || a.steps > 1000) {
    throw ConfigError(fmt::format("--replay-steps {}: must be 1-1000 (replayed steps measured after one untimed)", a.steps));
  }
  if (!(a.drive_tbw >= 0)) throw ConfigError(fmt::format("--drive-tbw {}: must be >= 0 (TB, 1e12 bytes)", a.drive_tbw));
  if (a.config != "demo" && !std::filesystem::is_regular_file(a.config)) {
    throw ConfigError(fmt::format("--replay {}: no such config file; name a training config, or 'demo' for the "
                                  "built-in configs/demo.json",
                                  a.config));
  }
  ReplaySetup r;
  r.cfg = train::load_train_config_or_demo(a.config == "demo" ? std::string() : a.config, a.overrides);
  r.measure = a.machine == "measure";
  if (!r.measure) r.machine.spec = load_machine(a.machine);
  sim::EstimateInputs in;
  in.config = r.cfg;
  if (!r.measure) in.machine = r.machine.spec;
  in.world_size = 1;
  sim::resolve_planned_batch_sizes(in);
  const sim::Estimate planned = estimate_run(in);
  if (!planned.fits) throw ConfigError(fmt::format("--replay {}: {}", r.cfg.source, planned.why_not));
  if (planned.pipeline_stages > 1) {
    throw ConfigError(fmt::format("--replay {}: strata.parallel.pipeline = {}: replaying a pipeline stage's I/O is not "
                                  "built; replay with strata.parallel.pipeline = 1",
                                  r.cfg.source, planned.pipeline_stages));
  }
  r.workload = sim::make_step_workload(planned.resolved, planned.world_size, planned.device_bytes);
  if (r.measure) r.machine = sim::measure_sim_machine(planned.resolved, r.workload);
  r.yardstick = r.machine.spec.drives;
  return r;
}

// What the replay measured and what the simulator makes of it.
struct ReplayResult {
  std::string engine;
  StepIo io;
  std::vector<double> seconds;  // I/O time of each measured step
  std::uint64_t read_bytes = 0, written_bytes = 0;  // of the last step
  double io_s = 0, io_gbps = 0;
  double compute_s = 0;  // the step with drives that take (almost) no time
  sim::SimResult step;   // the step with this drive
  int drives = 1;
  SsdWear wear;
  double yard_s = 0;  // the same bytes at the sequential yardstick's rates (0: not measured)
  ReplayIoProfile profile;  // the median step's, as the engine saw it
  double simulated_nvme_s = 0;  // the NVMe queue's busy seconds of the step simulated on the machine's drives
};

ReplayResult replay_and_predict(const ReplayArgs& a, const ReplaySetup& setup) {
  const sim::StepWorkload& workload = setup.workload;
  ReplayResult r;
  // The step with drives that take (almost) no time: its compute side, and the fetches the engine
  // issues. Not infinitely fast: an operation of no length at the step's first instant (the
  // gathers the previous step's end started) would fall outside the step's window.
  sim::SimMachine free_drives = setup.machine;
  free_drives.spec.drives.count = std::max(setup.machine.spec.drives.count, 1);
  free_drives.spec.drives.read_gbps = free_drives.spec.drives.write_gbps = 1e6;
  const sim::SimResult free_run = simulate_step(workload, free_drives);
  const MachineDrives& d = setup.machine.spec.drives;
  if (d.count > 0 && d.read_gbps > 0 && d.write_gbps > 0) {
    const sim::SimResult on_drives = simulate_step(workload, setup.machine);
    r.simulated_nvme_s = on_drives.busy_seconds[static_cast<std::size_t>(sim::SimQueue::Nvme)];
  }
  r.io = step_io_of(workload, free_run);
  r.compute_s = free_run.step_seconds;

  ReplayTiers tiers(workload.plan);
  tiers.store_initial_state();
  TierIoStats before = tiers.stats();
  std::vector<ReplayIoProfile> profiles;
  for (int s = 0; s <= a.steps; ++s) {
    tiers.recorder().clear();
    const double t = tiers.run_step(r.io);
    const TierIoStats after = tiers.stats();
    if (s > 0) {
      r.seconds.push_back(t);
      profiles.push_back(tiers.recorder().profile());
      r.read_bytes = after.nvme_bytes_read - before.nvme_bytes_read;
      r.written_bytes = after.nvme_bytes_written - before.nvme_bytes_written;
    }
    before = after;
  }
  r.engine = tiers.engine().info().name;
  r.io_s = median(r.seconds);
  r.profile = profiles[median_index(r.seconds)];
  const double moved = static_cast<double>(r.read_bytes + r.written_bytes);
  r.io_gbps = r.io_s > 0 ? moved / r.io_s / 1e9 : 0;

  // The step with this drive: the simulator's NVMe at the rate the replay reached.
  sim::SimMachine with_drive = setup.machine;
  r.drives = static_cast<int>(workload.plan.offload.nvme_dirs.size());
  with_drive.spec.drives.count = r.drives;
  with_drive.spec.drives.read_gbps = with_drive.spec.drives.write_gbps = r.io_gbps / r.drives;
  r.step = simulate_step(workload, with_drive);
  r.wear = ssd_wear(static_cast<double>(r.written_bytes), r.step.step_seconds, r.drives, a.drive_tbw);
  const MachineDrives& y = setup.yardstick;
  r.yard_s = setup.measure && y.read_gbps > 0
                 ? static_cast<double>(r.read_bytes) / (y.read_gbps * r.drives * 1e9) +
                       static_cast<double>(r.written_bytes) / (y.write_gbps * r.drives * 1e9)
                 : 0;
  return r;
}

void print_replay_json(const ReplayArgs& a, const ReplaySetup& setup, const ReplayResult& r) {
  const sim::StepWorkload& workload = setup.workload;
  const double tokens = static_cast<double>(workload.tokens_per_step);
  nlohmann::json j = {{"replay", setup.cfg.source},
                      {"steps", a.steps},
                      {"engine", r.engine},
                      {"param_fetches", r.io.fetches.size()},
                      {"micro_batches", r.io.units},
                      {"overlapped_update", r.io.overlap},
                      {"slots", workload.plan.offload.slot_count},
                      {"slot_bytes", workload.plan.offload.slot_bytes},
                      {"nvme_read_bytes_per_step", r.read_bytes},
                      {"nvme_written_bytes_per_step", r.written_bytes},
                      {"io_seconds", r.io_s},
                      {"io_seconds_all", r.seconds},
                      {"io_gbps", r.io_gbps},
                      {"compute_step_seconds", r.compute_s},
                      {"predicted_step_seconds", r.step.step_seconds},
                      {"slowest_queue", sim::sim_queue_name(r.step.slowest)},
                      {"nvme_bottleneck", r.step.slowest == sim::SimQueue::Nvme},
                      {"tokens_per_step", workload.tokens_per_step},
                      {"nvme_tokens_per_s", r.io_s > 0 ? tokens / r.io_s : 0},
                      {"predicted_tokens_per_s", r.step.tokens_per_second},
                      {"nvme_tb_written_per_day", r.wear.tb_per_day},
                      {"days_to_rated_endurance", r.wear.days_to_rated},
                      {"machine", setup.measure ? "measure" : a.machine}};
  if (r.yard_s > 0) j["sequential_yardstick_seconds"] = r.yard_s;
  j["simulated_nvme_seconds"] = r.simulated_nvme_s;
  j["io_profile"] = r.profile.to_json();
  std::printf("%s\n", j.dump().c_str());
}

void print_replay_text(const ReplayArgs& a, const ReplaySetup& setup, const ReplayResult& r) {
  const OffloadPlan& op = setup.workload.plan.offload;
  const double tokens = static_cast<double>(setup.workload.tokens_per_step);
  std::printf("replay of %s: one step of rank 0 through the engine's swap store (%s, %zu drive(s)), %d micro-batches, "
              "%zu parameter fetches, %zu pinned slots of %s, %s update\n",
              setup.cfg.source.c_str(), r.engine.c_str(), op.nvme_dirs.size(), r.io.units, r.io.fetches.size(),
              op.slot_count, format_bytes(op.slot_bytes).c_str(), r.io.overlap ? "overlapped" : "separate");
  std::printf("nvme per step: read %s, written %s; I/O alone %.4f s (median of %d replayed steps), %.3f GB/s\n",
              format_bytes(r.read_bytes).c_str(), format_bytes(r.written_bytes).c_str(), r.io_s, a.steps, r.io_gbps);
  if (r.yard_s > 0) {
    std::printf("the same bytes as bench step's sequential passes: %.4f s (replay / that = %.2f)\n", r.yard_s,
                r.io_s / r.yard_s);
  }
  if (r.simulated_nvme_s > 0) {
    std::printf("strata simulate's nvme seconds for this step on %s's drives: %.4f s (replay / that = %.2f)\n",
                setup.measure ? "this host" : a.machine.c_str(), r.simulated_nvme_s, r.io_s / r.simulated_nvme_s);
  }
  const ReplayIoProfile& p = r.profile;
  std::printf("as the engine saw it: %llu reads of %s and %llu writes of %s (mean kernel request); in flight %.4f s "
              "of %.4f s (reads and writes together %.4f s), %.1f requests on average; callbacks %.4f s\n",
              static_cast<unsigned long long>(p.read_requests),
              format_bytes(static_cast<std::uint64_t>(p.mean_read_request_bytes())).c_str(),
              static_cast<unsigned long long>(p.write_requests),
              format_bytes(static_cast<std::uint64_t>(p.mean_write_request_bytes())).c_str(),
              p.busy_seconds, p.wall_seconds, p.mixed_seconds, p.mean_requests_in_flight, p.callback_seconds);
  std::printf("compute alone (simulated on %s): step %.4f s; with this drive: step %.4f s, slowest queue %s\n",
              setup.measure ? "this host as the sim device" : a.machine.c_str(), r.compute_s, r.step.step_seconds,
              sim::sim_queue_name(r.step.slowest));
  std::printf("NVMe %s the bottleneck: it allows %.1f tokens/s (I/O alone), the step %.1f tokens/s\n",
              r.step.slowest == sim::SimQueue::Nvme ? "is" : "is not", r.io_s > 0 ? tokens / r.io_s : 0,
              r.step.tokens_per_second);
  std::printf("ssd wear: %.3g TB written per day over %d drive(s)", r.wear.tb_per_day, r.drives);
  if (r.wear.days_to_rated > 0) {
    std::printf(", %.0f days to the rated %.0f TBW per drive", r.wear.days_to_rated, a.drive_tbw);
  }
  std::printf("\n");
}

}  // namespace

int run_replay(const ReplayArgs& a) {
  const ReplaySetup setup = plan_replay(a);
  const ReplayResult result = replay_and_predict(a, setup);
  if (a.json) {
    print_replay_json(a, setup, result);
  } else {
    print_replay_text(a, setup, result);
  }
  return 0;
}

}  // namespace strata::bench::bench_io
