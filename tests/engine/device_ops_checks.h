// Shared checks of the engine's device ops (engine/device_ops.h), run by the sim suite
// (device_ops_test.cc) and the cuda suite (device_ops_cuda_test.cc) on whatever Device they make:
// each op goes through the Device API only (allocate, copy_h2d, the op, copy_d2h, synchronize)
// and is compared with a plain host reference of the same name (namespace `reference`), bit for
// bit. On cuda only the payload of a NaN may differ (NanBits::AnyNan), as device_ops.h allows.
//
// The inputs are chosen to make bit errors visible: random bit patterns for conversions (NaNs,
// infinities, denormals, rounding ties), finite values over a wide exponent range for the adds,
// and sizes around the block and chunk boundaries of the kernels.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "engine/device_ops.h"
#include "optim/cpu_exec.h"
#include "optim/grad_stats.h"
#include "optim/optimizer.h"

namespace strata::device_ops::testing {

using Bytes = std::vector<std::uint8_t>;

// 1, a thousand, exactly two blocks, a block and a bit, several blocks past one CPU chunk (64 Ki
// elements), and past convert_parallel's threshold (4 MiB on the larger side).
inline std::vector<std::size_t> op_sizes() {
  return {1,
          1000,
          2 * optim::kCpuBlockElems,
          optim::kCpuBlockElems + 3,
          5 * optim::kCpuBlockElems + 77,
          (std::size_t{1} << 20) + 5};
}

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> dtypes{DType::F32, DType::BF16, DType::F16};
  return dtypes;
}

// ---- The plain references ----------------------------------------------------------------------

namespace reference {

template <typename Src, typename Dst>
void convert_typed(const void* src, void* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    Src s;
    std::memcpy(&s, static_cast<const std::uint8_t*>(src) + i * sizeof(Src), sizeof(Src));
    const Dst d = from_f32<Dst>(to_f32(s));
    std::memcpy(static_cast<std::uint8_t*>(dst) + i * sizeof(Dst), &d, sizeof(Dst));
  }
}

template <typename Src>
void convert_from(const void* src, DType to, void* dst, std::size_t n) {
  switch (to) {
    case DType::F32: return convert_typed<Src, float>(src, dst, n);
    case DType::BF16: return convert_typed<Src, bf16>(src, dst, n);
    case DType::F16: return convert_typed<Src, fp16>(src, dst, n);
  }
}

// The scalar functions of core/dtype.h, one element at a time (a same-dtype convert copies bits,
// which from_f32(to_f32(x)) does too: widening is exact and a NaN stays that NaN, quieted).
inline void convert(const void* src, DType from, void* dst, DType to, std::size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * dtype_bytes(from));
    return;
  }
  switch (from) {
    case DType::F32: return convert_from<float>(src, to, dst, n);
    case DType::BF16: return convert_from<bf16>(src, to, dst, n);
    case DType::F16: return convert_from<fp16>(src, to, dst, n);
  }
}

inline void add_left(float* dst, const float* left, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = left[i] + dst[i];
}

// The definition: widen into a temporary, then add_left.
inline void convert_add_left(const void* src, DType src_dtype, float* dst, std::size_t n) {
  std::vector<float> t(n);
  convert(src, src_dtype, t.data(), DType::F32, n);
  add_left(dst, t.data(), n);
}

// optim::grad_stats of each block alone, scalar and serial.
inline std::vector<double> block_sum_squares(const float* grad, std::size_t n) {
  std::vector<double> out;
  for (std::size_t begin = 0; begin < n; begin += optim::kCpuBlockElems) {
    const optim::GradSpan span{grad + begin, DType::F32, std::min(optim::kCpuBlockElems, n - begin)};
    out.push_back(optim::grad_stats(std::span<const optim::GradSpan>(&span, 1), optim::CpuExec{}).sum_squares);
  }
  return out;
}

// ParamGroup::apply on host memory, scalar and serial.
inline void optimizer_update(const optim::ParamGroup& group, std::span<const optim::OptimShard> shards,
                             float grad_scale, std::int64_t step) {
  group.apply(shards, grad_scale, step, optim::CpuExec{});
}

}  // namespace reference

// ---- Inputs ------------------------------------------------------------------------------------

// Every bit pattern of the dtype, NaNs included.
inline Bytes random_bits(DType dtype, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n * dtype_bytes(dtype));
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return b;
}

