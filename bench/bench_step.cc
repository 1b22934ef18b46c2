// `strata bench step`: how close an offloaded training step comes to its slowest queue. It trains
// a few steps of a config (default: configs/demo.json, everything on NVMe), then measures each of
// the step's queues alone, in the same run, on the same bytes: compute (the model's forward and
// backward over the step's micro-batches with every parameter resident), copies (the step's
// host<->device bytes of offloaded state), NVMe (the step's bytes read and written through the
// I/O engine in the same directory) and CPU Adam (one update of this rank's parameters). A step that
// overlaps its queues perfectly takes as long as the slowest one: step / slowest is the figure
// (target <= 1.10). Also prints the capacity reached: parameters trained per byte of device memory.
// A benchmark, never a test.
#include "bench/bench_commands.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/device/device.h"
#include "core/error.h"
#include "core/host_buffer.h"
#include "core/units.h"
#include "config/config.h"
#include "plan/machine.h"
#include "plan/run_plan.h"
#include "models/decoder.h"
#include "models/resident_provider.h"
#include "models/tiling_plan.h"
#include "optim/cpu_exec.h"
#include "optim/optimizer.h"
#include "plan/bench_disk.h"
#include "train/compute_device.h"
#include "train/trainer.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchStepOptions {
  std::string config;  // empty: the built-in configs/demo.json
  std::vector<std::string> overrides;
  int steps = 4;
  int warmup = 2;
  bool json = false;
  double drive_tbw = 0;  // --drive-tbw: rated TB written of one drive (0: unknown)
};

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Forward+backward of one step's micro-batches with all parameters resident: on a roomy sim device,
// or on the GPU the config's device choice resolves to (training_device_choice; whole, uncapped).
double measure_compute(const TrainConfig& cfg, int reps) {
  bool checkpointing = false;
  const models::ModelConfig model = train::training_model_config(cfg, &checkpointing);
  models::DecoderOptions dopt;
  dopt.checkpointing = checkpointing ? models::Checkpointing::Blocks : models::Checkpointing::Off;
  // The untiled run's linear chunks (Note [Linear chunks by default] in models/tiling_plan.h): the config's, else the
  // rule's.
  models::TilingSpec untiled;
  untiled.chunks = models::parse_tiling(cfg.strata.tiling, model).chunks;
  const DeviceChoice choice = train::training_device_choice(cfg);
  dopt.tiling.chunks = models::linear_chunks(cfg, untiled, train::resolve_device_kind(choice, train::training_device_source(cfg)));
  models::Decoder decoder(model, dopt);
  const auto groups = decoder.param_groups();
  const std::int64_t micro = cfg.micro_batch_size, seq = cfg.strata.data.seq_len;
  std::size_t bytes = 0;
  for (const auto& g : groups) bytes += g.bytes() + 256 * g.tensors.size();
  SimDeviceOptions o;
  o.capacity_bytes = 2 * bytes + decoder.activation_bytes(micro, seq, true) + (64u << 20);
  auto device = train::open_compute_device(choice, 0, o, train::training_device_source(cfg));
  train::ComputeStream cs(*device, "compute");
  Stream* stream = &cs.stream();
  models::ResidentParamProvider params(groups, device.get());
  params.init_gpt2_style(cfg.strata.seed, model.n_layers, stream);
  const models::DecoderRuntime rt{cs.context(), device.get()};
  std::mt19937 rng(1);
  std::vector<std::int32_t> in(static_cast<std::size_t>(micro * seq)), tg(in.size());
  for (auto& t : in) t = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(model.vocab_size));
  for (auto& t : tg) t = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(model.vocab_size));
  std::vector<double> times;
  for (int r = 0; r <= reps; ++r) {  // the first is a warm-up
    params.zero_grads(stream);
    stream->synchronize();
    const auto t0 = Clock::now();
    for (int a = 0; a < cfg.gradient_accumulation_steps; ++a) {
      decoder.forward_backward(rt, params, in.data(), tg.data(), micro, seq, 1.0f / static_cast<float>(in.size()));
    }
    stream->synchronize();
    if (r > 0) times.push_back(since(t0));
  }
  return median(times);
}

