// The training loop (see tools/trainer.h).
#include "tools/trainer.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/device/device.h"
#include "core/device/traced_device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "engine/checkpoint.h"
#include "engine/communicator.h"
#include "engine/config.h"
#include "engine/lr_schedule.h"
#include "engine/tier_plan.h"
#include "engine/zero_engine.h"
#include "models/decoder.h"
#include "models/hf_names.h"
#include "models/model_config.h"
#include "models/param_init.h"
#include "models/safetensors.h"
#include "models/tiling.h"
#include "models/tiling_plan.h"
#include "models/token_data.h"
#include "models/weights_io.h"

namespace strata::tools {
namespace {

using Clock = std::chrono::steady_clock;

// A "Field:   N kB" line of /proc/self/status, in bytes (0 when absent).
std::uint64_t proc_status_bytes(std::string_view field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > field.size() && line.compare(0, field.size(), field) == 0 && line[field.size()] == ':') {
      return std::stoull(line.substr(field.size() + 1)) * 1024;
    }
  }
  return 0;
}
// The peak resident set of this process (VmHWM), and the current one (VmRSS).
std::uint64_t peak_rss_bytes() { return proc_status_bytes("VmHWM"); }
std::uint64_t current_rss_bytes() { return proc_status_bytes("VmRSS"); }

// File descriptors this process has open: the entries of /proc/self/fd, less the one the listing
// itself holds; -1 where /proc cannot be read.
std::int64_t open_fd_count() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  std::int64_t n = 0;
  while (const dirent* e = ::readdir(dir)) n += e->d_name[0] != '.' ? 1 : 0;
  ::closedir(dir);
  return n - 1;
}

// Bytes this rank's swap files take on disk (st_blocks x 512; the engine preallocates them, so this
// stays put while the run is healthy): the plan's swap file in each of its NVMe directories.
std::uint64_t swap_file_bytes(const RunPlan& plan) {
  std::uint64_t bytes = 0;
  for (const auto& d : plan.offload.nvme_dirs) {
    struct stat st {};
    const std::string path = d + "/" + plan.offload.swap_file_name;
    if (::stat(path.c_str(), &st) == 0) bytes += static_cast<std::uint64_t>(st.st_blocks) * 512;
  }
  return bytes;
}

void write_summary_json(const std::string& path, const TrainSummary& s) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw ConfigError(fmt::format("--summary-json: cannot open '{}' for writing", path));
  out << nlohmann::json{{"steps", s.steps},
                        {"first_loss", s.first_loss},
                        {"last_loss", s.last_loss},
                        {"tokens_per_second", s.tokens_per_second},
                        {"peak_device_bytes", s.peak_device_bytes},
                        {"peak_host_bytes", s.peak_host_bytes},
                        {"pinned_bytes", s.pinned_bytes},
                        {"peak_rss_bytes", s.peak_rss_bytes},
                        {"peak_nvme_bytes", s.peak_nvme_bytes},
                        {"nvme_bytes_read", s.nvme_bytes_read},
                        {"nvme_bytes_written", s.nvme_bytes_written},
                        {"optimizer_chunk_updates", s.optimizer_chunk_updates},
                        {"overlapped_chunk_updates", s.overlapped_chunk_updates},
                        {"step_call_fraction", s.step_call_fraction},
                        {"model_state_bytes", s.model_state_bytes},
                        {"device_capacity_bytes", s.device_capacity_bytes}}
             .dump(2)
      << "\n";
  if (!out) throw IoError(fmt::format("--summary-json: writing '{}' failed", path), errno);
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const auto t = static_cast<long long>(seconds + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t / 60) % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

