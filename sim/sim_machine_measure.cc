// The sim device's machine, measured on this host (sim/sim_machine_measure.h).
#include "sim/sim_machine_measure.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/device/device.h"
#include "core/device/sim_kernel.h"
#include "core/file_io.h"
#include "core/host_buffer.h"
#include "plan/tier_plan.h"
#include "models/decoder.h"
#include "models/resident_provider.h"
#include "models/sgemm_yardstick.h"
#include "optim/adam_yardstick.h"
#include "plan/bench_disk.h"
#include "train/trainer.h"

namespace strata::sim {
namespace {

// The fastest of `reps` timed calls of `fn` after one untimed call: on a shared machine the least
// disturbed one is the figure (other work only ever adds time).
double fastest_call_seconds(const std::function<void()>& fn, int reps) {
  fn();
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = r == 0 ? t : std::min(best, t);
  }
  return best;
}

// One micro-batch's forward+backward of `model` cut to `layers` blocks, on a sim device with every
// parameter resident: what the engine's compute stream runs, without the engine.
class DecoderRun {
 public:
  DecoderRun(const TrainConfig& cfg, models::ModelConfig model, bool checkpointing, std::int64_t layers)
      : batch_(cfg.micro_batch_size), seq_(cfg.strata.data.seq_len) {
    model.n_layers = layers;
    decoder_ = std::make_unique<models::Decoder>(
        model, models::DecoderOptions(checkpointing ? models::Checkpointing::Blocks : models::Checkpointing::Off));
    const std::vector<ParamGroupSpec> groups = decoder_->param_groups();
    std::size_t param_bytes = 0;
    for (const ParamGroupSpec& g : groups) param_bytes += 2 * (g.bytes() + 256 * g.tensors.size());
    SimDeviceOptions o;
    o.capacity_bytes = param_bytes + decoder_->activation_bytes(batch_, seq_, true) + (64u << 20);
    o.capacity_knob = "strata simulate --machine measure (the config's micro-batch)";
    device_ = make_sim_device(o);
    stream_ = device_->create_stream("compute");
    params_ = std::make_unique<models::ResidentParamProvider>(groups, device_.get());
    params_->init_gpt2_style(cfg.strata.seed, layers, stream_.get());
    tokens_.resize(static_cast<std::size_t>(batch_ * seq_));
    targets_.resize(tokens_.size());
    for (std::size_t i = 0; i < tokens_.size(); ++i) {
      tokens_[i] = static_cast<std::int32_t>((i * 7 + 3) % static_cast<std::size_t>(model.vocab_size));
      targets_[i] = static_cast<std::int32_t>((i * 5 + 1) % static_cast<std::size_t>(model.vocab_size));
    }
  }

  void run() {
    const models::DecoderRuntime rt{{DeviceKind::Sim, stream_.get(), nullptr}, device_.get()};
    params_->zero_grads(stream_.get());
    decoder_->forward_backward(rt, *params_, tokens_.data(), targets_.data(), batch_, seq_,
                               1.0f / static_cast<float>(tokens_.size()));
  }

