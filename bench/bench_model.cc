// `strata bench model`: forward+backward tokens/s and achieved GFLOP/s of a decoder, beside a GEMM
// yardstick measured in the same run, and their ratio. On the sim device (CPU kernels) the yardstick
// is this machine's sgemm (models/sgemm_yardstick.h: the matmul op on a block-sized fp32 shape,
// inline); on a cuda device it is the matmul op (cuBLAS) on the same GPU, in the model's dtype, on
// the MLP up-projection's shape for the whole micro-batch. Model FLOPs: models::train_flops_per_token
// (6 x the matmul parameters, head included, + 12 x layers x heads x head_dim x seq for attention,
// no causal halving and no recompute counted). On cuda also the peak device memory Strata
// allocated. A benchmark, never a test.
#include "bench/bench_commands.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/device/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/units.h"
#include "models/decoder.h"
#include "models/kernels/ops.h"
#include "models/resident_provider.h"
#include "models/sgemm_yardstick.h"
#include "models/tiling.h"
#include "train/compute_device.h"

namespace strata::bench {

namespace {

struct BenchModelOptions {
  std::string model = "gpt2-124m";
  std::int64_t batch = 1;
  std::int64_t seq_len = 0;  // 0: min(256, the model's max_seq_len)
  int steps = 3;
  int warmup = 1;
  bool checkpointing = false;
  bool json = false;
  std::string device = "auto";  // sim | cuda | auto
  std::string dtype = "f32";    // f32 | bf16 | f16
  bool profile = false;         // one more step with every op timed between events
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The matmul op on `device`'s compute stream: m x n x k (B transposed, as a linear layer), in dtype,
// TFLOP/s over at least min_seconds (the stream synchronized around the timed launches).
double measure_device_gemm_tflops(Device& device, train::ComputeStream& cs, DType dtype, std::int64_t m, std::int64_t n,
                                  std::int64_t k, double min_seconds) {
  using namespace strata::models;
  const std::size_t eb = dtype_bytes(dtype);
  DeviceMemory a = device.allocate(static_cast<std::size_t>(m * k) * eb, "bench.gemm");
  DeviceMemory b = device.allocate(static_cast<std::size_t>(n * k) * eb, "bench.gemm");
  DeviceMemory c = device.allocate(static_cast<std::size_t>(m * n) * eb, "bench.gemm");
  Stream& stream = cs.stream();
  stream.memset(a.data(), 0x3c, a.size_bytes());  // small finite values in every dtype
  stream.memset(b.data(), 0x3c, b.size_bytes());
  MatmulArgs args{dtype, Trans::No, Trans::Yes, m, n, k, a.data(), k, 0, b.data(), k, 0, c.data(), n, 0, 1};
  matmul(cs.context(), args);  // warm up (cuBLAS picks its kernel)
  stream.synchronize();
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < min_seconds || reps < 3) {
    for (int i = 0; i < 10; ++i) matmul(cs.context(), args);
    stream.synchronize();
    reps += 10;
    elapsed = seconds_since(t0);
  }
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * reps / elapsed / 1e12;
}

DType parse_dtype_flag(const std::string& s) {
  DType t = DType::F32;
  if (!parse_dtype(s, &t)) throw ConfigError(fmt::format("--dtype '{}' is not known; use fp32, bf16 or fp16", s));
  return t;
}

// What one timed run of the decoder gave, with the yardstick beside it.
struct ModelRunResult {
  double elapsed = 0;            // seconds over the timed steps
  std::size_t peak_bytes = 0;    // device memory allocated at most
  std::vector<models::OpProfile::Row> ops;
  double profiled_s = 0;         // --profile: the wall time of the profiled step
  std::int64_t gemm_m = 0;       // the yardstick's shape: gemm_m x ffn_hidden x d_model
  double sgemm_gflops = 0;
};

// Decoder and device for `o`: the device is sized for the model's weights, gradients and
// activations; on cuda a model that does not fit the free memory is refused.
struct ModelBench {
  models::ModelConfig config;
  std::unique_ptr<models::Decoder> decoder;
  std::unique_ptr<Device> device;
};

ModelBench open_model_bench(BenchModelOptions& o) {
  using namespace strata::models;
  ModelBench b;
  b.config = model_config_by_name(o.model);
  b.config.dtype = parse_dtype_flag(o.dtype);
  const DeviceChoice choice = train::parse_device_flag(o.device);
  if (o.seq_len == 0) o.seq_len = std::min<std::int64_t>(256, b.config.max_seq_len);
  if (o.seq_len < 1 || o.seq_len > b.config.max_seq_len) {
    throw ConfigError(fmt::format("--seq-len {} must be in 1..{} for model '{}'", o.seq_len, b.config.max_seq_len,
                                  b.config.name));
  }
  if (o.batch < 1 || o.steps < 1 || o.warmup < 0) throw ConfigError("--batch and --steps must be >= 1, --warmup >= 0");
  // The block linears as an untiled run outside exact mode has them (Note [Linear chunks by
  // default] in models/tiling_plan.h): whole on cuda, in chunks on sim.
  TilingSpec untiled;
  if (train::resolve_device_kind(choice, {"strata bench model", "--device"}) == DeviceKind::Cuda) untiled.chunks = 1;
  b.decoder = std::make_unique<Decoder>(b.config, DecoderOptions{o.checkpointing ? Checkpointing::Blocks : Checkpointing::Off, untiled});
  std::size_t param_bytes = 0;
  for (const auto& g : b.decoder->param_groups()) param_bytes += g.bytes() + 256 * g.tensors.size();
  SimDeviceOptions dev_opts;
  dev_opts.capacity_bytes = 2 * param_bytes + b.decoder->activation_bytes(o.batch, o.seq_len, true) + (64u << 20);
  dev_opts.capacity_knob = "strata bench model --batch and --seq-len";
  b.device = train::open_compute_device(choice, 0, dev_opts, {"strata bench model", "--device"});
  if (b.device->kind() == DeviceKind::Cuda && dev_opts.capacity_bytes > b.device->capacity_bytes()) {
    throw ConfigError(fmt::format("strata bench model: model '{}' with --batch {} and --seq-len {} needs about {} of "
                                  "device memory, more than the {} free on {}; lower --batch or --seq-len",
                                  b.config.name, o.batch, o.seq_len, format_bytes(dev_opts.capacity_bytes),
                                  format_bytes(b.device->capacity_bytes()), b.device->name()));
  }
  return b;
}

// Warm-up, the timed steps, the --profile step (each op between two events on the stream: where the
// step's device time goes), then the yardstick on the shape of the model's MLP up-projection: for
// one sequence on the CPU (m = seq rows, n = ffn, k = d_model), for the whole micro-batch on the GPU.
ModelRunResult time_model(const BenchModelOptions& o, ModelBench& b) {
  using namespace strata::models;
  const ModelConfig& config = b.config;
  Decoder& decoder = *b.decoder;
  Device& device = *b.device;
  train::ComputeStream cs(device, "compute");
  Stream* stream = &cs.stream();
  ResidentParamProvider params(decoder.param_groups(), &device);
  params.init_gpt2_style(1, config.n_layers, stream);
  const DecoderRuntime rt{cs.context(), &device};
  std::mt19937 rng(1);
  std::vector<std::int32_t> in(static_cast<std::size_t>(o.batch * o.seq_len)), tg(in.size());
  for (auto& t : in) t = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(config.vocab_size));
  for (auto& t : tg) t = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(config.vocab_size));
  const float scale = 1.0f / static_cast<float>(in.size());
  const auto one_step = [&](const DecoderRuntime& r) {
    params.zero_grads(stream);
    decoder.forward_backward(r, params, in.data(), tg.data(), o.batch, o.seq_len, scale);
  };
  for (int i = 0; i < o.warmup; ++i) one_step(rt);
  ModelRunResult r;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.steps; ++i) one_step(rt);
  stream->synchronize();
  r.elapsed = seconds_since(t0);
  r.peak_bytes = device.memory_stats().peak_allocated_bytes;
  if (o.profile) {
    OpProfile profile;
    DecoderRuntime prt = rt;
    prt.ctx.profile = &profile;
    params.zero_grads(stream);
    stream->synchronize();
    const auto p0 = std::chrono::steady_clock::now();
    decoder.forward_backward(prt, params, in.data(), tg.data(), o.batch, o.seq_len, scale);
    stream->synchronize();
    r.profiled_s = seconds_since(p0);
    r.ops = profile.report();
  }
  const bool cuda = device.kind() == DeviceKind::Cuda;
  r.gemm_m = cuda ? o.batch * o.seq_len : o.seq_len;
  r.sgemm_gflops = cuda ? 1e3 * measure_device_gemm_tflops(device, cs, config.dtype, r.gemm_m, config.ffn_hidden,
                                                            config.d_model, 1.0)
                        : models::measure_sgemm_gflops(r.gemm_m, config.ffn_hidden, config.d_model, 1.0);
  return r;
}