// The step's host<->device bytes over a GPU's link: pinned host memory, 64 MiB copies, half each way
// (the step's copies go both ways; the link is full duplex, but one stream serializes them).
double measure_gpu_copies(const TrainConfig& cfg, std::uint64_t bytes) {
  auto device = train::open_compute_device(DeviceChoice::Cuda, 0, SimDeviceOptions{}, {cfg.source});
  auto stream = device->create_stream("copies");
  const std::size_t piece = std::min<std::uint64_t>(bytes, 64u << 20);
  HostBufferOptions ho;
  ho.pinner = device.get();
  HostBuffer host = HostBuffer::allocate(piece, ho);
  std::memset(host.data(), 1, piece);
  DeviceMemory dev = device->allocate(piece, "bench.copies");
  std::vector<double> times;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    std::uint64_t done = 0;
    for (int dir = 0; done < bytes; dir ^= 1) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(piece, bytes - done));
      if (dir == 0) stream->copy_h2d(dev.data(), host.data(), n);
      else stream->copy_d2h(host.data(), dev.data(), n);
      done += n;
    }
    stream->synchronize();
    times.push_back(since(t0));
  }
  return median(times);
}

// The step's host<->device bytes: memcpy speed on the sim device, or its modeled link; on a GPU, its
// link.
double measure_copies(const TrainConfig& cfg, std::uint64_t bytes) {
  if (bytes == 0) return 0;
  if (train::resolve_device_kind(train::training_device_choice(cfg), train::training_device_source(cfg)) == DeviceKind::Cuda) return measure_gpu_copies(cfg, bytes);
  const double gbps = std::max(cfg.strata.device.h2d_gbps, cfg.strata.device.d2h_gbps);
  if (gbps > 0) return static_cast<double>(bytes) / (gbps * 1e9);
  const std::size_t piece = std::min<std::uint64_t>(bytes, 64u << 20);
  HostBuffer a = HostBuffer::allocate(piece), b = HostBuffer::allocate(piece);
  std::memset(a.data(), 1, piece);
  std::memset(b.data(), 2, piece);
  std::vector<double> times;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    for (std::uint64_t done = 0; done < bytes; done += piece) {
      std::memcpy(b.data(), a.data(), static_cast<std::size_t>(std::min<std::uint64_t>(piece, bytes - done)));
    }
    times.push_back(since(t0));
  }
  return median(times);
}

// The step's NVMe bytes, written then read, through the I/O engine in `dir` (median of 3).
double measure_nvme(const TrainConfig& cfg, const std::string& dir, std::uint64_t read_bytes, std::uint64_t write_bytes) {
  if (read_bytes + write_bytes == 0) return 0;
  std::vector<double> times;
  for (int r = 0; r < 3; ++r) {
    const DiskPassSeconds t = time_disk_passes(cfg, dir, read_bytes, write_bytes);
    times.push_back(t.write + t.read);
  }
  return median(times);
}

// One AdamW update (bf16 weights out) of `elems` parameters with the engine's CPU kernels.
double measure_adam(std::uint64_t elems) {
  const auto n = static_cast<std::size_t>(elems);
  std::vector<float> master(n, 0.1f), m(n, 0.0f), v(n, 0.0f), grad(n, 0.01f);
  std::vector<std::uint16_t> out(n);
  optim::AdamParams p;
  optim::ParamGroup group = optim::ParamGroup::adam("bench", optim::OptimizerKind::AdamW, p);
  optim::OptimShard s{master, m, v, optim::GradRef{grad.data(), DType::F32}, optim::LowPrecisionOut{out.data(), DType::BF16}};
  const optim::CpuExec exec = optim::default_cpu_exec();
  std::vector<double> times;
  for (int r = 0; r <= 3; ++r) {
    const auto t0 = Clock::now();
    group.step(std::span<const optim::OptimShard>(&s, 1), 1.0f, exec);
    if (r > 0) times.push_back(since(t0));
  }
  return median(times);
}

struct Queue {
  const char* name;
  double seconds;
};

