// The training loop (see train/trainer.h): set-up, the steps and the summary. Checkpoints, resume
// and stopping on a signal are in train/trainer_checkpoints.cc; what the user sees (progress,
// metrics, closing lines) in train/trainer_report.cc.
#include "train/trainer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/device/device.h"
#include "core/device/traced_device.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/log.h"
#include "core/units.h"
#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "config/json_input.h"
#include "config/lr_schedule.h"
#include "plan/parallel_layout.h"
#include "plan/run_plan.h"
#include "plan/tier_plan.h"
#include "engine/zero_engine.h"
#include "models/decoder.h"
#include "models/hf_config.h"
#include "models/weight_source.h"
#include "models/hf_names.h"
#include "models/model_config.h"
#include "models/param_init.h"
#include "models/pipeline.h"
#include "models/pipeline_runner.h"
#include "models/safetensors.h"
#include "models/tensor_parallel.h"
#include "models/tiling.h"
#include "models/tiling_plan.h"
#include "models/token_data.h"
#include "models/weights_io.h"
#include "train/checkpoint_tensors.h"
#include "train/compute_device.h"
#include "train/demo_config.h"  // generated from configs/demo.json (train/CMakeLists.txt)
#include "train/output_file.h"
#include "train/rank_agreement.h"
#include "train/run_paths.h"
#include "train/token_cache.h"
#include "train/trainer_parallel.h"
#include "train/trainer_checkpoints.h"
#include "train/trainer_data.h"
#include "train/step_loop.h"
#include "train/trainer_report.h"
#include "train/trainer_validation.h"