void print_model_json(const BenchModelOptions& o, const ModelBench& b, const ModelRunResult& r) {
  const models::ModelConfig& config = b.config;
  const double tokens_per_s = static_cast<double>(o.steps * o.batch * o.seq_len) / r.elapsed;
  const double flops_per_token = models::train_flops_per_token(config, o.seq_len);
  const double model_gflops = tokens_per_s * flops_per_token / 1e9;
  const bool cuda = b.device->kind() == DeviceKind::Cuda;
  nlohmann::json j = {{"model", config.name},
                      {"params", models::param_count(config)},
                      {"batch", o.batch},
                      {"seq_len", o.seq_len},
                      {"steps", o.steps},
                      {"checkpointing", o.checkpointing},
                      {"device", b.device->name()},
                      {"dtype", std::string(dtype_name(config.dtype))},
                      {"peak_device_bytes", r.peak_bytes},
                      {"seconds_per_step", r.elapsed / o.steps},
                      {"tokens_per_s", tokens_per_s},
                      {"train_flops_per_token", flops_per_token},
                      {"model_gflops", model_gflops},
                      {"model_tflops", model_gflops / 1e3},
                      {"yardstick", cuda ? "cuBLAS gemm" : "sgemm"},
                      {"gemm_shape", {r.gemm_m, config.ffn_hidden, config.d_model}},
                      {"sgemm_gflops", r.sgemm_gflops},
                      {"ratio_to_sgemm", model_gflops / r.sgemm_gflops}};
  if (o.profile) {
    j["profile_step_seconds"] = r.profiled_s;
    for (const models::OpProfile::Row& row : r.ops) {
      j["profile_ops"].push_back({{"op", row.op}, {"calls", row.calls}, {"ms", row.ms}});
    }
  }
  std::printf("%s\n", j.dump().c_str());
}

