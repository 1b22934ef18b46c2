// The phases of one rank's training run (train/training_run.h): the helpers they call first, then
// the phases in the order run_training (train/trainer.cc) calls them.
#include "train/training_run.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "checkpoint/checkpoint.h"
#include "models/param_init.h"
#include "models/safetensors.h"
#include "models/tiling.h"
#include "models/tiling_plan.h"
#include "models/weights_io.h"
#include "train/checkpoint_tensors.h"
#include "train/rank_agreement.h"
#include "train/run_paths.h"
#include "train/token_cache.h"
#include "train/trainer_data.h"

namespace strata::train {
namespace {

// Only world rank 0 writes: the whole tensors travel to it alone (data rank 0's tensor groups
// assemble them on tensor rank 0, whose pipeline groups bring them to stage 0), and no other rank
// holds more than one tensor beyond its own slices.
void save_weights(const std::string& out, const models::ModelConfig& model, ZeroEngine& engine,
                  const models::Decoder& decoder, const models::TensorParallel& tp, const models::PipelineStage& stage,
                  int rank, int data_rank) {
  std::vector<std::vector<float>> values;
  const auto local = engine.groups();
  for (std::size_t g = 0; g < local.size(); ++g) {
    for (std::size_t t = 0; t < local[g].tensors.size(); ++t) values.push_back(engine.gather_master(g, t));
  }
  // The whole model's groups (with tensor parallelism, at their whole tensors' shapes).
  std::vector<ParamGroupSpec> all = decoder.layout().groups;
  if (data_rank != 0) return;  // its replicas of the tensors never reach rank 0
  if (tp.size > 1) {
    values = gather_tensor_slices(model, tp, decoder.stage_groups(), values, tp.rank == 0);
    all = models::tensor_parallel_layout(model, tp.size, tp.rank).whole;
    if (tp.rank != 0) return;
  }
  if (stage.split()) values = gather_pipeline_stages(*stage.comm, all, decoder.stage_groups(), values, stage.rank == 0);
  std::span<const ParamGroupSpec> groups = all;
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

// The config of the run: the file with its --set overrides, then --steps.
TrainConfig load_run_config(const TrainOptions& options) {
  TrainConfig cfg = load_train_config_or_demo(options.config_path, options.overrides);
  if (options.steps) {
    if (*options.steps < 0) {
      throw ConfigError(fmt::format("--steps {}: the number of optimizer steps must be >= 0 (0 trains nothing: it "
                                    "checks the config and, with --save-weights, writes the initial weights)",
                                    *options.steps));
    }
    cfg.strata.steps = *options.steps;
  }
  resolve_step_autos(cfg);
  return cfg;
}

// The run's device (RunDevice in train/training_run.h).
RunDevice make_run_device(const TrainConfig& cfg) {
  RunDevice d;
  d.sim = open_training_device(cfg);
  if (!cfg.strata.trace_path.empty()) {
    d.recorder = std::make_shared<TraceRecorder>();
    d.traced = make_traced_device(*d.sim, d.recorder);
  }
  return d;
}

// The world communicator; then what needs the world size: per-rank logging and the batch sizes.
std::unique_ptr<Communicator> make_run_communicator(TrainConfig& cfg, Device& device) {
  CommunicatorOptions copt;
  copt.order = cfg.strata.exact ? ReductionOrder::Deterministic : ReductionOrder::Fast;
  copt.mpi_on_cuda = cfg.strata.parallel.communicator == CommunicatorChoice::Mpi;
  if (cfg.strata.parallel.communicator == CommunicatorChoice::Nccl && device.kind() != DeviceKind::Cuda) {
    throw ConfigError(fmt::format("{}: strata.parallel.communicator \"nccl\" needs the cuda device, and this run is on "
                                  "{}; set it to \"auto\" or \"mpi\", or strata.device.kind to \"cuda\"",
                                  cfg.source, device.name()));
  }
  auto comm = make_world_communicator(device, copt);
  const int rank = comm->rank();
  const int world = comm->world_size();
  if (world > 1) {
    LogOptions log;
    log.rank = rank;
    log.world_size = world;
    log.level = spdlog::get_level();
    init_logging(log);
  }
  // The data-parallel ranks (the world less its tensor and pipeline splits; a layout that does not
  // divide the world is refused later, naming the keys).
  const int split = cfg.strata.parallel.tensor * cfg.strata.parallel.pipeline;
  const int data_world = world % split == 0 ? world / split : world;
  resolve_batch_sizes(cfg, data_world);
  if (rank == 0) {
    log_ignored_keys(cfg);
    log_resolved_auto(cfg);
  }
  return comm;
}

// Memory-centric tiling (models/tiling_plan.h), decided before the engine's plan.
models::TilingDecision decide_tiling(const TrainConfig& cfg, const models::ModelConfig& model, bool checkpointing,
                                     int world, int rank, std::size_t device_bytes, DeviceKind device) {
  models::TilingDecision tiling_plan = models::plan_tiling(cfg, model, checkpointing, world, device_bytes, device);
  if (rank == 0 && tiling_plan.automatic) {
    spdlog::info("the largest param group does not fit the device: tiling the blocks automatically");
  }
  if (rank == 0 && tiling_plan.spec.tiled()) spdlog::info("{}", tiling_plan.describe());
  return tiling_plan;
}

// `comm` is the data axis the engine shards over; `world_comm` every rank (all on this host).
// `stage` is the rank's pipeline stage: its stash and boundary buffers count as activations.
CheckedPlan plan_run(TrainConfig& cfg, const models::Decoder& decoder, const std::vector<ParamGroupSpec>& groups,
                     const models::PipelineStage& stage, Communicator& comm, Communicator& world_comm,
                     const Device& device, std::uint64_t device_bytes) {
  const int world = comm.world_size();
  const int node_ranks = world_comm.world_size();
  const bool reports = world_comm.rank() == 0;
  const std::int64_t micro = cfg.micro_batch_size, seq = cfg.strata.data.seq_len;
  const std::uint64_t activation_bytes =
      decoder.activation_bytes(micro, seq, /*training=*/true) +
      models::PipelineRunner::buffer_bytes(decoder, stage, cfg.strata.parallel.schedule, cfg.gradient_accumulation_steps,
                                           micro, seq);
  // Every rank plans with rank 0's view of host memory, so "auto" places the same chunks on every
  // rank and a refusal is the same everywhere.
  HostFacts host = measure_host(node_ranks, device.kind() == DeviceKind::Sim ? device.capacity_bytes() : 0);
  world_comm.broadcast_host_bytes(&host.mem_available, sizeof host.mem_available, 0);
  PlacedRun placed = place_run(cfg, groups, world, comm.rank(), node_ranks, activation_bytes, device_bytes, host);
  cfg = std::move(placed.config);
  const TierCapacities capacity = measure_capacities(placed.tiers, device_bytes, node_ranks);
  if (reports) spdlog::info("{}", describe_plan(placed.tiers, capacity));
  check_plan_fits(placed.tiers, capacity, cfg.source);
  return CheckedPlan{std::move(placed.run), std::move(placed.tiers)};
}

// Rank 0's line about the model, the stage and the batch shape, before the first step.
void log_run_shape(const TrainConfig& cfg, const models::ModelConfig& model, std::size_t n_groups,
                   const ParallelLayout& layout, const Device& device, const std::string& collectives) {
  const int world = layout.data();
  const std::int64_t micro = cfg.micro_batch_size;
  const std::int64_t seq = cfg.strata.data.seq_len;
  const int accumulation = cfg.gradient_accumulation_steps;
  const bool split = layout.tensor() > 1 || layout.pipeline() > 1;
  spdlog::info("model {} ({} arch): {:.2f}M parameters, {} groups; stage {}, {}, {} x {} x {} sequences of {} "
               "tokens per step; device {} capped at {}; collectives {}",
               model.name, models::architecture_name(model.arch), static_cast<double>(models::param_count(model)) / 1e6,
               n_groups, cfg.zero.stage, split ? layout.describe() : fmt::format("world {}", layout.world()), micro,
               accumulation, world, seq, device.name(), format_bytes(device.capacity_bytes()), collectives);
  if (layout.pipeline() > 1) {
    const std::vector<std::int64_t> b =
        models::pipeline_boundaries(model, layout.pipeline(), cfg.strata.parallel.pipeline_layers, cfg.source);
    const std::vector<std::int64_t> params = models::pipeline_stage_params(model, b);
    std::string stages;
    for (std::size_t p = 0; p + 1 < b.size(); ++p) {
      stages += fmt::format("{}{}: blocks {}..{} ({:.3g}M)", p == 0 ? "" : "; ", p, b[p], b[p + 1] - 1,
                            static_cast<double>(params[p]) / 1e6);
    }
    spdlog::info("pipeline of {} stages, {} schedule over {} micro-batches (ideal bubble {:.1f}%): {}", layout.pipeline(),
                 models::pipeline_schedule_name(cfg.strata.parallel.schedule), accumulation,
                 100.0 * models::pipeline_bubble_fraction(layout.pipeline(), accumulation), stages);
  }
}

}  // namespace

void TrainingRun::open_world() {
  cfg_ = load_run_config(options_);
  run_device_ = make_run_device(cfg_);
  device_ = run_device_.get();
  comm_ = make_run_communicator(cfg_, *device_);
  rank_ = comm_->rank();
  world_ = comm_->world_size();
  // From here to the first step, what one rank refuses stops every rank with one message: each
  // step that can fail on one rank alone is an agreed_startup_step (Note [Start-up refusals agreed] in
  // train/rank_agreement.h in train/rank_agreement.h).
  agreed_startup_step(*comm_, [&] { check_run_outputs(options_, cfg_, rank_, world_); });
  check_ranks_agree(*comm_, rank_identity(options_, cfg_));  // Note [Ranks agree] in train/rank_agreement.h
}

void TrainingRun::lay_out_model() {
  agreed_startup_step(*comm_, [&] {
    model_.emplace(training_model_config(cfg_, &checkpointing_));
    layout_.emplace(check_parallel_layout(cfg_, *model_, world_));
  });
  // Tensor parallelism (models/tensor_parallel.h): the decoder's collectives go over the tensor
  // group, the engine's (ZeRO) over the data group of the ranks holding the same slices; pipeline
  // parallelism (models/pipeline.h): the stages pass activations over the pipeline group.
  coords_ = layout_->coords(rank_);
  parallel_groups_ = split_parallel_groups(*comm_, *layout_, coords_);
  tensor_comm_ = parallel_groups_.tensor.get();
  pipeline_comm_ = parallel_groups_.pipeline.get();
  dcomm_ = parallel_groups_.data ? parallel_groups_.data.get() : comm_.get();
  tp_ = models::TensorParallel{layout_->tensor(), coords_.tensor, cfg_.strata.parallel.slices(), tensor_comm_,
                               cfg_.strata.parallel.sequence, /*ordered_norm_grads=*/cfg_.strata.exact};
  const std::vector<std::int64_t> stage_bounds =
      models::pipeline_boundaries(*model_, layout_->pipeline(), cfg_.strata.parallel.pipeline_layers, cfg_.source);
  stage_ = models::training_pipeline_stage(stage_bounds, coords_.pipeline, pipeline_comm_, cfg_.strata.parallel,
                                           cfg_.gradient_accumulation_steps);
  seq_ = cfg_.strata.data.seq_len;
  micro_ = cfg_.micro_batch_size;
  // What the plan may fill: the device less the compute stream's cuBLAS workspace (cuda).
  device_bytes_ = device_->capacity_bytes() - compute_stream_reserve_bytes(*device_);
}

void TrainingRun::build_decoder() {
  models::TilingDecision tiling_plan;
  if (!tp_.sliced()) {
    tiling_plan = decide_tiling(cfg_, *model_, checkpointing_, world_, rank_, device_bytes_, device_->kind());
  }
  models::DecoderOptions dopt(checkpointing_ ? models::Checkpointing::Blocks : models::Checkpointing::Off,
                              tiling_plan.spec);
  dopt.tensor = tp_;
  dopt.pipeline = stage_;
  decoder_.emplace(*model_, dopt);
  groups_ = decoder_->param_groups();
  seed_ = cfg_.strata.seed;
  // The initial weights: strata.init_weights, else a Hugging Face model folder's own (strata.model),
  // read tensor by tensor into their homes (models/weight_source.h).
  init_path_ = initial_weights_path(cfg_);
  agreed_startup_step(*comm_, [&] {
    if (!init_path_.empty()) init_file_.emplace(models::WeightSource::open(init_path_, *model_, "strata.init_weights"));
  });
  // A tensor rank's slice is cut from the whole tensor's initial values, so every T starts equal.
  tp_layout_ = models::tensor_parallel_layout(*model_, tp_.size, tp_.rank);
}

// The engine's initial values of tensor t of this stage's group g.
void TrainingRun::init_tensor(std::size_t g, std::size_t t, std::span<float> out) const {
  const bool sliced = tp_.size > 1;
  const std::size_t whole_g = decoder_->stage_groups()[g];  // its index among all groups
  const ParamTensorSpec& spec = sliced ? tp_layout_.whole[whole_g].tensors[t] : groups_[g].tensors[t];
  std::vector<float> whole(sliced ? spec.elems() : 0);
  const std::span<float> dest = sliced ? std::span<float>(whole) : out;
  if (init_file_) {
    models::read_init_tensor(*init_file_, *model_, spec, dest);  // names the file and tensor on a mismatch
  } else {
    models::init_tensor_gpt2_style(model_->n_layers, spec, seed_, dest);
  }
  if (sliced) models::cut_slice(spec, tp_layout_.slices[whole_g][t], whole, out);
}

void TrainingRun::plan_placement() {
  // Resolves the config's "auto" placement (cfg keeps the result: the engine is built with it).
  // Tensor ranks plan their own slices (with an uneven vocabulary they differ): a refusal on one is
  // agreed by all before the next collective.
  agreed_startup_step(*comm_, [&] {
    plan_.emplace(plan_run(cfg_, *decoder_, groups_, stage_, *dcomm_, *comm_, *device_, device_bytes_));
  });
  if ((tp_.size > 1 || stage_.split()) && !plan_->run.offload.swap_file_name.empty()) {
    plan_->run.offload.swap_file_name = swap_file_name(rank_);  // data ranks repeat across tensor and pipeline groups
  }
  agreed_startup_step(*comm_, [&] {
    data_.emplace(open_training_data(cfg_, *comm_, *model_));
    if (const std::string path = validation_path(cfg_, token_cache_dir(cfg_)); !path.empty()) {
      validation_.emplace(cfg_, *model_, path);
    }
  });
}

// Initial weights stream group by group into their homes: the import holds one group's staging
// and one tensor's read buffer, never the model (a model larger than host memory imports).
void TrainingRun::log_import() {
  if (!init_file_) return;
  std::uint64_t whole_tensor = 0;  // a tensor rank cuts its slice from the whole tensor
  if (tp_.size > 1) {
    for (const ParamGroupSpec& g : tp_layout_.whole) {
      for (const ParamTensorSpec& t : g.tensors) whole_tensor = std::max<std::uint64_t>(whole_tensor, t.elems() * 4);
    }
  }
  import_peak_ = init_staging_bytes(plan_->run) + init_file_->read_staging_bytes() + whole_tensor;
  if (rank_ == 0) {
    spdlog::info("initial weights: {} ({} file(s), {}), streamed group by group into their homes; peak host memory "
                 "of the import {} (one group's staging and one tensor's read buffer)",
                 init_path_, init_file_->files().size(), format_bytes(init_file_->file_bytes()),
                 format_bytes(import_peak_));
  }
}

void TrainingRun::build_engine() {
  log_import();
  const auto init = [this](std::size_t g, std::size_t t, std::span<float> out) { init_tensor(g, t, out); };
  agreed_startup_step(*comm_, [&] { engine_.emplace(cfg_, *device_, *dcomm_, groups_, init, std::move(plan_->run)); });
  std::vector<ZeroEngine::TensorShare> shares;
  for (std::size_t g : decoder_->stage_groups()) shares.push_back(tensor_share(tp_layout_, g, tp_.rank));
  engine_->set_tensor_group(tensor_comm_, shares);
  engine_->set_pipeline_group(pipeline_comm_);
  init_file_bytes_ = init_file_ ? init_file_->file_bytes() : 0;
  init_file_.reset();
}

void TrainingRun::resume_or_start() {
  checkpoints_.emplace(cfg_, *comm_, model_->name);
  TrainCheckpoints& checkpoints = *checkpoints_;
  checkpoints.on_checkpoint = options_.on_checkpoint;
  checkpoints.capture = options_.capture_checkpoints;
  checkpoints.tensor.size = tp_.size;
  checkpoints.tensor.rank = tp_.rank;
  checkpoints.tensor.slices = tp_.slices;
  if (stage_.split()) {  // a stage's groups sit at their places among the whole model's (checkpoint/checkpoint.h)
    checkpoints.tensor.stage_groups = decoder_->stage_groups();
    checkpoints.tensor.groups = decoder_->layout().groups.size();
  }
  // With tensor parallelism a reslicer reads this stage's slices (without it, tiles by name).
  stage_tp_layout_ = tp_.size > 1 ? stage_tensor_layout(tp_layout_, decoder_->stage_groups()) : tp_layout_;
  checkpoints.make_reslicer = [this](const CheckpointManifest& saved) -> CheckpointReslicer {
    auto reslicer =
        std::make_shared<TensorReslicer>(saved, *model_, groups_, tp_.size > 1 ? &stage_tp_layout_ : nullptr);
    return [reslicer](CheckpointReader& reader, std::size_t g, int a, std::size_t offset, std::span<float> out) {
      (*reslicer)(reader, g, a, offset, out);
    };
  };
  // What the run trains on: its checkpoints record it, a resume compares it (Note [Token cache identity] in
  // train/token_cache.h).
  agreed_startup_step(*comm_, [&] {
    if (rank_ == 0 && (checkpoints.enabled() || !options_.resume.empty())) {
      checkpoints.data_identity = token_data_identity(data_->path());
    }
  });
  checkpoints.allow_new_data = options_.allow_new_data;
  checkpoints.claim_directory(!options_.resume.empty());
  agreed_startup_step(*comm_, [&] {  // its collectives fail on every rank alike
    if (!options_.resume.empty()) first_step_ = checkpoints.resume(options_.resume, *engine_);
  });
}

void TrainingRun::prepare_steps() {
  if (rank_ == 0 && device_->kind() == DeviceKind::Cuda && cfg_.strata.device.compute_tflops > 0) {
    spdlog::warn("{}: strata.device.compute_tflops = {} models a sim device's compute speed; {} computes at its own "
                 "speed, so it is ignored (drop the key, or set strata.device.kind to \"sim\" to model it)",
                 cfg_.source, cfg_.strata.device.compute_tflops, device_->name());
  }
  compute_.emplace(*device_, "compute", cfg_.strata.device.compute_tflops * 1e12);  // Note [Modeled compute] in models/kernels/ops.h
  rt_.ctx = compute_->context();
  rt_.device = device_;
  sampler_.emplace(*data_, micro_, seq_, seed_);
  const int accumulation = cfg_.gradient_accumulation_steps;
  agreed_startup_step(*comm_, [&] {  // its buffers on the device
    if (stage_.split()) {
      pipeline_ = std::make_unique<models::PipelineRunner>(*decoder_, rt_, stage_, cfg_.strata.parallel.schedule,
                                                           accumulation, micro_, seq_);
    }
  });
  // The data axis: the ranks of a tensor group train on the same micro-batches.
  const std::int64_t units = static_cast<std::int64_t>(accumulation) * dcomm_->world_size();
  tokens_per_step_ = units * micro_ * seq_;
  agreed_startup_step(*comm_, [&] {
    reporter_.emplace(cfg_, options_.quiet, rank_, *engine_, tokens_per_step_, options_.resume, first_step_);
  });
  if (rank_ == 0) log_run_shape(cfg_, *model_, decoder_->layout().groups.size(), *layout_, *device_, comm_->backend());
  make_step_loop(units);
}

// `units`: the micro-batches of one step over the data axis.
void TrainingRun::make_step_loop(std::int64_t units) {
  const int accumulation = cfg_.gradient_accumulation_steps;
  const int data_world = dcomm_->world_size();
  const auto tokens = static_cast<std::size_t>(micro_ * seq_);
  loop_.emplace(StepLoop{.cfg = cfg_, .device = *device_, .comm = *dcomm_, .world_comm = *comm_, .engine = *engine_,
                         .decoder = *decoder_, .rt = rt_, .sampler = *sampler_, .checkpoints = *checkpoints_,
                         .reporter = *reporter_, .reports = rank_ == 0, .rank = dcomm_->rank(), .world = data_world,
                         .micro = micro_, .seq = seq_, .seed = seed_, .accumulation = accumulation, .units = units,
                         .tokens_per_step = tokens_per_step_, .masked = data_->has_loss_mask(),
                         .first_step = first_step_, .inputs = std::vector<std::int32_t>(tokens),
                         .targets = std::vector<std::int32_t>(tokens), .pipeline = pipeline_.get(),
                         .pipeline_comm = pipeline_comm_, .validation = validation_ ? &*validation_ : nullptr});
  drain_.emplace(compute_->stream());
}

void TrainingRun::train() {
  summary_.import_peak_host_bytes = import_peak_;
  summary_.import_bytes = init_file_bytes_;
  start_ = Clock::now();
  seconds_ = run_steps(*loop_, first_step_, summary_);
  reporter_->finish();
}

TrainSummary TrainingRun::finish() {
  total_summary(summary_, *loop_, seconds_, plan_->tiers, *model_, start_, first_step_);
  wear_summary(summary_, plan_->tiers, world_, options_.drive_tbw);
  const std::int64_t micro_batches = (summary_.steps - first_step_) * cfg_.gradient_accumulation_steps;
  tensor_summary(summary_, *parallel_groups_.tensor_counts,
                 models::tensor_parallel_traffic(*model_, tp_, micro_ * seq_, true, checkpointing_, &stage_), tp_.size,
                 micro_batches);
  if (pipeline_) {
    pipeline_summary(summary_, cfg_, *decoder_, stage_, *pipeline_, *parallel_groups_.pipeline_counts, micro_batches,
                     loop_->pipeline_busy_ms, loop_->pipeline_span_ms);
  }
  rank_summary(summary_, *comm_, coords_);
  compute_->stream().synchronize();
  if (!options_.save_weights.empty() && summary_.stopped_by_signal == 0) {
    save_weights(options_.save_weights, *model_, *engine_, *decoder_, tp_, stage_, rank_, coords_.data);
  }
  if (run_device_.recorder) {
    const std::string path = trace_path_of_rank(cfg_, rank_, world_);
    run_device_.recorder->write_chrome_trace(path, rank_);
    if (rank_ == 0) spdlog::info("wrote the timeline to {} (open it in chrome://tracing or ui.perfetto.dev)", path);
  }
  summary_.peak_rss_bytes = peak_rss_bytes();
  if (rank_ == 0 && !options_.summary_json.empty()) write_summary_json(options_.summary_json, summary_);
  if (rank_ == 0 && summary_.steps > 0) log_summary(summary_, *engine_, *device_);
  if (const std::optional<IoError>& failed = reporter_->metrics_failure()) {
    // Logged when it happened; the run's other outputs are written by now, and its exit code says it.
    throw IoError(fmt::format("{} (the training itself ran {} steps)", failed->what(), summary_.steps - first_step_),
                  failed->errno_value());
  }
  return std::move(summary_);
}

}  // namespace strata::train
