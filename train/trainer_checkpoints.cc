// The trainer's checkpoints, resume and stopping on a signal (see train/trainer_checkpoints.h).
#include "train/trainer_checkpoints.h"

#include <filesystem>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/file_io.h"
#include "core/units.h"
#include "train/rank_agreement.h"
#include "train/token_cache.h"

namespace strata::train {
namespace {

// The signal that asked the run to stop, 0 while none did. A handler may only set a flag; the
// training loop reads it once per step (Note [Stopping on a signal]).
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void note_stop_signal(int signo) { g_stop_signal = signo; }

}  // namespace

// Note [Stopping on a signal]: with strata.checkpoint.dir set, SIGTERM and SIGINT let the current
// step finish. After every step the ranks agree in one host all-reduce (max of 2 x the signal seen
// + rank 0's "the minute interval is up"), so all of them stop, or write a checkpoint, after the
// same step; a stopping run writes a final checkpoint and exits with 128 + the signal. The
// handlers reset themselves (SA_RESETHAND): a second signal ends the process at once, and the last
// complete checkpoint is still intact (Note [Atomic checkpoints] in checkpoint/checkpoint.h).
TrainCheckpoints::TrainCheckpoints(const TrainConfig& cfg, Communicator& comm, std::string model_name)
    : cfg_(cfg), comm_(comm), model_name_(std::move(model_name)), last_time_(Clock::now()) {
  if (!enabled()) return;
  if (cfg.strata.checkpoint.keep < 1) {
    throw ConfigError(fmt::format("{}: strata.checkpoint.keep = {} must be at least 1", cfg.source,
                                  cfg.strata.checkpoint.keep));
  }
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = note_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  ::sigaction(SIGTERM, &sa, &old_term_);
  ::sigaction(SIGINT, &sa, &old_int_);
}

TrainCheckpoints::~TrainCheckpoints() {
  if (!enabled()) return;
  ::sigaction(SIGTERM, &old_term_, nullptr);
  ::sigaction(SIGINT, &old_int_, nullptr);
}

void TrainCheckpoints::on_rank0(const std::function<void()>& check) {
  agreed_startup_step(comm_, [&] {
    if (comm_.rank() == 0) check();
  });
}

void TrainCheckpoints::claim_directory(bool resuming) {
  if (!enabled()) return;
  const std::string& dir = cfg_.strata.checkpoint.dir;
  on_rank0([&] {
    ensure_directory(dir, "strata.checkpoint.dir");
    lock_ = RunLock::acquire(dir, "checkpoint directory", dir + "/.strata.lock");
    const std::vector<std::int64_t> steps = checkpoint_steps_in(dir);
    if (!resuming && !steps.empty()) {
      throw ConfigError(fmt::format("{}: strata.checkpoint.dir {} already holds checkpoints (the newest is {}); a new "
                                    "run would mix its checkpoints with them. Continue that run with --resume {}, or "
                                    "point strata.checkpoint.dir at an empty directory",
                                    cfg_.source, dir, checkpoint_dir_name(steps.back()), dir));
    }
  });
}

// A resume from step S continues the series in strata.checkpoint.dir: checkpoints there beyond S
// would be reached again. Published ones (`latest` names a later step) mean the user picked an older
// checkpoint of a series that went further: refused. Unpublished ones (later than `latest`) are what
// a run killed between renaming its checkpoint into place and replacing `latest` leaves (Note
// [Atomic checkpoints]): never published, so removed.
void TrainCheckpoints::check_series(std::int64_t resumed_step) {
  const std::string& dir = cfg_.strata.checkpoint.dir;
  const std::optional<std::int64_t> latest = latest_checkpoint_step(dir);
  const std::vector<std::int64_t> steps = checkpoint_steps_in(dir);
  if (latest && *latest > resumed_step) {
    throw ConfigError(fmt::format("resuming step {}, but strata.checkpoint.dir {} holds later checkpoints (latest is "
                                  "{}), which this run would reach again. Resume from the latest (--resume {}), or "
                                  "remove the later checkpoints to train again from step {}",
                                  resumed_step, dir, checkpoint_dir_name(*latest), dir, resumed_step));
  }
  for (const std::int64_t step : steps) {
    if (step <= resumed_step || (latest && step <= *latest)) continue;
    const std::string path = dir + "/" + checkpoint_dir_name(step);
    spdlog::warn("removing {}: a save that was interrupted before it was published (latest is {})", path,
                 latest ? checkpoint_dir_name(*latest) : std::string("missing"));
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) throw IoError(fmt::format("cannot remove the unpublished checkpoint {}: {}", path, ec.message()), ec.value());
  }
}