void print_model_text(const BenchModelOptions& o, const ModelBench& b, const ModelRunResult& r) {
  const models::ModelConfig& config = b.config;
  const double tokens_per_s = static_cast<double>(o.steps * o.batch * o.seq_len) / r.elapsed;
  const double flops_per_token = models::train_flops_per_token(config, o.seq_len);
  const double model_gflops = tokens_per_s * flops_per_token / 1e9;
  const char* yardstick = b.device->kind() == DeviceKind::Cuda ? "cuBLAS gemm" : "sgemm";
  std::printf("model %s (%.1fM params, %s), batch %lld x seq %lld, %d steps%s on %s\n", config.name.c_str(),
              static_cast<double>(models::param_count(config)) / 1e6, std::string(dtype_name(config.dtype)).c_str(),
              static_cast<long long>(o.batch), static_cast<long long>(o.seq_len), o.steps,
              o.checkpointing ? ", activation checkpointing" : "", b.device->name().c_str());
  std::printf("forward+backward: %.3f s/step, %.1f tokens/s, %.2f GFLOP/s (%.3g training FLOP/token); peak device "
              "memory %s\n",
              r.elapsed / o.steps, tokens_per_s, model_gflops, flops_per_token, format_bytes(r.peak_bytes).c_str());
  std::printf("%s yardstick (m=%lld n=%lld k=%lld, same run): %.2f GFLOP/s; model/%s = %.2f\n", yardstick,
              static_cast<long long>(r.gemm_m), static_cast<long long>(config.ffn_hidden),
              static_cast<long long>(config.d_model), r.sgemm_gflops, yardstick, model_gflops / r.sgemm_gflops);
  if (!o.profile) return;
  double total = 0;
  for (const models::OpProfile::Row& row : r.ops) total += row.ms;
  std::printf("profiled step: %.3f s wall, %.3f s inside ops (the rest: host work and waits between them)\n",
              r.profiled_s, total / 1e3);
  for (const models::OpProfile::Row& row : r.ops) {
    std::printf("  %-28s %6lld calls %10.3f ms %5.1f%%\n", row.op.c_str(), static_cast<long long>(row.calls), row.ms,
                total > 0 ? 100 * row.ms / total : 0.0);
  }
}

