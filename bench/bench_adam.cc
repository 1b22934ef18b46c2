// `strata bench adam`: CPU optimizer throughput beside its same-run yardstick.
//
// --mode update (default) times the bare AdamW update (optim::adam_step) over --params fp32
// parameters, for each thread count 1..N (or --threads N) in a tbb::task_arena of that size, and
// next to it the Adam-shaped memory pass (optim/memory_pass.h: the same streams, same SIMD level,
// blocks and threads, trivial math), which no CPU Adam can beat. A shared machine's memory
// bandwidth moves from one second to the next (docs/MEASUREMENTS.md), so every repetition runs
// pass, Adam, pass back to back, each figure is the best of the repetitions, and the fraction is
// taken against the mean of the pass before and the pass after (both printed; also against the
// faster one). The shard, its fill and that timing are optim/adam_yardstick.h's, the same code
// `strata doctor --measure` and the simulator's machine measurement run (measure_adam_rates).
//
// --mode phase times the whole optimizer phase with a dynamic loss scale and gradient clipping:
// the fused phase (optim::fused_optimizer_phase: one norm/non-finite pass over the gradients + one
// pass doing unscale + clip + AdamW + bf16 copy) beside the same work as six separate parallel
// passes the way DeepSpeed's offload optimizer does it (optim::unfused_optimizer_phase: unscale,
// non-finite scan, norm, clip, AdamW, fp32 -> bf16 copy). Gradients are restored before every
// repetition (untimed), because the unfused phase scales them in place.
//
// Rates are parameters per second; GB/s counts the bytes the kernel must move (1e9 bytes/s).
#include <tbb/info.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/units.h"
#include "optim/adam_yardstick.h"
#include "optim/memory_pass.h"
#include "optim/optimizer.h"
#include "optim/optimizer_phase.h"
#include "bench/bench_commands.h"

namespace strata::bench {
namespace {

struct BenchAdamArgs {
  std::string params = "100M";
  int threads = 0;  // 0: sweep 1..N
  std::string grad_dtype = "fp32";
  std::string mode = "update";
  int reps = 0;  // 0: by size
  bool json = false;
};

// Restores the gradients the unfused phase scaled in place (untimed).
void restore_grads(optim::YardstickShard& st, tbb::task_arena& arena) {
  const std::size_t gb = dtype_bytes(st.grad_dtype);
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, st.n, optim::kCpuBlockElems),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        std::memcpy(static_cast<std::uint8_t*>(st.g.data()) + r.begin() * gb,
                                    static_cast<const std::uint8_t*>(st.g_pristine.data()) + r.begin() * gb,
                                    r.size() * gb);
                      });
  });
}

// The checked flags: the shard size, the gradient type and the mode.
struct BenchAdamPlan {
  std::size_t n = 0;
  DType gdt = DType::F32;
  bool phase = false;  // --mode phase
  int max_threads = 0;
};

BenchAdamPlan check_args(const BenchAdamArgs& args) {
  BenchAdamPlan plan;
  std::uint64_t n64 = 0;
  if (!parse_count(args.params, &n64) || n64 == 0) {
    throw ConfigError(fmt::format("--params '{}' is not a parameter count; write e.g. 10M, 100M or 1B", args.params));
  }
  DType gdt = DType::F32;
  if (!parse_dtype(args.grad_dtype, &gdt)) {
    throw ConfigError(fmt::format("--grad-dtype '{}' is not known; use fp32, bf16 or fp16", args.grad_dtype));
  }
  const bool phase = args.mode == "phase";
  if (!phase && args.mode != "update") {
    throw ConfigError(fmt::format("--mode '{}' is not known; use update (bare AdamW vs the memory pass) or phase "
                                  "(fused optimizer phase vs separate passes)",
                                  args.mode));
  }
  const int max_threads = tbb::info::default_concurrency();
  if (args.threads < 0 || args.threads > 4 * max_threads) {
    throw ConfigError(fmt::format("--threads {} is out of range; use 1..{} (0 sweeps 1..{})", args.threads,
                                  4 * max_threads, max_threads));
  }
  if (args.reps < 0) throw ConfigError(fmt::format("--reps {} must be >= 1 (0 picks by size)", args.reps));
  plan.n = static_cast<std::size_t>(n64);
  plan.gdt = gdt;
  plan.phase = phase;
  plan.max_threads = max_threads;
  return plan;
}

// What every printed row shares.
struct BenchAdamRun {
  const BenchAdamArgs& args;
  std::size_t n;
  DType gdt;
  SimdLevel simd;
  int reps;
};