// What one `bench step` measured: the training run's figures after warm-up and each queue alone.
struct StepBench {
  const TrainConfig& cfg;
  const train::TrainSummary& s;
  double step = 0;
  std::uint64_t nvme_read = 0, nvme_written = 0, copies = 0;
  std::size_t drives = 0;
  std::vector<Queue> queues{};
  const Queue* slowest = nullptr;
  double ratio = 0, flops_per_token = 0, tokens_per_s = 0, params_per_byte = 0;
  SsdWear wear{};
};

void print_step_json(const BenchStepOptions& o, const StepBench& r) {
  const train::TrainSummary& s = r.s;
  nlohmann::json j = {{"config", r.cfg.source},
                      {"steps", o.steps},
                      {"step_seconds", r.step},
                      {"slowest_queue", r.slowest->name},
                      {"ratio_to_slowest", r.ratio},
                      {"parameters", s.parameters},
                      {"device", s.device_name},
                      {"tokens_per_step", s.tokens_per_step},
                      {"tokens_per_s", r.tokens_per_s},
                      {"train_flops_per_token", r.flops_per_token},
                      {"model_tflops", r.tokens_per_s * r.flops_per_token / 1e12},
                      {"peak_device_bytes", s.peak_device_bytes},
                      {"device_capacity_bytes", s.device_capacity_bytes},
                      {"params_per_device_byte", r.params_per_byte},
                      {"model_state_bytes", s.model_state_bytes},
                      {"nvme_read_bytes_per_step", r.nvme_read},
                      {"nvme_written_bytes_per_step", r.nvme_written},
                      {"nvme_tb_written_per_day", r.wear.tb_per_day},
                      {"days_to_rated_endurance", r.wear.days_to_rated},
                      {"copy_bytes_per_step", r.copies},
                      {"overlapped_chunk_updates", s.overlapped_chunk_updates},
                      {"optimizer_chunk_updates", s.optimizer_chunk_updates}};
  for (const auto& q : r.queues) j["queue_seconds"][q.name] = q.seconds;
  std::printf("%s\n", j.dump().c_str());
}

void print_step_text(const BenchStepOptions& o, const StepBench& r) {
  const train::TrainSummary& s = r.s;
  std::printf("config %s: %.2fM parameters, model state %s on a device of %s (%.1fx)\n", r.cfg.source.c_str(),
              static_cast<double>(s.parameters) / 1e6, format_bytes(s.model_state_bytes).c_str(),
              format_bytes(s.device_capacity_bytes).c_str(),
              static_cast<double>(s.model_state_bytes) / static_cast<double>(s.device_capacity_bytes));
  std::printf("on %s: %.1f tokens/s, %.2f model TFLOP/s (%.3g training FLOP/token), peak device memory %s\n",
              s.device_name.c_str(), r.tokens_per_s, r.tokens_per_s * r.flops_per_token / 1e12, r.flops_per_token,
              format_bytes(s.peak_device_bytes).c_str());
  std::printf("per step: nvme read %s, written %s; host<->device %s; %llu of %llu optimizer chunks overlapped backward\n",
              format_bytes(r.nvme_read).c_str(), format_bytes(r.nvme_written).c_str(), format_bytes(r.copies).c_str(),
              static_cast<unsigned long long>(s.overlapped_chunk_updates),
              static_cast<unsigned long long>(s.optimizer_chunk_updates));
  if (r.nvme_written > 0) {
    std::printf("ssd wear: %.3g TB written per day over %zu drive(s)", r.wear.tb_per_day, r.drives);
    if (r.wear.days_to_rated > 0) std::printf(", %.0f days to the rated %.0f TBW per drive", r.wear.days_to_rated, o.drive_tbw);
    std::printf("\n");
  }
  std::printf("%-18s %10s\n", "queue (alone)", "seconds");
  for (const auto& q : r.queues) std::printf("%-18s %10.4f\n", q.name, q.seconds);
  std::printf("%-18s %10.4f  (median of %d steps after %d warm-up)\n", "training step", r.step, o.steps, o.warmup);
  std::printf("step / slowest queue (%s) = %.2f   (target <= 1.10)\n", r.slowest->name, r.ratio);
  std::printf("capacity: %.3f parameters per byte of device memory\n", r.params_per_byte);
}