// A one-line progress bar on an interactive stderr, redrawn in place each step.
class ProgressBar {
 public:
  ProgressBar(std::int64_t total, bool enabled) : total_(total), interactive_(enabled && ::isatty(STDERR_FILENO) != 0) {}
  bool interactive() const { return interactive_; }
  void update(std::int64_t done, const std::string& text) {
    constexpr int kWidth = 24;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
    std::fprintf(stderr, "\r\033[K[%s%s] %lld/%lld %s", std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(kWidth - filled), '.').c_str(), static_cast<long long>(done),
                 static_cast<long long>(total_), text.c_str());
    std::fflush(stderr);
    drawn_ = true;
  }
  void finish() {
    if (drawn_) std::fprintf(stderr, "\n");
    drawn_ = false;
  }

 private:
  std::int64_t total_;
  bool interactive_;
  bool drawn_ = false;
};

std::unique_ptr<Device> make_device(const TrainConfig& cfg) {
  const DeviceConfig& d = cfg.strata.device;
  if (d.kind == DeviceChoice::Cuda) {
    throw ConfigError(fmt::format("{}: strata.device.kind is \"cuda\", but the training engine of this version runs "
                                  "on the sim device only; set strata.device.kind=sim",
                                  cfg.source));
  }
  SimDeviceOptions o;
  o.capacity_bytes = d.memory_bytes > 0 ? d.memory_bytes : std::size_t{1} << 30;
  o.h2d_gbps = d.h2d_gbps;
  o.d2h_gbps = d.d2h_gbps;
  o.latency_us = d.latency_us;
  return make_sim_device(o);
}

}  // namespace

models::ModelConfig training_model_config(const TrainConfig& cfg, bool* checkpointing) {
  *checkpointing = false;
  models::ModelConfig m;
  if (cfg.strata.model.is_string()) {
    m = models::model_config_by_name(cfg.strata.model.get<std::string>());
  } else {
    nlohmann::json j = cfg.strata.model;
    if (j.contains("checkpoint_activations")) {
      if (!j["checkpoint_activations"].is_boolean()) {
        throw ConfigError(fmt::format("{}: strata.model.checkpoint_activations must be true or false", cfg.source));
      }
      *checkpointing = j["checkpoint_activations"].get<bool>();
      j.erase("checkpoint_activations");
    }
    m = models::model_config_from_json(j);
  }
  switch (cfg.precision) {
    case Precision::Fp32: m.dtype = DType::F32; break;
    case Precision::Bf16: m.dtype = DType::BF16; break;
    case Precision::Fp16: m.dtype = DType::F16; break;
  }
  m.validate();
  if (cfg.strata.data.seq_len > m.max_seq_len) {
    throw ConfigError(fmt::format("{}: strata.data.seq_len = {} exceeds the model's max_seq_len {}; lower seq_len",
                                  cfg.source, cfg.strata.data.seq_len, m.max_seq_len));
  }
  return m;
}

namespace {

// The token file to train on: the fortunes corpus (tokenized once into `cache_dir`), a token file,
// or a text file tokenized by bytes.
std::string prepare_training_data(const TrainConfig& cfg, Communicator& comm, const std::string& cache_dir) {
  const DataConfig& d = cfg.strata.data;
  std::string path;
  if (d.train == "fortunes") {
    path = cache_dir + "/train.tok";  // prepare_fortunes_token_files writes train.tok and val.tok
    if (comm.rank() == 0) {
      std::filesystem::create_directories(cache_dir);
      if (!std::filesystem::exists(path)) models::prepare_fortunes_token_files(cache_dir);
    }
  } else {
    const bool text = d.format == "text" || (d.format == "auto" && std::filesystem::path(d.train).extension() == ".txt");
    if (!text) return d.train;
    path = cache_dir + "/" + std::filesystem::path(d.train).filename().string() + ".tok";
    if (comm.rank() == 0) {
      std::ifstream in(d.train, std::ios::binary);
      if (!in) {
        throw ConfigError(fmt::format("{}: strata.data.train: cannot open '{}': {}", cfg.source, d.train,
                                      errno_text(errno)));
      }
      const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::filesystem::create_directories(cache_dir);
      models::write_token_file(path, models::ByteTokenizer::encode(content), models::ByteTokenizer::kVocabSize);
    }
  }
  comm.barrier();
  return path;
}

void save_weights(const std::string& out, const models::ModelConfig& model, ZeroEngine& engine, int rank) {
  std::vector<std::vector<float>> values;
  const auto groups = engine.groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (std::size_t t = 0; t < groups[g].tensors.size(); ++t) values.push_back(engine.gather_master(g, t));
  }
  if (rank != 0) return;
  // Tiles are put back together: a tiled run writes the same file as an untiled one.
  const std::vector<models::WholeTensorValues> whole = models::assemble_whole_tensors(model, groups, values);
  std::vector<models::SafetensorsTensorOut> tensors;
  for (const auto& w : whole) tensors.push_back(models::SafetensorsTensorOut{w.name, DType::F32, w.shape, w.values.data()});
  models::write_safetensors(out, tensors,
                            {{"format", "strata"}, {"model", model.name},
                             {"arch", std::string(models::architecture_name(model.arch))}});
  spdlog::info("wrote {} tensors to {}", tensors.size(), out);
}