// The title lines and the table's header (without --json).
void print_header(const BenchAdamRun& run, bool phase) {
  fmt::print("strata bench adam --mode {}: {} parameters, gradients {}, SIMD {}, best of {} repetitions\n",
             run.args.mode, run.n, dtype_name(run.gdt), simd_level_name(run.simd), run.reps);
  if (!phase) {
    fmt::print("yardstick: Adam-shaped memory pass (read p,m,v,g; write p,m,v; {} bytes/param), run before and "
               "after each AdamW repetition\n",
               optim::adam_bytes_per_param(run.gdt));
    fmt::print("{:>7}  {:>14}  {:>8}  {:>17}  {:>17}  {:>13}  {:>15}\n", "threads", "AdamW Mparam/s", "GB/s",
               "pass before Mp/s", "pass after Mp/s", "fraction/mean", "fraction/faster");
  } else {
    fmt::print("fused = norm+non-finite pass, then unscale+clip+AdamW+bf16-copy pass; separate = unscale, "
               "non-finite scan, norm, clip, AdamW, bf16 copy (6 parallel passes)\n");
    fmt::print("{:>7}  {:>16}  {:>19}  {:>10}  {:>17}  {:>17}\n", "threads", "fused Mparam/s", "separate Mparam/s",
               "fused/sep", "pass before Mp/s", "pass after Mp/s");
  }
}

// --mode phase: pass, fused phase, separate passes, pass; gradients restored before each phase.
optim::BestSeconds time_phase(optim::YardstickShard& st, const optim::OptimShard& shard, tbb::task_arena& arena,
                       const optim::CpuExec& exec, int reps) {
  auto pass = [&] { optim::adam_shaped_memory_pass({&shard, 1}, exec); };
  optim::BestSeconds best;
  optim::LossScalerConfig lc;
  lc.initial_scale_power = 10;  // = loss_scale in run_bench_adam
  optim::LossScaler fused_scaler(lc), unfused_scaler(lc);
  optim::ParamGroup fused_group = optim::ParamGroup::adam("bench", optim::OptimizerKind::AdamW, optim::AdamParams{});
  optim::ParamGroup unfused_group = fused_group;
  // Clip at half the gradients' expected norm (|g| ~ 1e-3 unscaled: ~ 1e-3 * sqrt(n / 3)), so that
  // clipping is active at every size (a fixed threshold of 1 was not below 3M parameters).
  const optim::PhaseOptions options{0.5e-3 * std::sqrt(static_cast<double>(st.n) / 3.0)};
  const std::span<float> g32 =
      st.grad_dtype == DType::F32 ? st.g.as<float>().subspan(0, st.n) : st.scratch.as<float>().subspan(0, st.n);
  optim::PhaseResult last{};
  auto fused = [&] { last = optim::fused_optimizer_phase(fused_group, {&shard, 1}, &fused_scaler, options, exec); };
  auto unfused = [&] {
    last = optim::unfused_optimizer_phase(unfused_group, {&shard, 1}, {&g32, 1}, &unfused_scaler, options, exec);
  };
  for (int r = -1; r < reps; ++r) {  // r = -1: warm-up
    const double before = optim::seconds_of(pass);
    restore_grads(st, arena);
    const double a = optim::seconds_of(fused);
    STRATA_CHECK(last.applied && last.clip_coef < 1.0, "bench phase: step skipped or not clipped");
    restore_grads(st, arena);
    const double b = optim::seconds_of(unfused);
    STRATA_CHECK(last.applied && last.clip_coef < 1.0, "bench phase: step skipped or not clipped");
    const double after = optim::seconds_of(pass);
    if (r < 0) continue;
    best.before = std::min(best.before, before);
    best.a = std::min(best.a, a);
    best.b = std::min(best.b, b);
    best.after = std::min(best.after, after);
  }
  return best;
}

// One thread count's row of --mode update: AdamW's rate and its fraction of the memory pass's.
void print_update_row(const BenchAdamRun& run, int threads, const optim::BestSeconds& best) {
  const double n = static_cast<double>(run.n);
  const double adam_bytes = n * static_cast<double>(optim::adam_bytes_per_param(run.gdt));
  const double rate_before = n / best.before, rate_after = n / best.after, rate_a = n / best.a;
  const double roofline = 0.5 * (rate_before + rate_after);
  const double fraction = rate_a / roofline;
  const double fraction_faster = rate_a / std::max(rate_before, rate_after);
  if (run.args.json) {
    nlohmann::json j = {{"mode", "update"},
                        {"params", run.n},
                        {"threads", threads},
                        {"grad_dtype", dtype_name(run.gdt)},
                        {"simd", simd_level_name(run.simd)},
                        {"reps", run.reps},
                        {"params_per_s", rate_a},
                        {"gbps", adam_bytes / best.a / 1e9},
                        {"roofline_params_per_s", roofline},
                        {"roofline_before_params_per_s", rate_before},
                        {"roofline_after_params_per_s", rate_after},
                        {"roofline_fraction", fraction},
                        {"roofline_fraction_of_faster_pass", fraction_faster}};
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("{:>7}  {:>14.1f}  {:>8.2f}  {:>17.1f}  {:>17.1f}  {:>13.3f}  {:>15.3f}\n", threads, rate_a / 1e6,
               adam_bytes / best.a / 1e9, rate_before / 1e6, rate_after / 1e6, fraction, fraction_faster);
  }
}

