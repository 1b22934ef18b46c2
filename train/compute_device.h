// The device a command computes on, and its compute stream: strata.device.kind = sim | cuda | auto
// (cuda when one is usable, else sim, saying which). Shared by train, eval, bench model and bench
// step, so all four choose alike and refuse alike.
//
// On cuda the compute stream carries the cuBLAS handle the model's matmuls need
// (models::CublasHandles, bound to that stream); on sim it has none and the op set runs its CPU
// kernels on the stream's worker.
#pragma once

#include <memory>
#include <string>

#include "core/device/device.h"
#include "config/config.h"
#include "models/kernels/ops.h"

namespace strata::train {

// A command's --device flag: "sim", "cuda" or "auto"; anything else is a ConfigError naming it.
DeviceChoice parse_device_flag(const std::string& value);

// Where a device choice came from, for messages: the config file (or command) and the key or flag.
struct DeviceChoiceSource {
  std::string where;                        // "configs/tiny.json (with --set)", "strata bench model"
  std::string knob = "strata.device.kind";  // or "--device"
  // The ranks talk over staged MPI (strata.parallel.communicator "mpi", Note [Staged MPI] in comm/comm_staged.cc), so
  // several may share a GPU.
  bool ranks_may_share_gpus = false;
};

// Which backend a choice resolves to for this process (open_compute_device opens that one). Auto:
// cuda when a GPU is usable and the node's ranks do not outnumber its GPUs, else sim, with the
// reason in `why_not_cuda` (empty for cuda). Cuda where no GPU is usable, or with more ranks on the
// node than GPUs (unless CUDA_VISIBLE_DEVICES hands GPUs out per rank, or the ranks may share them),
// is a ConfigError naming the source and the knob, before any work starts.
DeviceKind resolve_device_kind(DeviceChoice choice, const DeviceChoiceSource& source,
                               std::string* why_not_cuda = nullptr);

// Opens the device `choice` resolves to. On cuda: the GPU of this process's local rank (the local
// rank modulo the visible GPUs, from mpirun's or the launcher's environment), capped at
// `cuda_cap_bytes` (0: all its free memory; a cap over the GPU's memory is a ConfigError). On sim:
// `sim` as given. With auto, logs which one it chose and why.
std::unique_ptr<Device> open_compute_device(DeviceChoice choice, std::uint64_t cuda_cap_bytes,
                                            const SimDeviceOptions& sim, const DeviceChoiceSource& source);

// Where a training config's device choice comes from: its source, strata.device.kind, and whether
// its ranks may share a GPU (strata.parallel.communicator "mpi").
DeviceChoiceSource training_device_source(const TrainConfig& cfg);

// A training config's device choice: strata.device.kind, except that auto takes the sim device
// for tensor or pipeline parallelism (sim only in this version, saying so), and cuda with them is
// a ConfigError naming the keys (STRATA_CUDA_PARALLEL=1 runs them on cuda anyway, for the GPU tests);
// auto also takes sim for a config that offloads to cpu or nvme (the engine refuses offload on cuda
// until it has run correctly there; STRATA_CUDA_OFFLOAD=1 opts in). Every command that computes a
// config's steps chooses through it.
DeviceChoice training_device_choice(const TrainConfig& cfg);

// STRATA_CUDA_PARALLEL=1: tensor and pipeline parallelism on cuda, which have not run on a GPU.
bool cuda_parallel_opted_in();

// The device of a training run: training_device_choice opened with the config's strata.device
// (sim: its capacity, default 1 GiB, and modeled link; cuda: strata.device.memory as the cap).
std::unique_ptr<Device> open_training_device(const TrainConfig& cfg);

// Device memory a ComputeStream takes on `device` beyond what the run plans: the cuBLAS workspace
// on cuda (32 MiB, or capacity / 64 on a device capped under 2 GiB, in 256-byte units), 0 on sim.
// Planners subtract it from the capacity they fill.
std::size_t compute_stream_reserve_bytes(const Device& device);

// A device's compute stream and the kernel context the op set is called with on it.
class ComputeStream {
 public:
  // modeled_flops_per_s: Note [Modeled compute] (models/kernels/ops.h), sim only; ignored on cuda.
  ComputeStream(Device& device, const std::string& name, double modeled_flops_per_s = 0);
  ~ComputeStream();
  ComputeStream(const ComputeStream&) = delete;
  ComputeStream& operator=(const ComputeStream&) = delete;

  Stream& stream() { return *stream_; }
  const models::KernelContext& context() const { return ctx_; }

 private:
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<models::CublasHandles> cublas_;  // cuda only
  models::KernelContext ctx_;
};

}  // namespace strata::train