int run_bench_step(const BenchStepOptions& o) {
  if (o.steps < 1 || o.warmup < 0) throw ConfigError("--steps must be >= 1 and --warmup >= 0");
  const TrainConfig cfg = train::load_train_config_or_demo(o.config, o.overrides);
  if (cfg.zero.offload_optimizer.device != OffloadDevice::Nvme || cfg.zero.offload_param.device != OffloadDevice::Nvme) {
    std::fprintf(stderr, "note: %s does not put both optimizer and parameters on NVMe; the figure is for its tiers\n",
                 cfg.source.c_str());
  }
  train::TrainOptions t;
  t.config_path = o.config;
  t.overrides = o.overrides;
  t.steps = o.warmup + o.steps;
  t.quiet = true;
  const train::TrainSummary s = run_training(t);
  StepBench r{.cfg = cfg, .s = s};
  const auto first = static_cast<std::ptrdiff_t>(o.warmup);
  r.step = median(std::vector<double>(s.step_seconds.begin() + first, s.step_seconds.end()));
  auto mean_after_warmup = [&](const std::vector<std::uint64_t>& v) {
    std::uint64_t sum = 0;
    for (std::size_t i = static_cast<std::size_t>(o.warmup); i < v.size(); ++i) sum += v[i];
    return sum / static_cast<std::uint64_t>(o.steps);
  };
  r.nvme_read = mean_after_warmup(s.step_nvme_read);
  r.nvme_written = mean_after_warmup(s.step_nvme_written);
  r.copies = mean_after_warmup(s.step_copy_bytes);

  const std::vector<std::string> nvme_dirs = nvme_dirs_of(cfg);  // where the run swaps (plan/run_plan.h)
  const std::string nvme_dir = nvme_dirs.empty() ? "." : nvme_dirs.front();
  r.drives = nvme_dirs.size();
  r.queues = {
      {"compute", measure_compute(cfg, 3)},
      {"copies", measure_copies(cfg, r.copies)},
      {"nvme read+write", measure_nvme(cfg, nvme_dir, r.nvme_read, r.nvme_written)},
  };
  // The CPU runs the optimizer only where its state is offloaded; otherwise the update is device
  // work inside the step, and a CPU Adam yardstick would name a queue the step never used.
  if (s.optimizer_offloaded) r.queues.push_back({"cpu adam", measure_adam(s.parameters)});
  r.slowest = &*std::max_element(r.queues.begin(), r.queues.end(),
                                 [](const Queue& a, const Queue& b) { return a.seconds < b.seconds; });
  r.ratio = r.slowest->seconds > 0 ? r.step / r.slowest->seconds : 0;
  bool checkpointing = false;
  r.flops_per_token = models::train_flops_per_token(train::training_model_config(cfg, &checkpointing), cfg.strata.data.seq_len);
  r.tokens_per_s = r.step > 0 ? static_cast<double>(s.tokens_per_step) / r.step : 0;
  r.params_per_byte = static_cast<double>(s.parameters) / static_cast<double>(s.device_capacity_bytes);
  // SSD wear at the measured step time: one drive per NVMe directory (plan/machine.h, ssd_wear).
  r.wear = ssd_wear(static_cast<double>(r.nvme_written), r.step, static_cast<int>(r.drives), o.drive_tbw);
  if (o.json) {
    print_step_json(o, r);
  } else {
    print_step_text(o, r);
  }
  return 0;
}

}  // namespace

void register_bench_step(CLI::App& bench, CommandTable& table) {
  auto o = std::make_shared<BenchStepOptions>();
  auto* cmd = bench.add_subcommand("step", "offloaded step time against its slowest queue measured alone (same run)");
  cmd->add_option("--config", o->config, "training config (default: configs/demo.json, built into the command)")
      ->check(non_empty_path());
  cmd->add_option("--set", o->overrides, "override a config key (repeatable)");
  cmd->add_option("--steps", o->steps, "measured steps")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "steps before measuring")->capture_default_str();
  cmd->add_flag("--json", o->json, "one JSON object");
  cmd->add_option("--drive-tbw", o->drive_tbw, "rated TB written of one NVMe drive: the days of this training it lasts")
      ->check(CLI::Range(0.0, 1e6));
  table[cmd] = [o]() -> int { return run_bench_step(*o); };
}

}  // namespace strata::bench
