// `strata bench adam`: CPU optimizer throughput beside its same-run yardstick.
//
// --mode update (default) times the bare AdamW update (optim::adam_step) over --params fp32
// parameters, for each thread count 1..N (or --threads N) in a tbb::task_arena of that size, and
// next to it the Adam-shaped memory pass (optim/memory_pass.h: the same streams, same SIMD level,
// blocks and threads, trivial math), which no CPU Adam can beat. A shared machine's memory
// bandwidth moves from one second to the next (docs/MEASUREMENTS.md), so every repetition runs
// pass, Adam, pass back to back, each figure is the best of the repetitions, and the fraction is
// taken against the mean of the pass before and the pass after (both printed; also against the
// faster one).
//
// --mode phase times the whole optimizer phase with a dynamic loss scale and gradient clipping:
// the fused phase (optim::fused_optimizer_phase: one norm/non-finite pass over the gradients + one
// pass doing unscale + clip + AdamW + bf16 copy) beside the same work as six separate parallel
// passes the way DeepSpeed's offload optimizer does it (optim::unfused_optimizer_phase: unscale,
// non-finite scan, norm, clip, AdamW, fp32 -> bf16 copy). Gradients are restored before every
// repetition (untimed), because the unfused phase scales them in place.
//
// Rates are parameters per second; GB/s counts the bytes the kernel must move (1e9 bytes/s).
#include <unistd.h>

#include <tbb/info.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/host_buffer.h"
#include "core/units.h"
#include "optim/memory_pass.h"
#include "optim/optimizer.h"
#include "optim/optimizer_phase.h"
#include "tools/commands.h"

namespace strata::tools {
namespace {

struct BenchAdamArgs {
  std::string params = "100M";
  int threads = 0;  // 0: sweep 1..N
  std::string grad_dtype = "fp32";
  std::string mode = "update";
  int reps = 0;  // 0: by size
  bool json = false;
};

// Deterministic cheap fill (splitmix64): the values only need to be realistic, not random.
float hash_unit(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<float>(x >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
}

// The buffers of one shard, in (transparent) huge-page host memory, first touched by the threads
// of the widest arena so pages are spread like they would be in training.
struct BenchState {
  std::size_t n = 0;
  DType grad_dtype = DType::F32;
  HostBuffer p, m, v, g, g_pristine, out, scratch;

  optim::OptimShard shard(bool with_out) const {
    optim::OptimShard s;
    s.master = p.as<float>().subspan(0, n);
    s.moment1 = m.as<float>().subspan(0, n);
    s.moment2 = v.as<float>().subspan(0, n);
    s.grad = optim::GradRef{g.data(), grad_dtype};
    if (with_out) s.out = optim::LowPrecisionOut{out.data(), DType::BF16};
    return s;
  }
};

HostBuffer alloc(std::size_t bytes) {
  HostBufferOptions options;
  options.huge_pages = HugePages::Transparent;
  return HostBuffer::allocate(bytes, options);
}

void fill_state(BenchState& st, float grad_magnitude, tbb::task_arena& arena) {
  const std::size_t gb = dtype_bytes(st.grad_dtype);
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, st.n, optim::kCpuBlockElems),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        float* p = st.p.as<float>().data();
                        float* m = st.m.as<float>().data();
                        float* v = st.v.as<float>().data();
                        for (std::size_t i = r.begin(); i != r.end(); ++i) {
                          p[i] = hash_unit(4 * i);
                          m[i] = 1e-3f * hash_unit(4 * i + 1);
                          v[i] = 1e-6f * std::fabs(hash_unit(4 * i + 2));
                          const float g = grad_magnitude * hash_unit(4 * i + 3);
                          auto* dst = static_cast<std::uint8_t*>(st.g.data()) + i * gb;
                          if (st.grad_dtype == DType::F32) {
                            std::memcpy(dst, &g, 4);
                          } else {
                            const std::uint16_t bits =
                                st.grad_dtype == DType::BF16 ? f32_to_bf16(g).bits : f32_to_f16(g).bits;
                            std::memcpy(dst, &bits, 2);
                          }
                        }
                        if (!st.out.empty()) std::memset(static_cast<std::uint16_t*>(st.out.data()) + r.begin(), 0, 2 * r.size());
                        if (!st.scratch.empty()) std::memset(st.scratch.as<float>().data() + r.begin(), 0, 4 * r.size());
                        if (!st.g_pristine.empty()) {
                          std::memcpy(static_cast<std::uint8_t*>(st.g_pristine.data()) + r.begin() * gb,
                                      static_cast<std::uint8_t*>(st.g.data()) + r.begin() * gb, r.size() * gb);
                        }
                      });
  });
}

