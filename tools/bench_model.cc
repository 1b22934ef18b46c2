// `strata bench model`: forward+backward tokens/s and achieved GFLOP/s of a decoder on the sim
// device (CPU kernels), beside the sgemm GFLOP/s of this machine measured in the same run (the
// matmul op on a block-sized fp32 shape), and their ratio. A benchmark, never a test.
#include "tools/commands.h"

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
#include "core/error.h"
#include "models/decoder.h"
#include "models/kernels/ops.h"
#include "models/resident_provider.h"
#include "tools/yardsticks.h"

namespace strata::tools {

namespace {

struct BenchModelOptions {
  std::string model = "gpt2-124m";
  std::int64_t batch = 1;
  std::int64_t seq_len = 0;  // 0: min(256, the model's max_seq_len)
  int steps = 3;
  int warmup = 1;
  bool checkpointing = false;
  bool json = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double measure_sgemm_gflops(std::int64_t m, std::int64_t n, std::int64_t k, double min_seconds) {
  using namespace strata::models;
  std::vector<float> a(static_cast<std::size_t>(m * k), 0.5f), b(static_cast<std::size_t>(n * k), 0.25f),
      c(static_cast<std::size_t>(m * n));
  MatmulArgs args{DType::F32, Trans::No, Trans::Yes, m, n, k, a.data(), k, 0, b.data(), k, 0, c.data(), n, 0, 1};
  const KernelContext inline_ctx{};
  matmul(inline_ctx, args);  // warm up
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < min_seconds || reps < 3) {
    matmul(inline_ctx, args);
    ++reps;
    elapsed = seconds_since(t0);
  }
  return 2.0 * static_cast<double>(m * n * k) * reps / elapsed / 1e9;
}

namespace {

int run_bench_model(BenchModelOptions o) {
  using namespace strata::models;
  const ModelConfig config = model_config_by_name(o.model);
  if (o.seq_len == 0) o.seq_len = std::min<std::int64_t>(256, config.max_seq_len);
  if (o.seq_len < 1 || o.seq_len > config.max_seq_len) {
    throw ConfigError(fmt::format("--seq-len {} must be in 1..{} for model '{}'", o.seq_len, config.max_seq_len, config.name));
  }
  if (o.batch < 1 || o.steps < 1 || o.warmup < 0) throw ConfigError("--batch and --steps must be >= 1, --warmup >= 0");
  Decoder decoder(config, {o.checkpointing ? Checkpointing::Blocks : Checkpointing::Off});
  const auto groups = decoder.param_groups();
  std::size_t param_bytes = 0;
  for (const auto& g : groups) param_bytes += g.bytes() + 256 * g.tensors.size();
  SimDeviceOptions dev_opts;
  dev_opts.capacity_bytes = 2 * param_bytes + decoder.activation_bytes(o.batch, o.seq_len, true) + (64u << 20);
  dev_opts.capacity_knob = "strata bench model --batch and --seq-len";
  auto device = make_sim_device(dev_opts);
  auto stream = device->create_stream("compute");
  ResidentParamProvider params(groups, device.get());
  params.init_gpt2_style(1, config.n_layers, stream.get());
  const DecoderRuntime rt{{DeviceKind::Sim, stream.get(), nullptr}, device.get()};
  std::mt19937 rng(1);
  std::vector<std::int32_t> in(static_cast<std::size_t>(o.batch * o.seq_len)), tg(in.size());
  for (auto& t : in) t = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(config.vocab_size));
  for (auto& t : tg) t = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(config.vocab_size));
  const float scale = 1.0f / static_cast<float>(in.size());
  for (int i = 0; i < o.warmup; ++i) {
    params.zero_grads(stream.get());
    decoder.forward_backward(rt, params, in.data(), tg.data(), o.batch, o.seq_len, scale);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.steps; ++i) {
    params.zero_grads(stream.get());
    decoder.forward_backward(rt, params, in.data(), tg.data(), o.batch, o.seq_len, scale);
  }
  const double elapsed = seconds_since(t0);
  const double tokens_per_s = static_cast<double>(o.steps * o.batch * o.seq_len) / elapsed;
  const double flops_per_token = train_flops_per_token(config, o.seq_len);
  const double model_gflops = tokens_per_s * flops_per_token / 1e9;
  // The yardstick on the shape of the model's MLP up-projection for one sequence (m = seq rows,
  // n = ffn, k = d_model).
  const double sgemm_gflops = measure_sgemm_gflops(o.seq_len, config.ffn_hidden, config.d_model, 1.0);
  const double ratio = model_gflops / sgemm_gflops;
  if (o.json) {
    nlohmann::json j = {{"model", config.name},
                        {"params", param_count(config)},
                        {"batch", o.batch},
                        {"seq_len", o.seq_len},
                        {"steps", o.steps},
                        {"checkpointing", o.checkpointing},
                        {"seconds_per_step", elapsed / o.steps},
                        {"tokens_per_s", tokens_per_s},
                        {"train_flops_per_token", flops_per_token},
                        {"model_gflops", model_gflops},
                        {"sgemm_gflops", sgemm_gflops},
                        {"ratio_to_sgemm", ratio}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model %s (%.1fM params), batch %lld x seq %lld, %d steps%s on %s\n", config.name.c_str(),
                static_cast<double>(param_count(config)) / 1e6, static_cast<long long>(o.batch),
                static_cast<long long>(o.seq_len), o.steps, o.checkpointing ? ", activation checkpointing" : "",
                device->name().c_str());
    std::printf("forward+backward: %.3f s/step, %.1f tokens/s, %.2f GFLOP/s (%.3g training FLOP/token)\n",
                elapsed / o.steps, tokens_per_s, model_gflops, flops_per_token);
    std::printf("sgemm yardstick (m=%lld n=%lld k=%lld, same run): %.2f GFLOP/s; model/sgemm = %.2f\n",
                static_cast<long long>(o.seq_len), static_cast<long long>(config.ffn_hidden),
                static_cast<long long>(config.d_model), sgemm_gflops, ratio);
  }
  return 0;
}

}  // namespace

void register_bench_model(CLI::App& bench, CommandTable& table) {
  auto opts = std::make_shared<BenchModelOptions>();
  auto* cmd = bench.add_subcommand("model", "decoder forward+backward on the sim device vs same-run sgemm");
  cmd->add_option("--model", opts->model, "model name (default gpt2-124m)");
  cmd->add_option("--batch", opts->batch, "sequences per step (default 1)");
  cmd->add_option("--seq-len", opts->seq_len, "tokens per sequence (default: 256, or the model's max_seq_len if shorter)");
  cmd->add_option("--steps", opts->steps, "timed steps (default 3)");
  cmd->add_option("--warmup", opts->warmup, "untimed steps first (default 1)");
  cmd->add_flag("--checkpointing", opts->checkpointing, "recompute blocks in backward");
  cmd->add_flag("--json", opts->json, "print one JSON object");
  table[cmd] = [opts]() { return run_bench_model(*opts); };
}

}  // namespace strata::tools