 private:
  std::int64_t batch_, seq_;
  std::unique_ptr<models::Decoder> decoder_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<models::ResidentParamProvider> params_;
  std::vector<std::int32_t> tokens_, targets_;
};

// FLOPs of the compute actions of `workload`'s micro-batch, per class.
double class_flops(const StepWorkload& workload, ComputeClass cls) {
  double flops = 0;
  for (const SimAction& a : workload.micro_batch) {
    if (a.kind == SimAction::Compute && a.cls == cls) flops += a.flops;
  }
  return flops;
}

// memcpy over 64 MiB: bytes copied per second.
double memcpy_bytes_per_s() {
  const std::size_t bytes = std::size_t{64} << 20;
  HostBuffer a = HostBuffer::allocate(bytes), b = HostBuffer::allocate(bytes);
  std::memset(a.data(), 1, bytes);
  std::memset(b.data(), 2, bytes);
  return static_cast<double>(bytes) / fastest_call_seconds([&] { std::memcpy(b.data(), a.data(), bytes); }, 5);
}

// Note [Wake-ups] (sim/step_sim.h): half the median round trip of an empty sim kernel through
// an idle sim stream, whose worker is woken by it and then wakes the waiting host. The median, not
// the fastest: a step's wake-ups are many, and what they cost together is their typical cost.
double sim_wake_seconds() {
  SimDeviceOptions o;
  o.capacity_bytes = std::size_t{1} << 20;
  o.capacity_knob = "strata simulate --machine measure (the wake-up probe)";
  const std::unique_ptr<Device> device = make_sim_device(o);
  const std::unique_ptr<Stream> stream = device->create_stream("wake");
  std::vector<double> trips(301);
  for (double& t : trips) {
    const auto t0 = std::chrono::steady_clock::now();
    launch_sim_kernel(*stream, [] {});
    stream->synchronize();
    t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::nth_element(trips.begin(), trips.begin() + trips.size() / 2, trips.end());
  return trips[trips.size() / 2] / 2;
}

}  // namespace

SimMachine measure_sim_machine(const TrainConfig& cfg, const StepWorkload& workload) {
  bool checkpointing = false;
  const models::ModelConfig model = train::training_model_config(cfg, &checkpointing);
  SimMachine m;
  m.device_is_host = true;
  MachineSpec& s = m.spec;
  s.name = "this host's CPU as the sim device (measured)";
  s.source = "--machine measure";
  const double peak = models::measure_sgemm_gflops(cfg.strata.data.seq_len, model.ffn_hidden, model.d_model, 0.3) * 1e9;
  s.gpus.count = 1;
  s.gpus.memory_bytes = cfg.strata.device.memory_bytes;
  s.gpus.bf16_tflops = peak / 1e12;
  // The config's model, cut to 8 blocks when it has more (the blocks are alike): its FLOPs over
  // its fastest forward+backward of one micro-batch is the efficiency of blocks and head alike.
  const std::int64_t layers = std::min<std::int64_t>(model.n_layers, 8);
  DecoderRun run(cfg, model, checkpointing, layers);
  const double seconds = fastest_call_seconds([&] { run.run(); }, 5);
  const double flops = class_flops(workload, ComputeClass::Block) * static_cast<double>(layers) /
                           static_cast<double>(model.n_layers) +
                       class_flops(workload, ComputeClass::Head);
  m.block_efficiency = m.head_efficiency = flops / seconds / peak;
  const double copy = memcpy_bytes_per_s();
  s.host.memory_bytes = measure_capacities(plan_tiers(workload.plan, 1, 0), 0, 1).host_available;
  s.host.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // As `strata doctor --measure` describes a host (optim/adam_yardstick.h): AdamW and the Adam-shaped
  // memory pass around it, on this rank's parameters (at most 4 Mi: the rate is per parameter).
  const optim::AdamRates adam = optim::measure_adam_rates(std::min<std::size_t>(workload.parameters, 4u << 20), 3);
  s.host.memory_gbps = adam.memory_gbps;
  s.host.adam_params_per_s = adam.adam_params_per_s;
  m.device_memory_gbps = s.host.memory_gbps;
  m.wake_seconds = sim_wake_seconds();
  s.gpus.pcie_h2d_gbps = cfg.strata.device.h2d_gbps > 0 ? cfg.strata.device.h2d_gbps : copy / 1e9;
  s.gpus.pcie_d2h_gbps = cfg.strata.device.d2h_gbps > 0 ? cfg.strata.device.d2h_gbps : copy / 1e9;
  const std::vector<std::string> dirs = nvme_dirs_of(cfg);
  if (!dirs.empty()) {
    ensure_directory(dirs.front(), "nvme_path directory");
    const std::uint64_t bytes = std::uint64_t{128} << 20;
    const DiskPassSeconds t = time_disk_passes(cfg, dirs.front(), bytes, bytes);
    s.drives.count = 1;
    s.drives.paths = {dirs.front()};
    s.drives.read_gbps = static_cast<double>(bytes) / t.read / 1e9;
    s.drives.write_gbps = static_cast<double>(bytes) / t.write / 1e9;
  }
  return m;
}

}  // namespace strata::sim