int run_bench_model(BenchModelOptions o) {
  ModelBench bench = open_model_bench(o);
  const ModelRunResult result = time_model(o, bench);
  if (o.json) {
    print_model_json(o, bench, result);
  } else {
    print_model_text(o, bench, result);
  }
  return 0;
}

struct BenchAttentionOptions {
  std::string device = "auto";
  std::string dtype = "bf16";
  std::int64_t batch = 4, seq = 1024, heads = 16, head_dim = 64;
  int reps = 10;
  bool json = false;
};

// The attention op alone (forward, then backward) on the chosen device, TFLOP/s by the causal
// count of Note [Modeled compute] in models/kernels/ops.h (forward 2 b h s^2 d, backward 5 b h s^2 d), beside a GEMM of
// the same run (cuBLAS in the same dtype on cuda: b*s x 4*h*d x h*d, an MLP up-projection of that width;
// sgemm on sim).
int run_bench_attention(const BenchAttentionOptions& o) {
  using namespace strata::models;
  if (o.batch < 1 || o.seq < 1 || o.heads < 1 || o.head_dim < 1 || o.reps < 1) {
    throw ConfigError("--batch, --seq, --heads, --head-dim and --reps must be >= 1");
  }
  const DType dtype = parse_dtype_flag(o.dtype);
  const std::int64_t width = o.heads * o.head_dim, rows = o.batch * o.seq;
  const std::size_t act = static_cast<std::size_t>(rows * width) * dtype_bytes(dtype);
  const std::size_t lse_bytes = static_cast<std::size_t>(o.batch * o.heads * o.seq) * 4;
  SimDeviceOptions sim;
  sim.capacity_bytes = 8 * act + lse_bytes + (64u << 20);
  sim.capacity_knob = "strata bench attention --batch, --seq, --heads and --head-dim";
  auto device = train::open_compute_device(train::parse_device_flag(o.device), 0, sim, {"strata bench attention", "--device"});
  const bool cuda = device->kind() == DeviceKind::Cuda;
  train::ComputeStream cs(*device, "compute");
  Stream& stream = cs.stream();
  std::vector<DeviceMemory> bufs;
  for (int i = 0; i < 8; ++i) {
    bufs.push_back(device->allocate(act, "bench.attention"));
    stream.memset(bufs.back().data(), 0x3c, act);
  }
  DeviceMemory lse = device->allocate(lse_bytes, "bench.attention.lse");
  AttentionShape shape{o.batch, o.seq, o.heads, o.heads, o.head_dim, width, width, width};
  auto fwd = [&] { attention_forward(cs.context(), dtype, shape, bufs[0].data(), bufs[1].data(), bufs[2].data(),
                                     bufs[3].data(), lse.as<float>()); };
  auto bwd = [&] { attention_backward(cs.context(), dtype, shape, bufs[0].data(), bufs[1].data(), bufs[2].data(),
                                      bufs[3].data(), lse.as<float>(), bufs[4].data(), bufs[5].data(), bufs[6].data(),
                                      bufs[7].data()); };
  auto time_it = [&](auto&& fn) {
    fn();
    stream.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.reps; ++i) fn();
    stream.synchronize();
    return seconds_since(t0) / o.reps;
  };
  const double unit = static_cast<double>(o.batch) * static_cast<double>(o.heads) * static_cast<double>(o.seq) *
                      static_cast<double>(o.seq) * static_cast<double>(o.head_dim);
  const double fwd_s = time_it(fwd), bwd_s = time_it(bwd);
  const double fwd_tflops = 2 * unit / fwd_s / 1e12, bwd_tflops = 5 * unit / bwd_s / 1e12;
  const double gemm_tflops = cuda ? measure_device_gemm_tflops(*device, cs, dtype, rows, 4 * width, width, 0.5)
                                  : models::measure_sgemm_gflops(o.seq, 4 * width, width, 0.5) / 1e3;
  if (o.json) {
    nlohmann::json j = {{"device", device->name()}, {"dtype", std::string(dtype_name(dtype))},
                        {"batch", o.batch}, {"seq", o.seq}, {"heads", o.heads}, {"head_dim", o.head_dim},
                        {"forward_seconds", fwd_s}, {"backward_seconds", bwd_s},
                        {"forward_tflops", fwd_tflops}, {"backward_tflops", bwd_tflops},
                        {"gemm_tflops", gemm_tflops}, {"gemm", cuda ? "cuBLAS" : "sgemm"}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("attention on %s, %s, batch %lld x seq %lld x %lld heads of %lld (causal)\n", device->name().c_str(),
                std::string(dtype_name(dtype)).c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq),
                static_cast<long long>(o.heads), static_cast<long long>(o.head_dim));
    std::printf("forward %.3f ms, %.2f TFLOP/s; backward %.3f ms, %.2f TFLOP/s; %s (same run) %.2f TFLOP/s\n",
                fwd_s * 1e3, fwd_tflops, bwd_s * 1e3, bwd_tflops, cuda ? "cuBLAS gemm" : "sgemm", gemm_tflops);
  }
  return 0;
}

}  // namespace

