// The device a command computes on (train/compute_device.h).
#include "train/compute_device.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <initializer_list>
#include <mutex>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/units.h"
#include "engine/zero_engine.h"
#include "models/kernels/cuda_kernels.h"

namespace strata::train {
namespace {

// The first of the launcher's variables that holds a whole number in [0, 2^20), else `fallback`.
int launcher_number(std::initializer_list<const char*> names, int fallback) {
  for (const char* name : names) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    if (end != nullptr && *end == '\0' && r >= 0 && r < (1L << 20)) return static_cast<int>(r);
  }
  return fallback;
}

// This process's rank among the ranks on its node, and how many there are (0 and 1 alone), as the
// launcher sets them for the processes it starts.
int local_rank() { return launcher_number({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"}, 0); }
int local_size() { return launcher_number({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"}, 1); }

// More ranks on the node than GPUs this process can see. With CUDA_VISIBLE_DEVICES set, a launcher
// may give each rank a GPU of its own that only it sees: nothing can be told, so nothing is refused.
bool ranks_share_gpus(std::size_t gpus) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible != nullptr && *visible != '\0') return false;
  return local_size() > static_cast<int>(gpus);
}

}  // namespace

DeviceChoice parse_device_flag(const std::string& value) {
  if (value == "sim") return DeviceChoice::Sim;
  if (value == "cuda") return DeviceChoice::Cuda;
  if (value == "auto") return DeviceChoice::Auto;
  throw ConfigError(fmt::format("--device '{}' is not one of sim, cuda, auto", value));
}

DeviceKind resolve_device_kind(DeviceChoice choice, const DeviceChoiceSource& source, std::string* why_not_cuda) {
  if (choice == DeviceChoice::Sim) return DeviceKind::Sim;
  std::string why;
  const std::vector<CudaDeviceInfo> gpus = list_cuda_devices(&why);
  if (gpus.empty()) {
    if (choice == DeviceChoice::Cuda) {
      throw ConfigError(fmt::format("{}: {} is \"cuda\", but no cuda device is usable here ({}); set {} to \"sim\", "
                                    "or to \"auto\" to take a GPU when there is one",
                                    source.where, source.knob, why, source.knob));
    }
    if (why_not_cuda != nullptr) *why_not_cuda = why;
    return DeviceKind::Sim;
  }
  if (!source.ranks_may_share_gpus && ranks_share_gpus(gpus.size())) {
    if (choice == DeviceChoice::Cuda) {
      throw ConfigError(fmt::format("{}: {} ranks on this node but {} GPU(s): each rank needs a GPU of its own on cuda "
                                    "(NCCL cannot put two ranks of one communicator on one GPU); start at most {} "
                                    "rank(s) per node, give each rank its GPU with CUDA_VISIBLE_DEVICES, set "
                                    "strata.parallel.communicator to \"mpi\" (slow: for checking multi-rank runs on "
                                    "one GPU), or set {} to \"sim\"",
                                    source.where, local_size(), gpus.size(), gpus.size(), source.knob));
    }
    if (why_not_cuda != nullptr) {
      *why_not_cuda = fmt::format("{} ranks on this node but {} GPU(s); each rank needs a GPU of its own", local_size(),
                                  gpus.size());
    }
    return DeviceKind::Sim;
  }
  if (why_not_cuda != nullptr) why_not_cuda->clear();
  return DeviceKind::Cuda;
}

std::unique_ptr<Device> open_compute_device(DeviceChoice choice, std::uint64_t cuda_cap_bytes,
                                            const SimDeviceOptions& sim, const DeviceChoiceSource& source) {
  std::string why;
  const DeviceKind kind = resolve_device_kind(choice, source, &why);
  if (kind == DeviceKind::Sim) {
    if (choice == DeviceChoice::Auto) {
      spdlog::info("{} auto: the sim device ({}; no cuda device for this rank: {})", source.knob,
                   format_bytes(sim.capacity_bytes), why);
    }
    return make_sim_device(sim);
  }
  const std::vector<CudaDeviceInfo> gpus = list_cuda_devices();
  CudaDeviceOptions o;
  o.ordinal = gpus[static_cast<std::size_t>(local_rank()) % gpus.size()].ordinal;
  o.memory_limit_bytes = cuda_cap_bytes;
  std::unique_ptr<Device> device;
  try {
    device = make_cuda_device(o);
  } catch (const ConfigError& e) {  // a cap over the GPU's memory: name the config too
    throw ConfigError(fmt::format("{}: {}", source.where, e.what()));
  }
  if (choice == DeviceChoice::Auto) {
    spdlog::info("{} auto: {} ({} usable{})", source.knob, device->name(), format_bytes(device->capacity_bytes()),
                 cuda_cap_bytes > 0 ? ", capped by strata.device.memory" : "");
  }
  return device;
}

DeviceChoiceSource training_device_source(const TrainConfig& cfg) {
  DeviceChoiceSource source{cfg.source};
  source.ranks_may_share_gpus = cfg.strata.parallel.communicator == CommunicatorChoice::Mpi;
  return source;
}

bool cuda_parallel_opted_in() {
  const char* v = std::getenv("STRATA_CUDA_PARALLEL");
  return v != nullptr && std::string_view(v) == "1";
}

DeviceChoice training_device_choice(const TrainConfig& cfg) {
  const ParallelConfig& par = cfg.strata.parallel;
  const bool split = par.tensor > 1 || par.pipeline > 1 || par.slices() > 1;
  if (cfg.strata.device.kind == DeviceChoice::Auto && split) {
    spdlog::info("strata.device.kind auto: the sim device (tensor slices, tensor and pipeline parallelism run on sim "
                 "only)");
    return DeviceChoice::Sim;
  }
  // Offload has not run correctly on a GPU yet (the engine refuses it there: engine/zero_engine.cc),
  // so auto takes sim for a config that asks for it, unless STRATA_CUDA_OFFLOAD=1 opts in.
  auto asks = [](OffloadDevice d) { return d == OffloadDevice::Cpu || d == OffloadDevice::Nvme; };
  if (cfg.strata.device.kind == DeviceChoice::Auto &&
      (asks(cfg.zero.offload_optimizer.device) || asks(cfg.zero.offload_param.device)) && !cuda_offload_opted_in()) {
    spdlog::info("strata.device.kind auto: the sim device (offload to host memory or NVMe does not run correctly on "
                 "a GPU yet)");
    return DeviceChoice::Sim;
  }
  if (split && resolve_device_kind(cfg.strata.device.kind, training_device_source(cfg)) == DeviceKind::Cuda) {
    if (cuda_parallel_opted_in()) {
      static std::once_flag warned;  // the choice is made more than once per command
      std::call_once(warned, [&] {
        spdlog::warn("STRATA_CUDA_PARALLEL=1: strata.parallel.tensor = {}, tensor_slices = {} and pipeline = {} on "
                     "cuda, which has not run on a GPU yet",
                     par.tensor, par.slices(), par.pipeline);
      });
      return cfg.strata.device.kind;
    }
    throw ConfigError(fmt::format("{}: strata.parallel.tensor = {}, tensor_slices = {} and pipeline = {} on a cuda "
                                  "device: tensor and pipeline parallelism run on the sim device only in this version "
                                  "(they have not run on a GPU yet: README, \"How the CUDA path is verified\"); set "
                                  "strata.device.kind to \"sim\", or tensor, tensor_slices and pipeline to 1",
                                  cfg.source, par.tensor, par.slices(), par.pipeline));
  }
  return cfg.strata.device.kind;
}

std::unique_ptr<Device> open_training_device(const TrainConfig& cfg) {
  const DeviceConfig& d = cfg.strata.device;
  SimDeviceOptions o;
  o.capacity_bytes = d.memory_bytes > 0 ? d.memory_bytes : std::size_t{1} << 30;
  o.h2d_gbps = d.h2d_gbps;
  o.d2h_gbps = d.d2h_gbps;
  o.latency_us = d.latency_us;
  o.chaos_seed = d.chaos_seed;
  std::unique_ptr<Device> device =
      open_compute_device(training_device_choice(cfg), d.memory_bytes, o, training_device_source(cfg));
  if (d.chaos_seed != 0) {  // a test mode, slower by design (Note [Schedule chaos] in core/device/schedule_chaos.h)
    spdlog::warn("strata.device.chaos = {}: {} start after random pauses, to try rare orders; slower by design, "
                 "for testing",
                 d.chaos_seed,
                 device->kind() == DeviceKind::Sim ? "every stream task and offload host task"
                                                   : "offload host tasks (a cuda device's streams are not paused)");
  }
  return device;
}

std::size_t compute_stream_reserve_bytes(const Device& device) {
  if (device.kind() != DeviceKind::Cuda) return 0;
  const std::size_t capacity = device.capacity_bytes();
  if (capacity >= (std::size_t{2} << 30)) return models::CublasHandles::kDefaultWorkspaceBytes;
  return capacity / 64 / 256 * 256;  // a small workspace (or none): cuBLAS picks kernels that fit it
}

ComputeStream::ComputeStream(Device& device, const std::string& name, double modeled_flops_per_s)
    : stream_(device.create_stream(name)) {
  ctx_.kind = device.kind();
  ctx_.stream = stream_.get();
  if (ctx_.kind == DeviceKind::Cuda) {
    cublas_ = std::make_unique<models::CublasHandles>(device, *stream_, compute_stream_reserve_bytes(device));
    ctx_.cublas = cublas_.get();
  } else {
    ctx_.modeled_flops_per_s = modeled_flops_per_s;
  }
}

ComputeStream::~ComputeStream() {
  // Work still queued may use the handle's workspace: finish it before the handle goes.
  try {
    if (stream_) stream_->synchronize();
  } catch (const std::exception& e) {
    spdlog::error("compute stream '{}' failed while finishing: {}", stream_->name(), e.what());
  }
}

}  // namespace strata::train