// Finite fp32 values from denormals to 2^40, both signs, with some zeros of both signs.
inline std::vector<float> finite_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-148, 40);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float sign = (rng() & 1u) != 0 ? -1.0f : 1.0f;
    v[i] = (rng() % 97 == 0) ? sign * 0.0f : sign * std::ldexp(mantissa(rng), exponent(rng));
  }
  return v;
}

// Finite values of `dtype` (fp32 ones rounded), as its bytes.
inline Bytes finite_values(DType dtype, std::size_t n, std::uint32_t seed) {
  const std::vector<float> f = finite_floats(n, seed);
  Bytes b(n * dtype_bytes(dtype));
  reference::convert(f.data(), DType::F32, b.data(), dtype, n);
  // Values beyond fp16's range became infinities; keep the inputs finite.
  if (dtype == DType::F16) {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      if ((h & 0x7C00u) == 0x7C00u) h = static_cast<std::uint16_t>(h & 0x8000u);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

inline std::vector<float> normal_floats(std::size_t n, std::uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ---- Comparison --------------------------------------------------------------------------------

enum class NanBits { Exact, AnyNan };

inline bool is_nan_bits(DType dtype, std::uint32_t bits) {
  switch (dtype) {
    case DType::F32: return (bits & 0x7FFFFFFFu) > 0x7F800000u;
    case DType::BF16: return (bits & 0x7FFFu) > 0x7F80u;
    case DType::F16: return (bits & 0x7FFFu) > 0x7C00u;
  }
  return false;
}

inline std::uint32_t bits_at(const void* p, DType dtype, std::size_t i) {
  if (dtype == DType::F32) {
    std::uint32_t b;
    std::memcpy(&b, static_cast<const std::uint8_t*>(p) + 4 * i, 4);
    return b;
  }
  std::uint16_t b;
  std::memcpy(&b, static_cast<const std::uint8_t*>(p) + 2 * i, 2);
  return b;
}

// Bitwise equality; on failure names the count and the first differing element.
inline ::testing::AssertionResult same_bits(const void* got, const void* want, DType dtype, std::size_t n,
                                            const std::string& what, NanBits nan) {
  std::size_t bad = 0;
  std::size_t first = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t a = bits_at(got, dtype, i);
    const std::uint32_t b = bits_at(want, dtype, i);
    if (a == b || (nan == NanBits::AnyNan && is_nan_bits(dtype, a) && is_nan_bits(dtype, b))) continue;
    if (bad == 0) first = i;
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream text;
  text << what << " (" << dtype_name(dtype) << "): " << bad << " of " << n << " elements differ; first at " << first
       << ": 0x" << std::hex << bits_at(got, dtype, first) << " vs reference 0x" << bits_at(want, dtype, first);
  return ::testing::AssertionFailure() << text.str();
}

inline ::testing::AssertionResult same_bits(const std::vector<double>& got, const std::vector<double>& want,
                                            const std::string& what, NanBits nan) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << what << ": " << got.size() << " values vs " << want.size();
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    std::uint64_t a, b;
    std::memcpy(&a, &got[i], 8);
    std::memcpy(&b, &want[i], 8);
    if (a == b || (nan == NanBits::AnyNan && std::isnan(got[i]) && std::isnan(want[i]))) continue;
    std::ostringstream text;
    text.precision(17);
    text << what << ": value " << i << " is " << got[i] << " (0x" << std::hex << a << std::dec << "), reference "
         << want[i] << " (0x" << std::hex << b << ")";
    return ::testing::AssertionFailure() << text.str();
  }
  return ::testing::AssertionSuccess();
}

// ---- The rig: a device and a stream, and moving bytes through them ------------------------------

struct Rig {
  Device& device;
  Stream& stream;
  NanBits nan;

  // Device memory holding a copy of `host` (which must live until the next synchronize).
  DeviceMemory upload(const void* host, std::size_t bytes, const char* tag = "test.device_ops") {
    DeviceMemory m = device.allocate(bytes, tag);
    stream.copy_h2d(m.data(), host, bytes);
    return m;
  }
  template <typename T>
  DeviceMemory upload(const std::vector<T>& host) {
    return upload(host.data(), host.size() * sizeof(T));
  }
  // Enqueues the copy back; valid after synchronize.
  void download(void* host, const DeviceMemory& m, std::size_t bytes) { stream.copy_d2h(host, m.data(), bytes); }
};

inline std::string label(const char* op, std::size_t n) { return std::string(op) + " n=" + std::to_string(n); }

// ---- The checks --------------------------------------------------------------------------------

inline void check_convert(Rig& rig, DType from, DType to, std::size_t n) {
  SCOPED_TRACE(label("convert", n) + " " + std::string(dtype_name(from)) + "->" + std::string(dtype_name(to)));
  const Bytes src = random_bits(from, n, static_cast<std::uint32_t>(n) * 3 + static_cast<std::uint32_t>(from));
  Bytes want(n * dtype_bytes(to));
  reference::convert(src.data(), from, want.data(), to, n);
  DeviceMemory d_src = rig.upload(src);
  DeviceMemory d_dst = rig.device.allocate(want.size(), "test.device_ops");
  convert(rig.stream, d_src.data(), from, d_dst.data(), to, n);
  Bytes got(want.size());
  rig.download(got.data(), d_dst, got.size());
  rig.stream.synchronize();
  EXPECT_TRUE(same_bits(got.data(), want.data(), to, n, "convert", rig.nan));
}

inline void check_add_left(Rig& rig, std::size_t n) {
  SCOPED_TRACE(label("add_left", n));
  const std::vector<float> left = finite_floats(n, static_cast<std::uint32_t>(n) + 1);
  std::vector<float> want = finite_floats(n, static_cast<std::uint32_t>(n) + 2);
  DeviceMemory d_left = rig.upload(left);
  DeviceMemory d_dst = rig.upload(want);
  rig.stream.synchronize();  // `want` is about to change under the pending upload
  reference::add_left(want.data(), left.data(), n);
  add_left(rig.stream, d_dst.as<float>(), d_left.as<float>(), n);
  std::vector<float> got(n);
  rig.download(got.data(), d_dst, n * sizeof(float));
  rig.stream.synchronize();
  EXPECT_TRUE(same_bits(got.data(), want.data(), DType::F32, n, "add_left", rig.nan));
}

inline void check_convert_add_left(Rig& rig, DType src_dtype, std::size_t n) {
  SCOPED_TRACE(label("convert_add_left", n) + " from " + std::string(dtype_name(src_dtype)));
  const Bytes src = finite_values(src_dtype, n, static_cast<std::uint32_t>(n) + 5);
  const std::vector<float> dst0 = finite_floats(n, static_cast<std::uint32_t>(n) + 6);
  std::vector<float> want = dst0;
  reference::convert_add_left(src.data(), src_dtype, want.data(), n);
  DeviceMemory d_src = rig.upload(src);
  DeviceMemory d_dst = rig.upload(dst0);
  convert_add_left(rig.stream, d_src.data(), src_dtype, d_dst.as<float>(), n);
  std::vector<float> got(n);
  rig.download(got.data(), d_dst, n * sizeof(float));
  rig.stream.synchronize();
  EXPECT_TRUE(same_bits(got.data(), want.data(), DType::F32, n, "convert_add_left", rig.nan));

  // The fused op equals its two-op form on the same stream, convert then add_left.
  DeviceMemory d_dst2 = rig.upload(dst0);
  DeviceMemory d_tmp = rig.device.allocate(n * sizeof(float), "test.device_ops");
  convert(rig.stream, d_src.data(), src_dtype, d_tmp.data(), DType::F32, n);
  add_left(rig.stream, d_dst2.as<float>(), d_tmp.as<float>(), n);
  std::vector<float> two_ops(n);
  rig.download(two_ops.data(), d_dst2, n * sizeof(float));
  rig.stream.synchronize();
  EXPECT_TRUE(same_bits(got.data(), two_ops.data(), DType::F32, n, "convert_add_left vs convert + add_left",
                        NanBits::Exact));
}

// `poison`: put an infinity in the second block and a NaN in the last, to check that a non-finite
// block partial stays in its block.
enum class Poison { No, Yes };

// A 16-bit gradient (`dtype`) gives the bits of its exact fp32 widening.
inline void check_block_sum_squares(Rig& rig, std::size_t n, Poison poison, DType dtype = DType::F32) {
  SCOPED_TRACE(label("block_sum_squares", n) + " " + std::string(dtype_name(dtype)) +
               (poison == Poison::Yes ? " with inf/nan" : ""));
  std::vector<float> grad = normal_floats(n, static_cast<std::uint32_t>(n) + 9, 3e-3f);
  if (poison == Poison::Yes) {
    // The first element of the second block (n = kCpuBlockElems + 3 puts it and the NaN in one block).
    if (n > optim::kCpuBlockElems) grad[optim::kCpuBlockElems] = INFINITY;
    grad[n - 1] = NAN;
  }
  std::vector<std::byte> stored(n * dtype_bytes(dtype));
  reference::convert(grad.data(), DType::F32, stored.data(), dtype, n);
  reference::convert(stored.data(), dtype, grad.data(), DType::F32, n);  // what the op sees, widened
  const std::vector<double> want = reference::block_sum_squares(grad.data(), n);
  ASSERT_EQ(want.size(), sum_squares_blocks(n));
  DeviceMemory d_grad = rig.upload(stored);
  std::vector<double> got(want.size(), -1.0);
  DeviceMemory d_out = rig.upload(got);  // -1 everywhere: every partial must be written
  block_sum_squares(rig.stream, d_grad.data(), dtype, n, d_out.as<double>());
  rig.download(got.data(), d_out, got.size() * sizeof(double));
  rig.stream.synchronize();
  EXPECT_TRUE(same_bits(got, want, "block_sum_squares", rig.nan));
  // In block order, the partials add up to grad_stats over the whole buffer.
  double total = 0.0;
  for (double p : got) total += p;
  const optim::GradSpan all{grad.data(), DType::F32, n};
  const double whole = optim::grad_stats(std::span<const optim::GradSpan>(&all, 1), optim::CpuExec{}).sum_squares;
  EXPECT_TRUE(same_bits(std::vector<double>{total}, std::vector<double>{whole}, "sum of the block partials",
                        NanBits::AnyNan));
}

// The exact sum of squares (Note [Exact sum of squares] in optim/exact_squares.h) equals one accumulator fed the
// widened values one by one, word for word; with `poison`, it counts the infinity and the NaN.
inline void check_exact_sum_squares(Rig& rig, std::size_t n, Poison poison, DType dtype = DType::F32) {
  SCOPED_TRACE(label("exact_sum_squares", n) + " " + std::string(dtype_name(dtype)) +
               (poison == Poison::Yes ? " with inf/nan" : ""));
  std::vector<float> grad = normal_floats(n, static_cast<std::uint32_t>(n) + 11, 3e-3f);
  if (poison == Poison::Yes) {
    grad[n / 2] = INFINITY;
    grad[n - 1] = NAN;
  }
  std::vector<std::byte> stored(n * dtype_bytes(dtype));
  reference::convert(grad.data(), DType::F32, stored.data(), dtype, n);
  reference::convert(stored.data(), dtype, grad.data(), DType::F32, n);  // what the op sees, widened
  optim::ExactSquares want;
  for (float x : grad) want.add(x);
  want.normalize();
  DeviceMemory d_grad = rig.upload(stored);
  std::vector<optim::ExactSquares> parts(exact_sum_squares_parts(n));
  ASSERT_EQ(parts.size(), 1u);
  // The buffer starts as garbage (as a reused one does): the op must not add to what it holds.
  std::memset(static_cast<void*>(parts.data()), 0x5A, parts.size() * sizeof(optim::ExactSquares));
  DeviceMemory d_parts = rig.upload(parts);
  exact_sum_squares(rig.stream, d_grad.data(), dtype, n, d_parts.as<optim::ExactSquares>());
  rig.download(parts.data(), d_parts, parts.size() * sizeof(optim::ExactSquares));
  rig.stream.synchronize();
  optim::ExactSquares got;
  for (const optim::ExactSquares& p : parts) got.merge(p);
  EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << "exact sums differ: " << got.value() << " vs " << want.value();
  EXPECT_EQ(got.non_finite, poison == Poison::Yes ? (n > 1 ? 2u : 1u) : 0u);
  if (poison == Poison::No) {
    EXPECT_GT(got.value(), 0.0);
  }
}

// ---- optimizer_update ---------------------------------------------------------------------------

enum class OutMode { None, BF16, F16, Mixed };

struct OptimCase {
  std::string name;
  optim::ParamGroup group;
  OutMode out = OutMode::None;
  std::int64_t step = 3;
};

// gtest prints a parameter in failure messages and `ctest -N`; the name says it all.
inline void PrintTo(const OptimCase& c, std::ostream* os) { *os << c.name; }

inline std::vector<OptimCase> optim_cases() {
  optim::AdamParams adam;
  adam.lr = 3e-3;
  adam.weight_decay = 0.05;
  optim::SgdParams sgd_momentum;
  sgd_momentum.lr = 0.05;
  sgd_momentum.momentum = 0.9;
  sgd_momentum.weight_decay = 0.01;
  optim::SgdParams sgd_nesterov = sgd_momentum;
  sgd_nesterov.nesterov = true;
  optim::SgdParams sgd_plain;
  sgd_plain.lr = 0.05;
  optim::LionParams lion;
  lion.lr = 1e-3;
  lion.weight_decay = 0.1;
  const auto adamw = optim::ParamGroup::adam("adamw", optim::OptimizerKind::AdamW, adam);
  const auto adam_l2 = optim::ParamGroup::adam("adam", optim::OptimizerKind::Adam, adam);
  const auto sgd_m = optim::ParamGroup::sgd("sgd_momentum", sgd_momentum);
  const auto sgd_n = optim::ParamGroup::sgd("sgd_nesterov", sgd_nesterov);
  const auto sgd_p = optim::ParamGroup::sgd("sgd_plain", sgd_plain);
  const auto lion_g = optim::ParamGroup::lion("lion", lion);
  return {
      {"AdamW", adamw, OutMode::None, 3},      {"AdamW_bf16", adamw, OutMode::BF16, 3},
      {"AdamW_f16", adamw, OutMode::F16, 1},   {"AdamW_mixed", adamw, OutMode::Mixed, 7},
      {"Adam", adam_l2, OutMode::None, 2},     {"Adam_bf16", adam_l2, OutMode::BF16, 3},
      {"Adam_mixed", adam_l2, OutMode::Mixed, 3},
      {"SGD_momentum_first_step_bf16", sgd_m, OutMode::BF16, 1},
      {"SGD_momentum", sgd_m, OutMode::None, 4},
      {"SGD_nesterov_mixed", sgd_n, OutMode::Mixed, 2},
      {"SGD_plain", sgd_p, OutMode::None, 2},  {"SGD_plain_f16", sgd_p, OutMode::F16, 2},
      {"Lion", lion_g, OutMode::None, 3},      {"Lion_bf16", lion_g, OutMode::BF16, 3},
      {"Lion_mixed", lion_g, OutMode::Mixed, 5},
  };
}

// One shard's host buffers. Sizes and gradient dtypes differ from shard to shard.
struct HostShard {
  std::vector<float> master, moment1, moment2;
  Bytes grad;
  DType grad_dtype = DType::F32;
  Bytes out;
  DType out_dtype = DType::BF16;
  bool has_out = false;

  std::size_t elems() const { return master.size(); }
  optim::OptimShard view() {
    optim::OptimShard s;
    s.master = master;
    s.moment1 = moment1;
    s.moment2 = moment2;
    s.grad = optim::GradRef{grad.data(), grad_dtype};
    if (has_out) s.out = optim::LowPrecisionOut{out.data(), out_dtype};
    return s;
  }
};

inline std::vector<HostShard> make_shards(const OptimCase& c) {
  const std::size_t sizes[] = {1, 1000, optim::kCpuBlockElems + 3, 3 * optim::kCpuBlockElems + 77};
  const DType grads[] = {DType::F32, DType::BF16, DType::F16, DType::BF16};
  const bool adam = c.group.kind() == optim::OptimizerKind::AdamW || c.group.kind() == optim::OptimizerKind::Adam;
  const bool moment1 = c.group.kind() != optim::OptimizerKind::Sgd || c.group.sgd_params().momentum != 0.0;
  std::vector<HostShard> shards(4);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    HostShard& s = shards[i];
    const std::size_t n = sizes[i];
    const auto seed = static_cast<std::uint32_t>(100 + 10 * i);
    s.master = normal_floats(n, seed, 1.0f);
    if (moment1) s.moment1 = normal_floats(n, seed + 1, 1e-2f);
    if (adam) {
      s.moment2 = normal_floats(n, seed + 2, 1e-4f);
      for (float& v : s.moment2) v = std::fabs(v);
    }
    s.grad_dtype = grads[i];
    const std::vector<float> g = normal_floats(n, seed + 3, 1e-2f);
    s.grad.resize(n * dtype_bytes(s.grad_dtype));
    reference::convert(g.data(), DType::F32, s.grad.data(), s.grad_dtype, n);
    switch (c.out) {
      case OutMode::None: break;
      case OutMode::BF16: s.has_out = true, s.out_dtype = DType::BF16; break;
      case OutMode::F16: s.has_out = true, s.out_dtype = DType::F16; break;
      case OutMode::Mixed: {
        const DType mixed[] = {DType::BF16, DType::F32, DType::F16, DType::BF16};  // F32: no copy
        s.has_out = mixed[i] != DType::F32;
        s.out_dtype = s.has_out ? mixed[i] : DType::BF16;
        break;
      }
    }
    if (s.has_out) s.out.assign(n * dtype_bytes(s.out_dtype), 0xA5);  // stale bytes the update overwrites
  }
  return shards;
}