// Restores the gradients the unfused phase scaled in place (untimed).
void restore_grads(BenchState& st, tbb::task_arena& arena) {
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

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::size_t available_memory_bytes() {
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
}

int run_bench_adam(const BenchAdamArgs& args) {
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

  BenchState st;
  st.n = static_cast<std::size_t>(n64);
  st.grad_dtype = gdt;
  const std::size_t gb = dtype_bytes(gdt);
  std::size_t need = st.n * (12 + gb);
  if (phase) need += st.n * (2 + gb + (gdt == DType::F32 ? 0 : 4));
  const std::size_t avail = available_memory_bytes();
  if (avail != 0 && need > avail) {
    throw ConfigError(fmt::format("--params {} needs {} of host memory but {} is available; use a smaller --params",
                                  args.params, format_bytes(need), format_bytes(avail)));
  }
  st.p = alloc(st.n * 4);
  st.m = alloc(st.n * 4);
  st.v = alloc(st.n * 4);
  st.g = alloc(st.n * gb);
  if (phase) {
    st.out = alloc(st.n * 2);
    st.g_pristine = alloc(st.n * gb);
    if (gdt != DType::F32) st.scratch = alloc(st.n * 4);
  }
  const int reps = args.reps > 0 ? args.reps : (st.n <= 20'000'000 ? 20 : (st.n <= 200'000'000 ? 8 : 3));
  const SimdLevel simd = simd_level();
  const float loss_scale = 1024.0f;
  {
    tbb::task_arena widest(std::max(max_threads, args.threads));
    // Gradients as they arrive in fp16 training: scaled by the loss scale; |g| ~ 1e-3 unscaled, so
    // the global norm (~ 1e-3 * sqrt(n / 3)) is above max_grad_norm = 1 and clipping is active.
    fill_state(st, phase ? 1e-3f * loss_scale : 1e-3f, widest);
  }

  std::vector<int> thread_counts;
  if (args.threads > 0) {
    thread_counts.push_back(args.threads);
  } else {
    for (int t = 1; t <= max_threads; ++t) thread_counts.push_back(t);
  }
  const optim::OptimShard shard = st.shard(phase);
  const double adam_bytes = static_cast<double>(st.n) * (24.0 + static_cast<double>(gb));

  if (!args.json) {
    fmt::print("strata bench adam --mode {}: {} parameters, gradients {}, SIMD {}, best of {} repetitions\n", args.mode,
               st.n, dtype_name(gdt), simd_level_name(simd), reps);
    if (!phase) {
      fmt::print("yardstick: Adam-shaped memory pass (read p,m,v,g; write p,m,v; {} bytes/param), run before and "
                 "after each AdamW repetition\n",
                 24 + gb);
      fmt::print("{:>7}  {:>14}  {:>8}  {:>17}  {:>17}  {:>13}  {:>15}\n", "threads", "AdamW Mparam/s", "GB/s",
                 "pass before Mp/s", "pass after Mp/s", "fraction/mean", "fraction/faster");
    } else {
      fmt::print("fused = norm+non-finite pass, then unscale+clip+AdamW+bf16-copy pass; separate = unscale, "
                 "non-finite scan, norm, clip, AdamW, bf16 copy (6 parallel passes)\n");
      fmt::print("{:>7}  {:>16}  {:>19}  {:>10}  {:>17}  {:>17}\n", "threads", "fused Mparam/s", "separate Mparam/s",
                 "fused/sep", "pass before Mp/s", "pass after Mp/s");
    }
  }

  for (int threads : thread_counts) {
    tbb::task_arena arena(threads);
    const optim::CpuExec exec{simd, &arena};
    auto pass = [&] { optim::adam_shaped_memory_pass({&shard, 1}, exec); };
    double best_before = 1e30, best_after = 1e30, best_a = 1e30, best_b = 1e30;
    if (!phase) {
      optim::AdamParams params;
      std::int64_t step = 1;
      auto adam = [&] {
        optim::adam_step(optim::make_adam_consts(params, step++, 1.0f), params.weight_decay_mode, {&shard, 1}, exec);
      };
      pass();  // warm-up: page faults, TBB workers
      adam();
      for (int r = 0; r < reps; ++r) {
        best_before = std::min(best_before, seconds_of(pass));
        best_a = std::min(best_a, seconds_of(adam));
        best_after = std::min(best_after, seconds_of(pass));
      }
    } else {
      optim::LossScalerConfig lc;
      lc.initial_scale_power = 10;  // = loss_scale above
      optim::LossScaler fused_scaler(lc), unfused_scaler(lc);
      optim::ParamGroup fused_group = optim::ParamGroup::adam("bench", optim::OptimizerKind::AdamW, optim::AdamParams{});
      optim::ParamGroup unfused_group = fused_group;
      const optim::PhaseOptions options{1.0};
      const std::span<float> g32 =
          gdt == DType::F32 ? st.g.as<float>().subspan(0, st.n) : st.scratch.as<float>().subspan(0, st.n);
      optim::PhaseResult last{};
      auto fused = [&] { last = optim::fused_optimizer_phase(fused_group, {&shard, 1}, &fused_scaler, options, exec); };
      auto unfused = [&] {
        last = optim::unfused_optimizer_phase(unfused_group, {&shard, 1}, {&g32, 1}, &unfused_scaler, options, exec);
      };
      for (int r = -1; r < reps; ++r) {  // r = -1: warm-up
        const double before = seconds_of(pass);
        restore_grads(st, arena);
        const double a = seconds_of(fused);
        STRATA_CHECK(last.applied && last.clip_coef < 1.0, "bench phase: step skipped or not clipped");
        restore_grads(st, arena);
        const double b = seconds_of(unfused);
        STRATA_CHECK(last.applied && last.clip_coef < 1.0, "bench phase: step skipped or not clipped");
        const double after = seconds_of(pass);
        if (r < 0) continue;
        best_before = std::min(best_before, before);
        best_a = std::min(best_a, a);
        best_b = std::min(best_b, b);
        best_after = std::min(best_after, after);
      }
    }
    const double n = static_cast<double>(st.n);
    const double rate_before = n / best_before, rate_after = n / best_after, rate_a = n / best_a;
    const double roofline = 0.5 * (rate_before + rate_after);
    if (!phase) {
      const double fraction = rate_a / roofline;
      const double fraction_faster = rate_a / std::max(rate_before, rate_after);
      if (args.json) {
        nlohmann::json j = {{"mode", "update"},
                            {"params", st.n},
                            {"threads", threads},
                            {"grad_dtype", dtype_name(gdt)},
                            {"simd", simd_level_name(simd)},
                            {"reps", reps},
                            {"params_per_s", rate_a},
                            {"gbps", adam_bytes / best_a / 1e9},
                            {"roofline_params_per_s", roofline},
                            {"roofline_before_params_per_s", rate_before},
                            {"roofline_after_params_per_s", rate_after},
                            {"roofline_fraction", fraction},
                            {"roofline_fraction_of_faster_pass", fraction_faster}};
        fmt::print("{}\n", j.dump());
      } else {
        fmt::print("{:>7}  {:>14.1f}  {:>8.2f}  {:>17.1f}  {:>17.1f}  {:>13.3f}  {:>15.3f}\n", threads, rate_a / 1e6,
                   adam_bytes / best_a / 1e9, rate_before / 1e6, rate_after / 1e6, fraction, fraction_faster);
      }
    } else {
      const double rate_b = n / best_b;
      if (args.json) {
        nlohmann::json j = {{"mode", "phase"},
                            {"params", st.n},
                            {"threads", threads},
                            {"grad_dtype", dtype_name(gdt)},
                            {"simd", simd_level_name(simd)},
                            {"reps", reps},
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

}  // namespace strata::tools