std::int64_t TrainCheckpoints::resume(const std::string& dir, ZeroEngine& engine) {
  // Written with other tensor ranks: resliced through whole tensors (train/checkpoint_tensors.h).
  // Every rank reads the same manifest, so all take the same path or refuse alike.
  CheckpointManifest saved;
  agreed_startup_step(comm_, [&] { saved = read_checkpoint_manifest(dir); });
  if (saved.tensor_slices != tensor.slices && cfg_.strata.exact && comm_.rank() == 0) {
    spdlog::warn("{} was written with strata.parallel.tensor_slices = {} and this run takes its split sums in {} "
                 "slices: exact mode gives the same bits only for equal slices (Note [Tensor slices] in models/tensor_parallel.h)",
                 saved.dir, saved.tensor_slices, tensor.slices);
  }
  // Trained on other data? Rank 0 knows the data; every rank stops when it refuses.
  agreed_startup_step(comm_, [&] {
    if (comm_.rank() == 0) check_resumed_data(saved.json, data_identity, allow_new_data, saved.dir);
  });
  const CheckpointManifest m =
      saved.tensor_size != tensor.size && make_reslicer
          ? load_checkpoint_resliced(engine, comm_, cfg_, model_name_, dir, make_reslicer(saved))
          : load_checkpoint(engine, comm_, cfg_, model_name_, dir, tensor);
  if (enabled()) on_rank0([&] { check_series(m.step); });
  last_saved_ = m.step;
  if (comm_.rank() == 0) {
    spdlog::info("resumed from {} at step {} (written by world size {}{}, stage {}, sharding factor {})", m.dir, m.step,
                 m.world_size, m.tensor_size > 1 ? fmt::format(" with {} tensor ranks", m.tensor_size) : std::string(),
                 m.stage, m.sharding_factor);
    if (m.step >= cfg_.strata.steps) {
      spdlog::warn("the checkpoint is at step {}, the run asks for {} steps in all: nothing left to train", m.step,
                   cfg_.strata.steps);
    }
  }
  return m.step;
}

void TrainCheckpoints::before_step(ZeroEngine& engine, std::int64_t steps_done, bool last_step) {
  if (!enabled() || !capture) return;
  const CheckpointConfig& c = cfg_.strata.checkpoint;
  const bool due = last_step || (c.interval_steps > 0 && steps_done % c.interval_steps == 0);
  if (!due || steps_done == last_saved_) return;
  const auto t0 = Clock::now();
  pending_ = begin_checkpoint(engine, comm_, cfg_, steps_done, options());
  begin_seconds_ = std::chrono::duration<double>(Clock::now() - t0).count();
}

int TrainCheckpoints::after_step(ZeroEngine& engine, std::int64_t steps_done, bool last_step) {
  if (!enabled()) return 0;
  const CheckpointConfig& c = cfg_.strata.checkpoint;
  const bool time_up = comm_.rank() == 0 && c.interval_minutes > 0 &&
                       std::chrono::duration<double>(Clock::now() - last_time_).count() >= c.interval_minutes * 60;
  const auto agreed = static_cast<int>(comm_.all_reduce_host(2.0 * g_stop_signal + (time_up ? 1 : 0), ReduceOp::Max));
  const int signal = agreed / 2;
  const bool due = signal != 0 || agreed % 2 == 1 || last_step ||
                   (c.interval_steps > 0 && steps_done % c.interval_steps == 0);
  if (due && steps_done != last_saved_) save(engine, steps_done);
  if (signal != 0 && comm_.rank() == 0) {
    spdlog::warn("stopped by signal {} after step {}; continue with: strata train --resume {} (and the same config)",
                 signal, steps_done, c.dir);
  }
  return signal;
}

CheckpointSaveOptions TrainCheckpoints::options() {
  CheckpointSaveOptions o;
  o.parent = cfg_.strata.checkpoint.dir;
  o.keep = cfg_.strata.checkpoint.keep;
  o.retention = &retention_;
  o.tensor = tensor;
  o.data = data_identity;
  return o;
}

void TrainCheckpoints::save(ZeroEngine& engine, std::int64_t step) {
  std::unique_ptr<PendingCheckpoint> pending = std::move(pending_);
  if (pending != nullptr && pending->step() != step) pending.reset();
  CheckpointSaveResult r = save_checkpoint(engine, comm_, cfg_, model_name_, step, options(), pending.get());
  if (pending != nullptr) r.seconds += begin_seconds_;
  last_saved_ = step;
  last_time_ = Clock::now();
  if (comm_.rank() == 0) {
    spdlog::info("checkpoint of step {}: {} in {:.2f} s ({:.2f} GB/s) -> {}", step, format_bytes(r.bytes), r.seconds,
                 r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e9 : 0.0, r.dir);
  }
  if (on_checkpoint) on_checkpoint(r.seconds, r.bytes);
}

}  // namespace strata::train