namespace strata::train {
namespace {

}  // namespace

std::vector<std::string> config_fragment_overrides(const std::string& path) {
  const std::string text = read_text_file(path, "--config-fragment");
  JsonInputError error;
  const std::optional<nlohmann::json> doc = parse_json_input(text, JsonComments::Allow, &error);
  if (!doc) {
    throw ConfigError(fmt::format("--config-fragment {}: not JSON ({}{}); it holds an object of config sections, as "
                                  "`strata bench io --tune --out` writes",
                                  path, error.message, json_error_place(text, error).empty() ? "" : ", " + json_error_place(text, error)));
  }
  if (!doc->is_object()) throw ConfigError(fmt::format("--config-fragment {}: expected a JSON object of config sections", path));
  std::vector<std::string> out;
  const auto flatten = [&](const auto& self, const nlohmann::json& v, const std::string& key) -> void {
    if (v.is_object() && !v.empty()) {
      for (const auto& [k, child] : v.items()) self(self, child, key.empty() ? k : key + "." + k);
    } else {
      out.push_back(key + "=" + v.dump());
    }
  };
  flatten(flatten, *doc, "");
  return out;
}

TrainConfig load_train_config_or_demo(const std::string& path, const std::vector<std::string>& overrides) {
  if (!path.empty()) return load_train_config(path, overrides);
  return load_train_config_text(kDemoConfigJson, "configs/demo.json (built in)", overrides);
}

std::string initial_weights_path(const TrainConfig& cfg) {
  if (!cfg.strata.init_weights.empty()) return cfg.strata.init_weights;
  if (cfg.strata.model.is_string() && models::is_hf_model_folder(cfg.strata.model.get<std::string>())) {
    return cfg.strata.model.get<std::string>();
  }
  return {};
}

models::ModelConfig training_model_config(const TrainConfig& cfg, bool* checkpointing) {
  *checkpointing = false;
  models::ModelConfig m;
  if (cfg.strata.model.is_string() && models::is_hf_model_folder(cfg.strata.model.get<std::string>())) {
    const models::HfModelFolder folder = models::open_hf_model_folder(cfg.strata.model.get<std::string>());
    m = folder.config;
    static bool said = false;  // estimate and train may both read the model: say it once
    for (const std::string& note : folder.notes) {
      if (!said) spdlog::warn("{}", note);
    }
    said = true;
  } else if (cfg.strata.model.is_string()) {
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

// ---- The parts of run_training, in the order it calls them ------------------------------------

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

// The device the run computes on. With strata.trace, every stream records a timeline
// (core/device/traced_device.h) through a traced wrapper of the sim device.
struct RunDevice {
  std::unique_ptr<Device> sim;
  std::shared_ptr<TraceRecorder> recorder;  // null without strata.trace
  std::unique_ptr<Device> traced;
  Device* get() const { return traced ? traced.get() : sim.get(); }
};

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

// The run plan (where everything lives) and its bytes per tier, before any work: a config that
// cannot fit is refused with the numbers.
struct CheckedPlan {
  RunPlan run;      // moved into the engine
  TierPlan tiers;
};

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

TrainSummary run_training(const TrainOptions& options) {
  TrainConfig cfg = load_run_config(options);
  const RunDevice run_device = make_run_device(cfg);
  Device* device = run_device.get();
  auto comm = make_run_communicator(cfg, *device);
  const int rank = comm->rank();
  const int world = comm->world_size();
  // From here to the first step, what one rank refuses stops every rank with one message: each
  // step that can fail on one rank alone is an agreed_startup_step (Note [Start-up refusals agreed]
  // in train/rank_agreement.h).
  agreed_startup_step(*comm, [&] { check_run_outputs(options, cfg, rank, world); });
  check_ranks_agree(*comm, rank_identity(options, cfg));  // Note [Ranks agree]

  bool checkpointing = false;
  std::optional<models::ModelConfig> model_slot;  // a model folder is read by every rank
  std::optional<ParallelLayout> layout_slot;
  agreed_startup_step(*comm, [&] {
    model_slot.emplace(training_model_config(cfg, &checkpointing));
    layout_slot.emplace(check_parallel_layout(cfg, *model_slot, world));
  });
  const models::ModelConfig& model = *model_slot;
  const ParallelLayout& layout = *layout_slot;
  // Tensor parallelism (models/tensor_parallel.h): the decoder's collectives go over the tensor
  // group, the engine's (ZeRO) over the data group of the ranks holding the same slices; pipeline
  // parallelism (models/pipeline.h): the stages pass activations over the pipeline group.
  const RankCoords coords = layout.coords(rank);
  const ParallelGroups parallel_groups = split_parallel_groups(*comm, layout, coords);
  Communicator* tensor_comm = parallel_groups.tensor.get();
  Communicator* pipeline_comm = parallel_groups.pipeline.get();
  Communicator& dcomm = parallel_groups.data ? *parallel_groups.data : *comm;
  const models::TensorParallel tp{layout.tensor(), coords.tensor, cfg.strata.parallel.slices(), tensor_comm,
                                  cfg.strata.parallel.sequence, /*ordered_norm_grads=*/cfg.strata.exact};
  const std::vector<std::int64_t> stage_bounds =
      models::pipeline_boundaries(model, layout.pipeline(), cfg.strata.parallel.pipeline_layers, cfg.source);
  const models::PipelineStage stage = models::training_pipeline_stage(
      stage_bounds, coords.pipeline, pipeline_comm, cfg.strata.parallel, cfg.gradient_accumulation_steps);
  const std::int64_t seq = cfg.strata.data.seq_len;
  const std::int64_t micro = cfg.micro_batch_size;
  // What the plan may fill: the device less the compute stream's cuBLAS workspace (cuda).
  const std::uint64_t device_bytes = device->capacity_bytes() - compute_stream_reserve_bytes(*device);
  models::TilingDecision tiling_plan;
  if (!tp.sliced()) tiling_plan = decide_tiling(cfg, model, checkpointing, world, rank, device_bytes, device->kind());
  models::DecoderOptions dopt(checkpointing ? models::Checkpointing::Blocks : models::Checkpointing::Off, tiling_plan.spec);
  dopt.tensor = tp;
  dopt.pipeline = stage;
  models::Decoder decoder(model, dopt);
  const auto groups = decoder.param_groups();  // this stage's
  const std::vector<std::size_t>& stage_groups = decoder.stage_groups();  // their indices among all groups
  const std::uint64_t seed = cfg.strata.seed;
  // The initial weights: strata.init_weights, else a Hugging Face model folder's own (strata.model),
  // read tensor by tensor into their homes (models/weight_source.h).
  std::optional<models::WeightSource> init_file;
  const std::string init_path = initial_weights_path(cfg);
  agreed_startup_step(*comm, [&] {
    if (!init_path.empty()) init_file.emplace(models::WeightSource::open(init_path, model, "strata.init_weights"));
  });
  // A tensor rank's slice is cut from the whole tensor's initial values, so every T starts equal.
  const models::TensorParallelLayout tp_layout = models::tensor_parallel_layout(model, tp.size, tp.rank);
  const auto init = [&](std::size_t g, std::size_t t, std::span<float> out) {
    const bool sliced = tp.size > 1;
    const std::size_t whole_g = stage_groups[g];
    const ParamTensorSpec& spec = sliced ? tp_layout.whole[whole_g].tensors[t] : groups[g].tensors[t];
    std::vector<float> whole(sliced ? spec.elems() : 0);
    const std::span<float> dest = sliced ? std::span<float>(whole) : out;
    if (init_file) {
      models::read_init_tensor(*init_file, model, spec, dest);  // names the file and tensor on a mismatch
    } else {
      models::init_tensor_gpt2_style(model.n_layers, spec, seed, dest);
    }
    if (sliced) models::cut_slice(spec, tp_layout.slices[whole_g][t], whole, out);
  };
  // Resolves the config's "auto" placement (cfg keeps the result: the engine is built with it).
  // Tensor ranks plan their own slices (with an uneven vocabulary they differ): a refusal on one is
  // agreed by all before the next collective.
  std::optional<CheckedPlan> planned;
  agreed_startup_step(*comm, [&] {
    planned.emplace(plan_run(cfg, decoder, groups, stage, dcomm, *comm, *device, device_bytes));
  });
  CheckedPlan plan = std::move(*planned);
  if ((tp.size > 1 || stage.split()) && !plan.run.offload.swap_file_name.empty()) {
    plan.run.offload.swap_file_name = swap_file_name(rank);  // data ranks repeat across tensor and pipeline groups
  }
  std::optional<models::TokenFile> data_slot;  // every rank opens its data and validation files
  std::optional<ValidationSet> validation;
  agreed_startup_step(*comm, [&] {
    data_slot.emplace(open_training_data(cfg, *comm, model));
    if (const std::string path = validation_path(cfg, token_cache_dir(cfg)); !path.empty()) {
      validation.emplace(cfg, model, path);
    }
  });
  models::TokenFile& data = *data_slot;

  // Initial weights stream group by group into their homes: the import holds one group's staging
  // and one tensor's read buffer, never the model (a model larger than host memory imports).
  std::uint64_t import_peak = 0;
  if (init_file) {
    std::uint64_t whole_tensor = 0;  // a tensor rank cuts its slice from the whole tensor
    if (tp.size > 1) {
      for (const ParamGroupSpec& g : tp_layout.whole) {
        for (const ParamTensorSpec& t : g.tensors) whole_tensor = std::max<std::uint64_t>(whole_tensor, t.elems() * 4);
      }
    }
    import_peak = init_staging_bytes(plan.run) + init_file->read_staging_bytes() + whole_tensor;
    if (rank == 0) {
      spdlog::info("initial weights: {} ({} file(s), {}), streamed group by group into their homes; peak host memory "
                   "of the import {} (one group's staging and one tensor's read buffer)",
                   init_path, init_file->files().size(), format_bytes(init_file->file_bytes()), format_bytes(import_peak));
    }
  }
  std::optional<ZeroEngine> engine_slot;  // every rank opens its swap files and takes their locks
  agreed_startup_step(*comm, [&] { engine_slot.emplace(cfg, *device, dcomm, groups, init, std::move(plan.run)); });
  ZeroEngine& engine = *engine_slot;
  std::vector<ZeroEngine::TensorShare> shares;
  for (std::size_t g : stage_groups) shares.push_back(tensor_share(tp_layout, g, tp.rank));
  engine.set_tensor_group(tensor_comm, shares);
  engine.set_pipeline_group(pipeline_comm);
  const std::uint64_t init_file_bytes = init_file ? init_file->file_bytes() : 0;
  init_file.reset();
  TrainCheckpoints checkpoints(cfg, *comm, model.name);
  checkpoints.on_checkpoint = options.on_checkpoint;
  checkpoints.capture = options.capture_checkpoints;
  checkpoints.tensor.size = tp.size;
  checkpoints.tensor.rank = tp.rank;
  checkpoints.tensor.slices = tp.slices;
  if (stage.split()) {  // a stage's groups sit at their places among the whole model's (checkpoint/checkpoint.h)
    checkpoints.tensor.stage_groups = stage_groups;
    checkpoints.tensor.groups = decoder.layout().groups.size();
  }
  // With tensor parallelism a reslicer reads this stage's slices (without it, tiles by name).
  const models::TensorParallelLayout stage_tp_layout =
      tp.size > 1 ? stage_tensor_layout(tp_layout, stage_groups) : tp_layout;
  checkpoints.make_reslicer = [&](const CheckpointManifest& saved) -> CheckpointReslicer {
    auto reslicer = std::make_shared<TensorReslicer>(saved, model, groups, tp.size > 1 ? &stage_tp_layout : nullptr);
    return [reslicer](CheckpointReader& reader, std::size_t g, int a, std::size_t offset, std::span<float> out) {
      (*reslicer)(reader, g, a, offset, out);
    };
  };
  // What the run trains on: its checkpoints record it, a resume compares it (Note [Token cache identity]).
  agreed_startup_step(*comm, [&] {
    if (rank == 0 && (checkpoints.enabled() || !options.resume.empty())) {
      checkpoints.data_identity = token_data_identity(data.path());
    }
  });
  checkpoints.allow_new_data = options.allow_new_data;
  checkpoints.claim_directory(!options.resume.empty());
  std::int64_t first_step = 0;
  agreed_startup_step(*comm, [&] {  // its collectives fail on every rank alike
    if (!options.resume.empty()) first_step = checkpoints.resume(options.resume, engine);
  });

  if (rank == 0 && device->kind() == DeviceKind::Cuda && cfg.strata.device.compute_tflops > 0) {
    spdlog::warn("{}: strata.device.compute_tflops = {} models a sim device's compute speed; {} computes at its own "
                 "speed, so it is ignored (drop the key, or set strata.device.kind to \"sim\" to model it)",
                 cfg.source, cfg.strata.device.compute_tflops, device->name());
  }
  ComputeStream compute(*device, "compute", cfg.strata.device.compute_tflops * 1e12);  // Note [Modeled compute]
  Stream* stream = &compute.stream();
  models::DecoderRuntime rt;
  rt.ctx = compute.context();
  rt.device = device;

  models::BatchSampler sampler(data, micro, seq, seed);
  const int accumulation = cfg.gradient_accumulation_steps;
  std::unique_ptr<models::PipelineRunner> pipeline;
  agreed_startup_step(*comm, [&] {  // its buffers on the device
    if (stage.split()) {
      pipeline = std::make_unique<models::PipelineRunner>(decoder, rt, stage, cfg.strata.parallel.schedule,
                                                          accumulation, micro, seq);
    }
  });
  // The data axis: the ranks of a tensor group train on the same micro-batches.
  const int data_world = dcomm.world_size();
  const std::int64_t units = static_cast<std::int64_t>(accumulation) * data_world;
  const std::int64_t tokens_per_step = units * micro * seq;
  std::optional<StepReporter> reporter_slot;  // rank 0 takes the metrics lock
  agreed_startup_step(*comm, [&] {
    reporter_slot.emplace(cfg, options.quiet, rank, engine, tokens_per_step, options.resume, first_step);
  });
  StepReporter& reporter = *reporter_slot;
  if (rank == 0) log_run_shape(cfg, model, decoder.layout().groups.size(), layout, *device, comm->backend());
  StepLoop loop{.cfg = cfg, .device = *device, .comm = dcomm, .world_comm = *comm, .engine = engine, .decoder = decoder, .rt = rt,
                .sampler = sampler, .checkpoints = checkpoints, .reporter = reporter, .reports = rank == 0,
                .rank = dcomm.rank(), .world = data_world, .micro = micro, .seq = seq, .seed = seed,
                .accumulation = accumulation,
                .units = units, .tokens_per_step = tokens_per_step, .masked = data.has_loss_mask(), .first_step = first_step,
                .inputs = std::vector<std::int32_t>(static_cast<std::size_t>(micro * seq)),
                .targets = std::vector<std::int32_t>(static_cast<std::size_t>(micro * seq)),
                .pipeline = pipeline.get(), .pipeline_comm = pipeline_comm,
                .validation = validation ? &*validation : nullptr};
  // On an exception the compute stream may still hold work that reads the loop's token arrays and
  // the pipeline runner's buffers: it finishes before they are destroyed (an out-of-memory error
  // in the engine's step crashed here on the unwinding).
  const StreamDrain drain(*stream);

  TrainSummary summary;
  summary.import_peak_host_bytes = import_peak;
  summary.import_bytes = init_file_bytes;
  const auto start = Clock::now();
  const LoopSeconds seconds = run_steps(loop, first_step, summary);
  reporter.finish();
  total_summary(summary, loop, seconds, plan.tiers, model, start, first_step);
  wear_summary(summary, plan.tiers, world, options.drive_tbw);
  tensor_summary(summary, *parallel_groups.tensor_counts, models::tensor_parallel_traffic(model, tp, micro * seq, true, checkpointing, &stage),
                 tp.size, (summary.steps - first_step) * accumulation);
  if (pipeline) {
    pipeline_summary(summary, cfg, decoder, stage, *pipeline, *parallel_groups.pipeline_counts, (summary.steps - first_step) * accumulation,
                     loop.pipeline_busy_ms, loop.pipeline_span_ms);
  }
  rank_summary(summary, *comm, coords);
  stream->synchronize();
  if (!options.save_weights.empty() && summary.stopped_by_signal == 0) {
    save_weights(options.save_weights, model, engine, decoder, tp, stage, rank, coords.data);
  }
  if (run_device.recorder) {
    const std::string path = trace_path_of_rank(cfg, rank, world);
    run_device.recorder->write_chrome_trace(path, rank);
    if (rank == 0) spdlog::info("wrote the timeline to {} (open it in chrome://tracing or ui.perfetto.dev)", path);
  }
  summary.peak_rss_bytes = peak_rss_bytes();
  if (rank == 0 && !options.summary_json.empty()) write_summary_json(options.summary_json, summary);
  if (rank == 0 && summary.steps > 0) log_summary(summary, engine, *device);
  if (const std::optional<IoError>& failed = reporter.metrics_failure()) {
    // Logged when it happened; the run's other outputs are written by now, and its exit code says it.
    throw IoError(fmt::format("{} (the training itself ran {} steps)", failed->what(), summary.steps - first_step),
                  failed->errno_value());
  }
  return summary;
}

}  // namespace strata::train