// One thread count's row of --mode phase: the fused phase beside the separate passes and the memory pass.
void print_phase_row(const BenchAdamRun& run, int threads, const optim::BestSeconds& best) {
  const double n = static_cast<double>(run.n);
  const double rate_before = n / best.before, rate_after = n / best.after, rate_a = n / best.a;
  const double roofline = 0.5 * (rate_before + rate_after);
  const double rate_b = n / best.b;
  if (run.args.json) {
    nlohmann::json j = {{"mode", "phase"},
                        {"params", run.n},
                        {"threads", threads},
                        {"grad_dtype", dtype_name(run.gdt)},
                        {"simd", simd_level_name(run.simd)},
                        {"reps", run.reps},
                        {"params_per_s", rate_a},
                        {"separate_passes_params_per_s", rate_b},
                        {"fused_over_separate", rate_a / rate_b},
                        {"roofline_params_per_s", roofline},
                        {"roofline_before_params_per_s", rate_before},
                        {"roofline_after_params_per_s", rate_after},
                        {"roofline_fraction", rate_a / roofline}};
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("{:>7}  {:>16.1f}  {:>19.1f}  {:>10.2f}  {:>17.1f}  {:>17.1f}\n", threads, rate_a / 1e6,
               rate_b / 1e6, rate_a / rate_b, rate_before / 1e6, rate_after / 1e6);
  }
}

int run_bench_adam(const BenchAdamArgs& args) {
  const BenchAdamPlan plan = check_args(args);
  const bool phase = plan.phase;
  const optim::YardstickRun run_kind = phase ? optim::YardstickRun::Phase : optim::YardstickRun::Update;
  const int max_threads = plan.max_threads;
  optim::YardstickShard st;
  st.n = plan.n;
  st.grad_dtype = plan.gdt;
  optim::allocate_yardstick_shard(st, {"--params " + args.params, "use a smaller --params"}, run_kind);
  const int reps = args.reps > 0 ? args.reps : (st.n <= 20'000'000 ? 20 : (st.n <= 200'000'000 ? 8 : 3));
  const SimdLevel simd = simd_level();
  const float loss_scale = 1024.0f;
  {
    tbb::task_arena widest(std::max(max_threads, args.threads));
    // Gradients as they arrive in fp16 training: scaled by the loss scale; |g| ~ 1e-3 unscaled, so
    // the global norm is ~ 1e-3 * sqrt(n / 3), twice time_phase's max_grad_norm: clipping is active.
    optim::fill_yardstick_shard(st, phase ? 1e-3f * loss_scale : 1e-3f, widest);
  }

  std::vector<int> thread_counts;
  if (args.threads > 0) {
    thread_counts.push_back(args.threads);
  } else {
    for (int t = 1; t <= max_threads; ++t) thread_counts.push_back(t);
  }
  const optim::OptimShard shard = st.shard(run_kind);
  const BenchAdamRun run{args, st.n, plan.gdt, simd, reps};
  if (!args.json) print_header(run, phase);

  for (int threads : thread_counts) {
    tbb::task_arena arena(threads);
    const optim::CpuExec exec{simd, &arena};
    if (!phase) {
      print_update_row(run, threads, optim::time_adam_between_passes(shard, exec, reps));
    } else {
      print_phase_row(run, threads, time_phase(st, shard, arena, exec, reps));
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

void register_bench_adam(CLI::App& bench, CommandTable& table) {
  auto args = std::make_shared<BenchAdamArgs>();
  auto* cmd = bench.add_subcommand("adam", "CPU AdamW params/s beside the Adam-shaped memory pass (same run)");
  cmd->add_option("--params", args->params, "parameters per run: 10M, 100M, 1B, ...")->capture_default_str();
  cmd->add_option("--threads", args->threads, "threads (default: sweep 1..all cores)");
  cmd->add_option("--grad-dtype", args->grad_dtype, "gradient type: fp32, bf16 or fp16")->capture_default_str();
  cmd->add_option("--mode", args->mode,
                  "update: bare AdamW vs the memory pass; phase: fused optimizer phase vs separate passes")
      ->capture_default_str();
  cmd->add_option("--reps", args->reps, "repetitions per figure, best taken (default by size)");
  cmd->add_flag("--json", args->json, "one JSON object per thread count");
  table[cmd] = [args]() -> int { return run_bench_adam(*args); };
}

}  // namespace strata::bench