// ---- Checkpoints, resume and stopping on a signal (engine/checkpoint.h) ------------------------

// The signal that asked the run to stop, 0 while none did. A handler may only set a flag; the
// training loop reads it once per step (Note [Stopping on a signal]).
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void note_stop_signal(int signo) { g_stop_signal = signo; }

// Note [Stopping on a signal]: with strata.checkpoint.dir set, SIGTERM and SIGINT let the current
// step finish. After every step the ranks agree in one host all-reduce (max of 2 x the signal seen
// + rank 0's "the minute interval is up"), so all of them stop, or write a checkpoint, after the
// same step; a stopping run writes a final checkpoint and exits with 128 + the signal. The
// handlers reset themselves (SA_RESETHAND): a second signal ends the process at once, and the last
// complete checkpoint is still intact (Note [Atomic checkpoints]).
class TrainCheckpoints {
 public:
  TrainCheckpoints(const TrainConfig& cfg, Communicator& comm, std::string model_name)
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
  ~TrainCheckpoints() {
    if (!enabled()) return;
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGINT, &old_int_, nullptr);
  }
  TrainCheckpoints(const TrainCheckpoints&) = delete;
  TrainCheckpoints& operator=(const TrainCheckpoints&) = delete;

  bool enabled() const { return !cfg_.strata.checkpoint.dir.empty(); }
  std::function<void(double seconds, std::uint64_t bytes)> on_checkpoint;  // TrainOptions::on_checkpoint
  bool capture = true;                                                      // TrainOptions::capture_checkpoints

  // Loads `dir` into the freshly built engine; returns the step to continue from.
  std::int64_t resume(const std::string& dir, ZeroEngine& engine) {
    const CheckpointManifest m = load_checkpoint(engine, comm_, cfg_, model_name_, dir);
    last_saved_ = m.step;
    if (comm_.rank() == 0) {
      spdlog::info("resumed from {} at step {} (written by world size {}, stage {}, sharding factor {})", m.dir, m.step,
                   m.world_size, m.stage, m.sharding_factor);
      if (m.step >= cfg_.strata.steps) {
        spdlog::warn("the checkpoint is at step {}, the run asks for {} steps in all: nothing left to train", m.step,
                     cfg_.strata.steps);
      }
    }
    return m.step;
  }

  // Before the step that brings the count to `steps_done`: begins the checkpoint that an interval
  // in steps or the last step makes due after it, so that the step captures the new state as it is
  // written (engine/zero_engine_offload.cc, Note [Checkpoint capture]) and the save reads nothing.
  void before_step(ZeroEngine& engine, std::int64_t steps_done, bool last_step) {
    if (!enabled() || !capture) return;
    const CheckpointConfig& c = cfg_.strata.checkpoint;
    const bool due = last_step || (c.interval_steps > 0 && steps_done % c.interval_steps == 0);
    if (!due || steps_done == last_saved_) return;
    const auto t0 = Clock::now();
    pending_ = begin_checkpoint(engine, comm_, cfg_, steps_done, options());
    begin_seconds_ = std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // After step `steps_done`: writes a checkpoint when one is due (interval in steps or minutes, the
  // last step, a stop signal); returns the signal that asks the run to stop, 0 to go on.
  int after_step(ZeroEngine& engine, std::int64_t steps_done, bool last_step) {
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

 private:
  CheckpointSaveOptions options() {
    CheckpointSaveOptions o;
    o.parent = cfg_.strata.checkpoint.dir;
    o.keep = cfg_.strata.checkpoint.keep;
    o.retention = &retention_;
    return o;
  }

  void save(ZeroEngine& engine, std::int64_t step) {
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

  const TrainConfig& cfg_;
  Communicator& comm_;
  std::string model_name_;
  std::int64_t last_saved_ = -1;
  std::unique_ptr<PendingCheckpoint> pending_;  // begun before the step it saves
  CheckpointRetention retention_;  // deletes retired checkpoints in the background; waits for that on destruction
  double begin_seconds_ = 0;
  Clock::time_point last_time_;
  struct sigaction old_term_ {};
  struct sigaction old_int_ {};
};

}  // namespace

TrainSummary run_training(const TrainOptions& options) {
  TrainConfig cfg = load_train_config(options.config_path, options.overrides);
  if (options.steps) {
    if (*options.steps < 0) throw ConfigError(fmt::format("--steps {} must be >= 0", *options.steps));
    cfg.strata.steps = *options.steps;
  }
  auto sim_device = make_device(cfg);
  // With strata.trace, every stream records a timeline (core/device/traced_device.h).
  std::shared_ptr<TraceRecorder> recorder;
  std::unique_ptr<Device> traced;
  if (!cfg.strata.trace_path.empty()) {
    recorder = std::make_shared<TraceRecorder>();
    traced = make_traced_device(*sim_device, recorder);
  }
  Device* device = traced ? traced.get() : sim_device.get();
  CommunicatorOptions copt;
  copt.order = cfg.strata.exact ? ReductionOrder::Deterministic : ReductionOrder::Fast;
  auto comm = make_world_communicator(*device, copt);
  const int rank = comm->rank();
  const int world = comm->world_size();
  if (world > 1) {
    LogOptions log;
    log.rank = rank;
    log.world_size = world;
    log.level = spdlog::get_level();
    init_logging(log);
  }
  if (rank == 0) log_ignored_keys(cfg);
  if (cfg.train_batch_size > 0 &&
      cfg.train_batch_size != static_cast<std::int64_t>(cfg.micro_batch_size) * cfg.gradient_accumulation_steps * world) {
    throw ConfigError(fmt::format("{}: train_batch_size {} != train_micro_batch_size_per_gpu {} x "
                                  "gradient_accumulation_steps {} x world size {}; fix one of them or drop "
                                  "train_batch_size",
                                  cfg.source, cfg.train_batch_size, cfg.micro_batch_size,
                                  cfg.gradient_accumulation_steps, world));
  }

  bool checkpointing = false;
  const models::ModelConfig model = training_model_config(cfg, &checkpointing);
  const std::int64_t seq = cfg.strata.data.seq_len;
  const std::int64_t micro = cfg.micro_batch_size;
  // Memory-centric tiling (models/tiling_plan.h), decided before the engine's plan.
  const models::TilingDecision tiling_plan = models::plan_tiling(cfg, model, checkpointing, world, device->capacity_bytes());
  const models::TilingSpec& tiling = tiling_plan.spec;
  if (rank == 0 && tiling_plan.automatic) {
    spdlog::info("the largest param group does not fit the device: tiling the blocks automatically");
  }
  if (rank == 0 && tiling.tiled()) spdlog::info("{}", tiling_plan.describe());
  models::DecoderOptions dopt(checkpointing ? models::Checkpointing::Blocks : models::Checkpointing::Off, tiling);
  models::Decoder decoder(model, dopt);
  const auto groups = decoder.param_groups();
  const std::uint64_t seed = cfg.strata.seed;
  std::unique_ptr<models::SafetensorsFile> init_file;
  if (!cfg.strata.init_weights.empty()) init_file = std::make_unique<models::SafetensorsFile>(models::SafetensorsFile::open(cfg.strata.init_weights));
  const auto init = [&](std::size_t g, std::size_t t, std::span<float> out) {
    const ParamTensorSpec& spec = groups[g].tensors[t];
    if (init_file) {
      models::read_init_tensor(*init_file, model, spec, out);  // names the file and tensor on a mismatch
    } else {
      models::init_tensor_gpt2_style(model.n_layers, spec, seed, out);
    }
  };
  // The run plan (where everything lives) and its bytes per tier, before any work: a config that
  // cannot fit is refused with the numbers.
  const std::uint64_t activation_bytes =
      models::Decoder(model, {checkpointing ? models::Checkpointing::Blocks : models::Checkpointing::Off})
          .activation_bytes(micro, seq, /*training=*/true);
  RunPlan run_plan = make_run_plan(cfg, groups, world, rank);
  const TierPlan plan = plan_tiers(run_plan, world, activation_bytes);
  const TierCapacities capacity = measure_capacities(plan, device->capacity_bytes(), world);
  if (rank == 0) spdlog::info("{}", describe_plan(plan, capacity));
  check_plan_fits(plan, capacity, cfg.source);

  const std::string cache_dir = cfg.strata.checkpoint.dir.empty() ? "strata-run/data" : cfg.strata.checkpoint.dir + "/data";
  const std::string data_path = prepare_training_data(cfg, *comm, cache_dir);
  models::TokenFile data = models::TokenFile::open(data_path);
  data.check_vocab(model.vocab_size);
  if (data.size() < static_cast<std::size_t>(seq + 2)) {
    throw FormatError(fmt::format("training data '{}' has {} tokens, fewer than one window of seq_len {} + 1",
                                  data_path, data.size(), seq));
  }


  ZeroEngine engine(cfg, *device, *comm, groups, init, std::move(run_plan));
  init_file.reset();
  TrainCheckpoints checkpoints(cfg, *comm, model.name);
  checkpoints.on_checkpoint = options.on_checkpoint;
  checkpoints.capture = options.capture_checkpoints;
  const std::int64_t first_step = options.resume.empty() ? 0 : checkpoints.resume(options.resume, engine);

  auto stream = device->create_stream("compute");
  models::DecoderRuntime rt;
  rt.ctx.kind = DeviceKind::Sim;
  rt.ctx.stream = stream.get();
  rt.device = device;

  models::BatchSampler sampler(data, micro, seq, seed);
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(micro * seq)), targets(inputs.size());
  const int accumulation = cfg.gradient_accumulation_steps;
  const std::int64_t units = static_cast<std::int64_t>(accumulation) * world;
  const std::int64_t tokens_per_step = units * micro * seq;

  std::unique_ptr<std::ofstream> metrics;
  if (rank == 0 && !cfg.strata.metrics_path.empty()) {
    metrics = std::make_unique<std::ofstream>(cfg.strata.metrics_path, std::ios::app);
    if (!*metrics) throw ConfigError(fmt::format("strata.metrics: cannot open '{}' for appending", cfg.strata.metrics_path));
  }
  if (rank == 0) {
    spdlog::info("model {} ({} arch): {:.2f}M parameters, {} groups; stage {}, world {}, {} x {} x {} sequences of {} "
                 "tokens per step; device {} capped at {}",
                 model.name, models::architecture_name(model.arch), static_cast<double>(models::param_count(model)) / 1e6,
                 groups.size(), cfg.zero.stage, world, micro, accumulation, world, seq, device->name(),
                 format_bytes(device->capacity_bytes()));
  }

  TrainSummary summary;
  ProgressBar bar(cfg.strata.steps, rank == 0 && !options.quiet);
  const auto start = Clock::now();
  double step_seconds_total = 0;
  double exposed_seconds_total = 0;  // inside step(): reductions not yet done, optimizer not overlapped
  for (std::int64_t s = first_step; s < cfg.strata.steps; ++s) {
    const auto step_start = Clock::now();
    const TierIoStats io_before = engine.tier_stats();
    const std::uint64_t copy_before = engine.offload_copy_bytes();
    checkpoints.before_step(engine, s + 1, s + 1 == cfg.strata.steps);
    const double lr = lr_for_step(cfg.scheduler, cfg.optimizer.lr, s);
    engine.prepare_step(lr);
    double loss_sum = 0;
    for (int a = 0; a < accumulation; ++a) {
      const std::int64_t unit = static_cast<std::int64_t>(a) * world + rank;
      sampler.restore(models::SamplerState{seed, static_cast<std::uint64_t>((s * units + unit) * micro)});
      sampler.next(inputs.data(), targets.data());
      engine.begin_micro_batch();
      // The loss gradient carries the fp16 loss scale (1 otherwise); the engine's step divides it out.
      const float grad_seed = static_cast<float>(engine.loss_scale()) / static_cast<float>(micro * seq);
      const models::LossSum loss = decoder.forward_backward(rt, engine, inputs.data(), targets.data(), micro, seq,
                                                            grad_seed);
      engine.end_micro_batch();
      loss_sum += loss.mean();
    }
    const auto step_call = Clock::now();
    const StepResult result = engine.step(lr);
    const double exposed = std::chrono::duration<double>(Clock::now() - step_call).count();
    const double loss = comm->all_reduce_host(loss_sum, ReduceOp::Sum) / static_cast<double>(units);
    const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    step_seconds_total += seconds;
    exposed_seconds_total += exposed;
    const auto stats = device->memory_stats();
    const TierIoStats io = engine.tier_stats();
    const std::uint64_t nvme_moved =
        (io.nvme_bytes_read - io_before.nvme_bytes_read) + (io.nvme_bytes_written - io_before.nvme_bytes_written);
    const double nvme_gbps = static_cast<double>(nvme_moved) / seconds / 1e9;
    const std::uint64_t host_bytes = io.host_bytes + engine.pinned_pool_bytes();
    if (s == first_step) summary.first_loss = loss;
    summary.last_loss = loss;
    summary.steps = s + 1;
    summary.peak_device_bytes = std::max(summary.peak_device_bytes, stats.peak_allocated_bytes);
    summary.peak_host_bytes = std::max<std::uint64_t>(summary.peak_host_bytes, io.peak_host_bytes + engine.pinned_pool_bytes());
    summary.peak_nvme_bytes = std::max(summary.peak_nvme_bytes, io.peak_nvme_bytes);
    summary.nvme_bytes_read = io.nvme_bytes_read;
    summary.nvme_bytes_written = io.nvme_bytes_written;
    summary.step_seconds.push_back(seconds);
    summary.step_nvme_read.push_back(io.nvme_bytes_read - io_before.nvme_bytes_read);
    summary.step_nvme_written.push_back(io.nvme_bytes_written - io_before.nvme_bytes_written);
    summary.step_copy_bytes.push_back(engine.offload_copy_bytes() - copy_before);
    if (rank == 0) {
      const double tok_s = static_cast<double>(tokens_per_step) / seconds;
      const double eta = step_seconds_total / static_cast<double>(s + 1 - first_step) *
                         static_cast<double>(cfg.strata.steps - s - 1);
      std::string tiers = fmt::format("device {}", format_bytes(stats.allocated_bytes));
      if (engine.optimizer_offloaded()) tiers += fmt::format(" | host {}", format_bytes(host_bytes));
      if (io.peak_nvme_bytes > 0) tiers += fmt::format(" | nvme {} {:.2f} GB/s", format_bytes(io.nvme_bytes), nvme_gbps);
      const std::string text = fmt::format("loss {:.4f}{} | {:.0f} tok/s | {} | ETA {}", loss,
                                           result.applied ? "" : " (skipped)", tok_s, tiers, format_duration(eta));
      if (bar.interactive()) {
        bar.update(s + 1, text);
      } else if (!options.quiet && (s % cfg.steps_per_print == 0 || s + 1 == cfg.strata.steps)) {
        spdlog::info("step {}/{} | {} | lr {:.3g} | grad norm {:.3f}", s + 1, cfg.strata.steps, text, lr,
                     result.grad_norm);
      }
      if (metrics) {
        *metrics << nlohmann::json{{"step", s + 1},
                                   {"loss", loss},
                                   {"lr", lr},
                                   {"grad_norm", result.grad_norm},
                                   {"applied", result.applied},
                                   {"loss_scale", result.loss_scale},
                                   {"tokens", tokens_per_step},
                                   {"seconds", seconds},
                                   {"step_call_seconds", exposed},
                                   {"device_bytes", stats.allocated_bytes},
                                   {"device_peak_bytes", stats.peak_allocated_bytes},
                                   {"host_bytes", host_bytes},
                                   {"nvme_bytes", io.nvme_bytes},
                                   {"nvme_read_bytes", io.nvme_bytes_read - io_before.nvme_bytes_read},
                                   {"nvme_written_bytes", io.nvme_bytes_written - io_before.nvme_bytes_written},
                                   // Process resources, for soak runs (tests/tools/train_soak_test.sh).
                                   {"rss_bytes", current_rss_bytes()},
                                   {"open_fds", open_fd_count()},
                                   {"swap_file_bytes", swap_file_bytes(engine.plan())}}
                        .dump()
                 << "\n";
        metrics->flush();
      }
    }
    summary.stopped_by_signal = checkpoints.after_step(engine, s + 1, s + 1 == cfg.strata.steps);
    if (summary.stopped_by_signal != 0) break;
  }
  bar.finish();
  summary.optimizer_chunk_updates = engine.chunk_updates();
  summary.overlapped_chunk_updates = engine.overlapped_chunk_updates();
  summary.step_call_fraction = step_seconds_total > 0 ? exposed_seconds_total / step_seconds_total : 0;
  summary.pinned_bytes = engine.pinned_pool_bytes();
  summary.model_state_bytes = plan.model_state;
  summary.parameters = static_cast<std::uint64_t>(models::param_count(model));
  summary.device_capacity_bytes = device->capacity_bytes();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  const std::int64_t steps_run = std::max<std::int64_t>(0, summary.steps - first_step);
  summary.tokens_per_second = elapsed > 0 ? static_cast<double>(tokens_per_step * steps_run) / elapsed : 0;
  stream->synchronize();
  if (!options.save_weights.empty() && summary.stopped_by_signal == 0) {
    save_weights(options.save_weights, model, engine, rank);
  }
  if (recorder) {
    const std::string path =
        world > 1 ? fmt::format("{}.rank{}", cfg.strata.trace_path, rank) : cfg.strata.trace_path;
    recorder->write_chrome_trace(path, rank);
    if (rank == 0) spdlog::info("wrote the timeline to {} (open it in chrome://tracing or ui.perfetto.dev)", path);
  }
  summary.peak_rss_bytes = peak_rss_bytes();
  if (rank == 0 && !options.summary_json.empty()) write_summary_json(options.summary_json, summary);
  if (rank == 0 && summary.steps > 0) {
    spdlog::info("done: {} steps, loss {:.4f} -> {:.4f}, {:.0f} tokens/s, peak device memory {} of {}", summary.steps,
                 summary.first_loss, summary.last_loss, summary.tokens_per_second,
                 format_bytes(summary.peak_device_bytes), format_bytes(device->capacity_bytes()));
    if (engine.optimizer_offloaded()) {
      spdlog::info("tiers: peak host {} (pinned staging {}; process peak RSS {}), peak nvme {}; nvme read {}, written {}",
                   format_bytes(summary.peak_host_bytes), format_bytes(engine.pinned_pool_bytes()),
                   format_bytes(summary.peak_rss_bytes),
                   format_bytes(summary.peak_nvme_bytes), format_bytes(summary.nvme_bytes_read),
                   format_bytes(summary.nvme_bytes_written));
      spdlog::info("overlap: {} of {} optimizer chunk updates ran during backward; step() (exposed reductions and "
                   "updates) took {:.0f}% of the step time",
                   summary.overlapped_chunk_updates, summary.optimizer_chunk_updates,
                   100.0 * summary.step_call_fraction);
    }
  }
  return summary;
}

}  // namespace strata::tools