inline bool cuda_has_kernel(const optim::ParamGroup& group) {
  return group.kind() == optim::OptimizerKind::AdamW || group.kind() == optim::OptimizerKind::Adam;
}

inline void check_optimizer_update(Rig& rig, const OptimCase& c) {
  SCOPED_TRACE("optimizer_update " + c.name + " step " + std::to_string(c.step));
  const float grad_scale = 0.5f;
  std::vector<HostShard> host = make_shards(c);
  std::vector<HostShard> want = host;
  {
    std::vector<optim::OptimShard> views;
    for (HostShard& s : want) views.push_back(s.view());
    reference::optimizer_update(c.group, views, grad_scale, c.step);
  }

  // The same buffers in device memory, and shards over them.
  std::vector<DeviceMemory> keep;
  std::vector<optim::OptimShard> device_shards;
  auto upload_floats = [&](std::vector<float>& v) -> std::span<float> {
    if (v.empty()) return {};
    keep.push_back(rig.upload(v));
    return std::span<float>(keep.back().as<float>(), v.size());
  };
  for (HostShard& s : host) {
    optim::OptimShard d;
    d.master = upload_floats(s.master);
    d.moment1 = upload_floats(s.moment1);
    d.moment2 = upload_floats(s.moment2);
    keep.push_back(rig.upload(s.grad));
    d.grad = optim::GradRef{keep.back().data(), s.grad_dtype};
    if (s.has_out) {
      keep.push_back(rig.upload(s.out));
      d.out = optim::LowPrecisionOut{keep.back().data(), s.out_dtype};
    }
    device_shards.push_back(d);
  }
  rig.stream.synchronize();

  if (rig.device.kind() == DeviceKind::Cuda && !cuda_has_kernel(c.group)) {
    try {
      optimizer_update(rig.stream, c.group, device_shards, grad_scale, c.step);
      ADD_FAILURE() << c.name << " on cuda must say it is not wired yet";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("not wired for cuda yet"), std::string::npos) << e.what();
    }
    return;
  }

  optimizer_update(rig.stream, c.group, device_shards, grad_scale, c.step);
  for (std::size_t i = 0; i < host.size(); ++i) {
    HostShard& s = host[i];
    const optim::OptimShard& d = device_shards[i];
    const std::size_t n = s.elems();
    rig.stream.copy_d2h(s.master.data(), d.master.data(), n * sizeof(float));
    if (!s.moment1.empty()) rig.stream.copy_d2h(s.moment1.data(), d.moment1.data(), n * sizeof(float));
    if (!s.moment2.empty()) rig.stream.copy_d2h(s.moment2.data(), d.moment2.data(), n * sizeof(float));
    if (s.has_out) rig.stream.copy_d2h(s.out.data(), d.out.data, s.out.size());
  }
  rig.stream.synchronize();
  for (std::size_t i = 0; i < host.size(); ++i) {
    const HostShard& got = host[i];
    const HostShard& ref = want[i];
    const std::size_t n = got.elems();
    const std::string shard = "shard " + std::to_string(i) + " (grad " + std::string(dtype_name(got.grad_dtype)) + ")";
    EXPECT_TRUE(same_bits(got.master.data(), ref.master.data(), DType::F32, n, shard + " master", rig.nan));
    EXPECT_TRUE(same_bits(got.moment1.data(), ref.moment1.data(), DType::F32, got.moment1.size(),
                          shard + " moment1", rig.nan));
    EXPECT_TRUE(same_bits(got.moment2.data(), ref.moment2.data(), DType::F32, got.moment2.size(),
                          shard + " moment2", rig.nan));
    if (got.has_out) {
      EXPECT_TRUE(same_bits(got.out.data(), ref.out.data(), got.out_dtype, n, shard + " low-precision copy", rig.nan));
    }
  }
}

}  // namespace strata::device_ops::testing