void register_bench_model(CLI::App& bench, CommandTable& table) {
  auto opts = std::make_shared<BenchModelOptions>();
  auto* cmd = bench.add_subcommand("model", "decoder forward+backward vs a same-run GEMM (sgemm on sim, cuBLAS on cuda)");
  cmd->add_option("--model", opts->model, "model name (default gpt2-124m)");
  cmd->add_option("--batch", opts->batch, "sequences per step (default 1)");
  cmd->add_option("--seq-len", opts->seq_len, "tokens per sequence (default: 256, or the model's max_seq_len if shorter)");
  cmd->add_option("--steps", opts->steps, "timed steps (default 3)");
  cmd->add_option("--warmup", opts->warmup, "untimed steps first (default 1)");
  cmd->add_flag("--checkpointing", opts->checkpointing, "recompute blocks in backward");
  cmd->add_flag("--json", opts->json, "print one JSON object");
  cmd->add_option("--device", opts->device, "sim, cuda or auto (cuda when one is usable; default auto)");
  cmd->add_option("--dtype", opts->dtype, "weights and activations: f32 (default), bf16 or f16");
  cmd->add_flag("--profile", opts->profile, "one more step with each op timed between events: device time per op");
  table[cmd] = [opts]() { return run_bench_model(*opts); };

  auto a = std::make_shared<BenchAttentionOptions>();
  auto* att = bench.add_subcommand("attention", "the attention op alone (forward, backward) vs a same-run GEMM");
  att->add_option("--device", a->device, "sim, cuda or auto (default auto)");
  att->add_option("--dtype", a->dtype, "f32, bf16 (default) or f16");
  att->add_option("--batch", a->batch, "batch items (default 4)");
  att->add_option("--seq", a->seq, "sequence length (default 1024)");
  att->add_option("--heads", a->heads, "heads (default 16)");
  att->add_option("--head-dim", a->head_dim, "head dimension (default 64)");
  att->add_option("--reps", a->reps, "timed repetitions of each pass (default 10)");
  att->add_flag("--json", a->json, "print one JSON object");
  table[att] = [a]() { return run_bench_attention(*a); };
}

}  // namespace strata::bench
