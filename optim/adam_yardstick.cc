// The CPU Adam yardstick (optim/adam_yardstick.h).
#include "optim/adam_yardstick.h"

#include <unistd.h>

#include <tbb/info.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/units.h"
#include "optim/memory_pass.h"

namespace strata::optim {
namespace {

// Deterministic cheap fill (splitmix64): the values only need to be realistic, not random.
float hash_unit(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<float>(x >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
}

HostBuffer alloc(std::size_t bytes) {
  HostBufferOptions options;
  options.huge_pages = HugePages::Transparent;
  return HostBuffer::allocate(bytes, options);
}

std::size_t available_memory_bytes() {
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
}

}  // namespace

OptimShard YardstickShard::shard(YardstickRun run) const {
  OptimShard s;
  s.master = p.as<float>().subspan(0, n);
  s.moment1 = m.as<float>().subspan(0, n);
  s.moment2 = v.as<float>().subspan(0, n);
  s.grad = GradRef{g.data(), grad_dtype};
  if (run == YardstickRun::Phase) s.out = LowPrecisionOut{out.data(), DType::BF16};
  return s;
}

void allocate_yardstick_shard(YardstickShard& st, const ShardRequest& asked, YardstickRun run) {
  const bool phase = run == YardstickRun::Phase;
  const DType gdt = st.grad_dtype;
  const std::size_t gb = dtype_bytes(gdt);
  std::size_t need = st.n * (12 + gb);
  if (phase) need += st.n * (2 + gb + (gdt == DType::F32 ? 0 : 4));
  const std::size_t avail = available_memory_bytes();
  if (avail != 0 && need > avail) {
    throw ConfigError(fmt::format("{} needs {} of host memory but {} is available; {}", asked.what, format_bytes(need),
                                  format_bytes(avail), asked.fix));
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
}

void fill_yardstick_shard(YardstickShard& st, float grad_magnitude, tbb::task_arena& arena) {
  const std::size_t gb = dtype_bytes(st.grad_dtype);
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, st.n, kCpuBlockElems),
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

std::size_t adam_bytes_per_param(DType grad_dtype) { return 24 + dtype_bytes(grad_dtype); }

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

BestSeconds time_adam_between_passes(const OptimShard& shard, const CpuExec& exec, int reps) {
  auto pass = [&] { adam_shaped_memory_pass({&shard, 1}, exec); };
  BestSeconds best;
  AdamParams params;
  std::int64_t step = 1;
  auto adam = [&] { adam_step(make_adam_consts(params, step++, 1.0f), params.weight_decay_mode, {&shard, 1}, exec); };
  pass();  // warm-up: page faults, TBB workers
  adam();
  for (int r = 0; r < reps; ++r) {
    best.before = std::min(best.before, seconds_of(pass));
    best.a = std::min(best.a, seconds_of(adam));
    best.after = std::min(best.after, seconds_of(pass));
  }
  return best;
}

AdamRates measure_adam_rates(std::size_t params, int reps) {
  YardstickShard st;
  st.n = params;
  st.grad_dtype = DType::F32;
  allocate_yardstick_shard(st, {fmt::format("the CPU yardstick's AdamW over {} parameters", params),
                               "free host memory (it measures this host's Adam rate)"},
                           YardstickRun::Update);
  tbb::task_arena arena(tbb::info::default_concurrency());
  fill_yardstick_shard(st, 1e-3f, arena);
  const BestSeconds best =
      time_adam_between_passes(st.shard(YardstickRun::Update), CpuExec{simd_level(), &arena}, reps);
  const double n = static_cast<double>(params);
  AdamRates rates;
  rates.adam_params_per_s = n / best.a;
  rates.memory_gbps = n * static_cast<double>(adam_bytes_per_param(DType::F32)) / std::min(best.before, best.after) / 1e9;
  return rates;
}

}  // namespace strata::optim
