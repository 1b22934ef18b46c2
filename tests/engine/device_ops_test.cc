// The engine's device ops (engine/device_ops.h) on a sim device: every op against its plain host
// reference, bit for bit, over odd sizes, every dtype pair and every optimizer (the checks are in
// device_ops_checks.h, shared with the cuda suite device_ops_cuda_test.cc); each op runs on the
// stream, in order behind earlier work, and its result shows only once the stream got there;
// optimizer_update takes the hyper-parameters of the moment it was enqueued; bad shards fail at
// enqueue time; and a stream of kind cuda takes the cuda branch of the dispatch (a DeviceError
// naming the op on this GPU-less machine, "not wired for cuda yet" for SGD and Lion).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/device/sim_kernel.h"
#include "core/error.h"
#include "core/units.h"
#include "engine/device_ops.h"
#include "tests/core/sim_device_test_util.h"
#include "tests/engine/device_ops_checks.h"
#include "tests/engine/device_ops_suites.h"

namespace strata::device_ops {
namespace {

using testing::Bytes;
using testing::NanBits;
using testing::Rig;
using testing_sim::Gate;

class SimDeviceOps : public ::testing::Test {
 protected:
  SimDeviceOps() {
    SimDeviceOptions o;
    o.capacity_bytes = 256 * MiB;
    device_ = make_sim_device(o);
    stream_ = device_->create_stream("device_ops");
  }

  Rig rig() { return Rig{*device_, *stream_, NanBits::Exact}; }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
};

// ---- Each op against its reference -------------------------------------------------------------

STRATA_DEVICE_OPS_REFERENCE_SUITES(SimDeviceOps, DeviceOps, device_ops, UpdateMatchesParamGroupApply);

// ---- Stream order ------------------------------------------------------------------------------

enum class Op { Convert, AddLeft, ConvertAddLeft, BlockSumSquares, ExactSumSquares, OptimizerUpdate };

const char* op_name(Op op) {
  switch (op) {
    case Op::Convert: return "convert";
    case Op::AddLeft: return "add_left";
    case Op::ConvertAddLeft: return "convert_add_left";
    case Op::BlockSumSquares: return "block_sum_squares";
    case Op::ExactSumSquares: return "exact_sum_squares";
    case Op::OptimizerUpdate: return "optimizer_update";
  }
  return "?";
}

void PrintTo(Op op, std::ostream* os) { *os << op_name(op); }

const std::vector<Op>& all_ops() {
  static const std::vector<Op> ops{Op::Convert, Op::AddLeft, Op::ConvertAddLeft, Op::BlockSumSquares,
                                   Op::ExactSumSquares, Op::OptimizerUpdate};
  return ops;
}

std::string op_param_name(const ::testing::TestParamInfo<Op>& info) { return op_name(info.param); }

optim::ParamGroup adamw_group(double lr) {
  optim::AdamParams p;
  p.lr = lr;
  return optim::ParamGroup::adam("order", optim::OptimizerKind::AdamW, p);
}

// One op's inputs in sim device memory (host memory, so the test reads and writes it directly),
// the op itself, where its result lands and what the reference says it must be.
struct PendingOp {
  std::vector<DeviceMemory> keep;
  std::function<void(Stream&)> enqueue;
  const void* result = nullptr;
  std::size_t result_bytes = 0;
  Bytes expected;

  Bytes read() const {
    const auto* p = static_cast<const std::uint8_t*>(result);
    return Bytes(p, p + result_bytes);
  }
};

DeviceMemory sim_copy(Device& device, const void* host, std::size_t bytes) {
  DeviceMemory m = device.allocate(bytes, "test.device_ops");
  std::memcpy(m.data(), host, bytes);
  return m;
}

template <typename T>
Bytes as_bytes(const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
  return Bytes(p, p + v.size() * sizeof(T));
}

std::unique_ptr<PendingOp> make_pending(Op op, Device& device) {
  const std::size_t n = optim::kCpuBlockElems + 3;
  auto p = std::make_unique<PendingOp>();
  const std::vector<float> a = testing::finite_floats(n, 1);
  const std::vector<float> b = testing::finite_floats(n, 2);
  switch (op) {
    case Op::Convert: {
      Bytes want(n * 2);
      testing::reference::convert(a.data(), DType::F32, want.data(), DType::BF16, n);
      p->keep.push_back(sim_copy(device, a.data(), n * 4));
      p->keep.push_back(sim_copy(device, Bytes(n * 2, 0).data(), n * 2));
      const void* src = p->keep[0].data();
      void* dst = p->keep[1].data();
      p->enqueue = [=](Stream& s) { convert(s, src, DType::F32, dst, DType::BF16, n); };
      p->result = dst;
      p->expected = want;
      break;
    }
    case Op::AddLeft: {
      std::vector<float> want = b;
      testing::reference::add_left(want.data(), a.data(), n);
      p->keep.push_back(sim_copy(device, a.data(), n * 4));
      p->keep.push_back(sim_copy(device, b.data(), n * 4));
      const float* left = p->keep[0].as<float>();
      float* dst = p->keep[1].as<float>();
      p->enqueue = [=](Stream& s) { add_left(s, dst, left, n); };
      p->result = dst;
      p->expected = as_bytes(want);
      break;
    }
    case Op::ConvertAddLeft: {
      const Bytes src = testing::finite_values(DType::F16, n, 3);
      std::vector<float> want = b;
      testing::reference::convert_add_left(src.data(), DType::F16, want.data(), n);
      p->keep.push_back(sim_copy(device, src.data(), src.size()));
      p->keep.push_back(sim_copy(device, b.data(), n * 4));
      const void* s16 = p->keep[0].data();
      float* dst = p->keep[1].as<float>();
      p->enqueue = [=](Stream& s) { convert_add_left(s, s16, DType::F16, dst, n); };
      p->result = dst;
      p->expected = as_bytes(want);
      break;
    }
    case Op::BlockSumSquares: {
      const std::vector<double> before(sum_squares_blocks(n), -1.0);
      p->keep.push_back(sim_copy(device, a.data(), n * 4));
      p->keep.push_back(sim_copy(device, before.data(), before.size() * sizeof(double)));
      const float* grad = p->keep[0].as<float>();
      double* out = p->keep[1].as<double>();
      p->enqueue = [=](Stream& s) { block_sum_squares(s, grad, DType::F32, n, out); };
      p->result = out;
      p->expected = as_bytes(testing::reference::block_sum_squares(a.data(), n));
      break;
    }
    case Op::ExactSumSquares: {
      const optim::ExactSquares before;
      p->keep.push_back(sim_copy(device, a.data(), n * 4));
      p->keep.push_back(sim_copy(device, &before, sizeof before));
      const float* grad = p->keep[0].as<float>();
      auto* out = p->keep[1].as<optim::ExactSquares>();
      p->enqueue = [=](Stream& s) { exact_sum_squares(s, grad, DType::F32, n, out); };
      p->result = out;
      optim::ExactSquares want;
      for (float x : a) want.add(x);
      want.normalize();  // what the op writes: one normalized accumulator
      const auto* w = reinterpret_cast<const std::uint8_t*>(&want);
      p->expected = Bytes(w, w + sizeof want);
      break;
    }
    case Op::OptimizerUpdate: {
      const std::vector<float> m = testing::normal_floats(n, 4, 1e-2f);
      std::vector<float> v = testing::normal_floats(n, 5, 1e-4f);
      for (float& x : v) x = std::fabs(x);
      const std::vector<float> g = testing::normal_floats(n, 6, 1e-2f);
      const optim::ParamGroup group = adamw_group(1e-2);
      std::vector<float> want_p = a, want_m = m, want_v = v;
      optim::OptimShard host{want_p, want_m, want_v, optim::GradRef{g.data(), DType::F32}, {}};
      testing::reference::optimizer_update(group, std::span<const optim::OptimShard>(&host, 1), 1.0f, 1);
      for (const std::vector<float>* src : std::initializer_list<const std::vector<float>*>{&a, &m, &v, &g}) {
        p->keep.push_back(sim_copy(device, src->data(), n * 4));
      }
      optim::OptimShard shard{std::span<float>(p->keep[0].as<float>(), n), std::span<float>(p->keep[1].as<float>(), n),
                              std::span<float>(p->keep[2].as<float>(), n),
                              optim::GradRef{p->keep[3].data(), DType::F32}, {}};
      p->enqueue = [=](Stream& s) {
        optimizer_update(s, group, std::span<const optim::OptimShard>(&shard, 1), 1.0f, 1);
      };
      p->result = p->keep[0].data();
      p->expected = as_bytes(want_p);
      break;
    }
  }
  p->result_bytes = p->expected.size();
  return p;
}

// One call of any op over caller-given buffers (n elements each, fp32-sized; null when unused).
struct OpCall {
  float* a = nullptr;
  float* b = nullptr;
  float* c = nullptr;
  float* d = nullptr;
  double* sums = nullptr;
  optim::ExactSquares* exact = nullptr;
  std::size_t n = 0;
};

void enqueue_op(Op op, Stream& s, const OpCall& x) {
  switch (op) {
    case Op::Convert: convert(s, x.a, DType::F32, x.b, DType::BF16, x.n); return;
    case Op::AddLeft: add_left(s, x.b, x.a, x.n); return;
    case Op::ConvertAddLeft: convert_add_left(s, x.a, DType::BF16, x.b, x.n); return;
    case Op::BlockSumSquares: block_sum_squares(s, x.a, DType::F32, x.n, x.sums); return;
    case Op::ExactSumSquares: exact_sum_squares(s, x.a, DType::F32, x.n, x.exact); return;
    case Op::OptimizerUpdate: {
      // AdamW over a (master), b, c (moments) and d (gradient).
      const optim::OptimShard shard{std::span<float>(x.a, x.n), std::span<float>(x.b, x.b ? x.n : 0),
                                    std::span<float>(x.c, x.c ? x.n : 0), optim::GradRef{x.d, DType::F32}, {}};
      optimizer_update(s, adamw_group(1e-3), std::span<const optim::OptimShard>(&shard, 1), 1.0f, 1);
      return;
    }
  }
}

class DeviceOpsOrder : public SimDeviceOps, public ::testing::WithParamInterface<Op> {};

TEST_P(DeviceOpsOrder, RunsBehindEarlierWorkAndShowsAfterSynchronize) {
  std::unique_ptr<PendingOp> p = make_pending(GetParam(), *device_);
  const Bytes before = p->read();
  ASSERT_NE(before, p->expected) << "the test needs a result that differs from the initial contents";
  Gate gate;
  launch_sim_kernel(*stream_, [&gate] { gate.wait(); });
  p->enqueue(*stream_);
  // The stream is held at the gate: the op is enqueued behind it and cannot have run.
  EXPECT_EQ(p->read(), before) << op_name(GetParam()) << " ran on the caller's thread, not on the stream";
  gate.open();
  stream_->synchronize();
  EXPECT_EQ(p->read(), p->expected) << op_name(GetParam());
}

INSTANTIATE_TEST_SUITE_P(device_ops, DeviceOpsOrder, ::testing::ValuesIn(all_ops()), op_param_name);

// A chain with no synchronize in between, as the engine folds a reduced gradient of its working
// dtype into fp32 partial sums: each op reads what the one before it wrote.
class DeviceOpsChain : public SimDeviceOps, public ::testing::WithParamInterface<DType> {};

TEST_P(DeviceOpsChain, OpsReadWhatTheOpBeforeWrote) {
  const DType working = GetParam();
  const std::size_t n = 3 * optim::kCpuBlockElems + 11;
  const Bytes reduced = testing::finite_values(working, n, 7);
  const std::vector<float> left = testing::normal_floats(n, 8, 1.0f);
  std::vector<float> want(n);
  testing::reference::convert(reduced.data(), working, want.data(), DType::F32, n);
  testing::reference::add_left(want.data(), left.data(), n);
  testing::reference::convert_add_left(reduced.data(), working, want.data(), n);
  const std::vector<double> want_sums = testing::reference::block_sum_squares(want.data(), n);

  Rig r = rig();
  DeviceMemory d_reduced = r.upload(reduced);
  DeviceMemory d_left = r.upload(left);
  DeviceMemory d_acc = device_->allocate(n * sizeof(float), "test.device_ops");
  std::vector<double> sums(sum_squares_blocks(n), -1.0);
  DeviceMemory d_sums = device_->allocate(sums.size() * sizeof(double), "test.device_ops");
  convert(*stream_, d_reduced.data(), working, d_acc.data(), DType::F32, n);
  add_left(*stream_, d_acc.as<float>(), d_left.as<float>(), n);
  convert_add_left(*stream_, d_reduced.data(), working, d_acc.as<float>(), n);
  block_sum_squares(*stream_, d_acc.as<float>(), DType::F32, n, d_sums.as<double>());
  std::vector<float> got(n);
  r.download(got.data(), d_acc, n * sizeof(float));
  r.download(sums.data(), d_sums, sums.size() * sizeof(double));
  stream_->synchronize();
  EXPECT_TRUE(testing::same_bits(got.data(), want.data(), DType::F32, n, "chain", NanBits::Exact));
  EXPECT_TRUE(testing::same_bits(sums, want_sums, "chain sums", NanBits::Exact));
}

INSTANTIATE_TEST_SUITE_P(device_ops, DeviceOpsChain, ::testing::ValuesIn(testing::all_dtypes()),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

// The update uses the hyper-parameters of the moment it was enqueued, whatever the group does
// after, and leaves the group's step counter alone.
class DeviceOpsSnapshot : public SimDeviceOps, public ::testing::WithParamInterface<optim::OptimizerKind> {};

TEST_P(DeviceOpsSnapshot, OptimizerUpdateTakesTheGroupAsItWasAtEnqueue) {
  const std::size_t n = 1000;
  optim::ParamGroup group = adamw_group(1e-2);
  if (GetParam() == optim::OptimizerKind::Sgd) {
    optim::SgdParams sgd;
    sgd.momentum = 0.9;
    group = optim::ParamGroup::sgd("order", sgd);
  } else if (GetParam() == optim::OptimizerKind::Lion) {
    group = optim::ParamGroup::lion("order", optim::LionParams{});
  }
  const bool adam = GetParam() == optim::OptimizerKind::AdamW;
  const std::vector<float> p0 = testing::normal_floats(n, 11, 1.0f);
  const std::vector<float> m0 = testing::normal_floats(n, 12, 1e-2f);
  std::vector<float> v0 = testing::normal_floats(n, adam ? 13 : 0, 1e-4f);
  for (float& x : v0) x = std::fabs(x);
  if (!adam) v0.clear();
  const std::vector<float> g = testing::normal_floats(n, 14, 1e-2f);
  std::vector<float> want_p = p0, want_m = m0, want_v = v0;
  optim::OptimShard host{want_p, want_m, want_v, optim::GradRef{g.data(), DType::F32}, {}};
  testing::reference::optimizer_update(group, std::span<const optim::OptimShard>(&host, 1), 1.0f, 2);

  Rig r = rig();
  DeviceMemory dp = r.upload(p0), dm = r.upload(m0), dg = r.upload(g);
  DeviceMemory dv = adam ? r.upload(v0) : DeviceMemory{};
  stream_->synchronize();
  optim::OptimShard shard{std::span<float>(dp.as<float>(), n), std::span<float>(dm.as<float>(), n),
                          std::span<float>(dv.as<float>(), adam ? n : 0), optim::GradRef{dg.data(), DType::F32}, {}};
  Gate gate;
  launch_sim_kernel(*stream_, [&gate] { gate.wait(); });
  optimizer_update(*stream_, group, std::span<const optim::OptimShard>(&shard, 1), 1.0f, 2);
  group.set_lr(0.5);  // after the enqueue, before the update runs
  gate.open();
  std::vector<float> got(n);
  r.download(got.data(), dp, n * sizeof(float));
  stream_->synchronize();
  EXPECT_TRUE(testing::same_bits(got.data(), want_p.data(), DType::F32, n, "master", NanBits::Exact));
  EXPECT_EQ(group.step_count(), 0) << "optimizer_update must not advance the group's counter";
}

INSTANTIATE_TEST_SUITE_P(device_ops, DeviceOpsSnapshot,
                         ::testing::Values(optim::OptimizerKind::AdamW, optim::OptimizerKind::Sgd,
                                           optim::OptimizerKind::Lion),
                         [](const ::testing::TestParamInfo<optim::OptimizerKind>& info) {
                           return std::string(optim::optimizer_name(info.param));
                         });

// ---- Errors at enqueue time --------------------------------------------------------------------

enum class BadShard { Moment1Size, Moment2Size, Fp32Copy, NullGradient };

std::string bad_shard_name(const ::testing::TestParamInfo<BadShard>& info) {
  switch (info.param) {
    case BadShard::Moment1Size: return "Moment1Size";
    case BadShard::Moment2Size: return "Moment2Size";
    case BadShard::Fp32Copy: return "Fp32Copy";
    case BadShard::NullGradient: return "NullGradient";
  }
  return "?";
}

void PrintTo(BadShard bad, std::ostream* os) { *os << bad_shard_name(::testing::TestParamInfo<BadShard>(bad, 0)); }

class DeviceOpsBadShard : public SimDeviceOps, public ::testing::WithParamInterface<BadShard> {};

TEST_P(DeviceOpsBadShard, IsRefusedAtEnqueueAndLeavesTheStreamHealthy) {
  const std::size_t n = 100;
  DeviceMemory p = device_->allocate(n * 4, "t"), m = device_->allocate(n * 4, "t"), v = device_->allocate(n * 4, "t"),
               g = device_->allocate(n * 4, "t");
  const optim::ParamGroup group = adamw_group(1e-3);
  optim::OptimShard shard{std::span<float>(p.as<float>(), n), std::span<float>(m.as<float>(), n),
                          std::span<float>(v.as<float>(), n), optim::GradRef{g.data(), DType::F32}, {}};
  std::string expected;
  switch (GetParam()) {
    case BadShard::Moment1Size:
      shard.moment1 = shard.moment1.first(n - 1);
      expected = "moment1 has 99 elements but master has 100";
      break;
    case BadShard::Moment2Size:
      shard.moment2 = {};
      expected = "moment2 has 0 elements but master has 100";
      break;
    case BadShard::Fp32Copy:
      shard.out = optim::LowPrecisionOut{g.data(), DType::F32};
      expected = "must be bf16 or fp16, not fp32";
      break;
    case BadShard::NullGradient:
      shard.grad.data = nullptr;
      expected = "the gradient pointer is null for 100 elements";
      break;
  }
  Gate gate;
  launch_sim_kernel(*stream_, [&gate] { gate.wait(); });
  try {
    optimizer_update(*stream_, group, std::span<const optim::OptimShard>(&shard, 1), 1.0f, 1);
    ADD_FAILURE() << "a bad shard must be refused";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("param group 'order': AdamW shard 0"), std::string::npos) << what;
    EXPECT_NE(what.find(expected), std::string::npos) << what;
  }
  gate.open();
  EXPECT_NO_THROW(stream_->synchronize()) << "a refused op must not poison the stream";
}

INSTANTIATE_TEST_SUITE_P(device_ops, DeviceOpsBadShard,
                         ::testing::Values(BadShard::Moment1Size, BadShard::Moment2Size, BadShard::Fp32Copy,
                                           BadShard::NullGradient),
                         bad_shard_name);

class DeviceOpsEdges : public SimDeviceOps, public ::testing::WithParamInterface<Op> {};

TEST_P(DeviceOpsEdges, ZeroElementsEnqueueNothing) {
  Gate gate;
  launch_sim_kernel(*stream_, [&gate] { gate.wait(); });
  enqueue_op(GetParam(), *stream_, OpCall{});  // all pointers null: nothing may touch them
  gate.open();
  EXPECT_NO_THROW(stream_->synchronize());
  if (GetParam() == Op::BlockSumSquares) {
    EXPECT_EQ(sum_squares_blocks(0), 0u);
  }
}

TEST_P(DeviceOpsEdges, NullPointersAreRefusedAtEnqueue) {
  const std::size_t n = 10;
  DeviceMemory a = device_->allocate(n * 4, "t");
  OpCall call;
  call.a = a.as<float>();  // every op reads `a`; the rest stay null
  call.n = n;
  // The optimizer says which buffer of which shard (ConfigError), the array ops that a pointer is
  // null (a CHECK: the engine passes its own buffers).
  if (GetParam() == Op::OptimizerUpdate) {
    EXPECT_THROW(enqueue_op(GetParam(), *stream_, call), ConfigError);
  } else {
    EXPECT_THROW(enqueue_op(GetParam(), *stream_, call), InternalError);
  }
  EXPECT_NO_THROW(stream_->synchronize());
}

INSTANTIATE_TEST_SUITE_P(device_ops, DeviceOpsEdges, ::testing::ValuesIn(all_ops()), op_param_name);

// ---- The cuda branch of the dispatch, without a GPU -------------------------------------------

// A device of kind cuda over sim memory, whose streams have no cudaStream_t: what the dispatch does
// with a cuda stream it cannot launch on, testable on any machine. Work that reaches the inner sim
// stream is counted: a refused op must enqueue nothing.
class FakeCudaDevice;

class FakeCudaStream : public Stream {
 public:
  FakeCudaStream(FakeCudaDevice& device, std::unique_ptr<Stream> inner) : device_(device), inner_(std::move(inner)) {}
  Device& device() override;
  const std::string& name() const override { return inner_->name(); }
  void copy_h2d(void* d, const void* s, std::size_t b) override { ++enqueued; inner_->copy_h2d(d, s, b); }
  void copy_d2h(void* d, const void* s, std::size_t b) override { ++enqueued; inner_->copy_d2h(d, s, b); }
  void copy_d2d(void* d, const void* s, std::size_t b) override { ++enqueued; inner_->copy_d2d(d, s, b); }
  void memset(void* d, int v, std::size_t b) override { ++enqueued; inner_->memset(d, v, b); }
  void release_after(DeviceMemory memory) override { ++enqueued; inner_->release_after(std::move(memory)); }
  void record(Event& e) override { inner_->record(e); }
  void wait(const Event& e) override { inner_->wait(e); }
  void synchronize() override { inner_->synchronize(); }
  void* native_handle() override { return nullptr; }

  int enqueued = 0;

 private:
  FakeCudaDevice& device_;
  std::unique_ptr<Stream> inner_;
};

class FakeCudaDevice : public Device {
 public:
  explicit FakeCudaDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}
  DeviceKind kind() const override { return DeviceKind::Cuda; }
  std::string name() const override { return "fake-cuda over " + inner_->name(); }
  std::size_t capacity_bytes() const override { return inner_->capacity_bytes(); }
  DeviceMemory allocate(std::size_t bytes, std::string_view tag) override { return inner_->allocate(bytes, tag); }
  MemoryStats memory_stats() const override { return inner_->memory_stats(); }
  void reset_peak_stats() override { inner_->reset_peak_stats(); }
  std::unique_ptr<Stream> create_stream(std::string_view name) override {
    return std::make_unique<FakeCudaStream>(*this, inner_->create_stream(name));
  }
  std::unique_ptr<Event> create_event() override { return inner_->create_event(); }
  void pin_host(void* ptr, std::size_t bytes) override { inner_->pin_host(ptr, bytes); }
  void unpin_host(void* ptr) noexcept override { inner_->unpin_host(ptr); }

 private:
  std::unique_ptr<Device> inner_;
};

Device& FakeCudaStream::device() { return device_; }

class FakeCudaRig : public ::testing::Test {
 protected:
  FakeCudaRig() : device_(make_sim_device(SimDeviceOptions{})) {
    auto stream = device_.create_stream("fake");
    stream_.reset(static_cast<FakeCudaStream*>(stream.release()));
  }
  FakeCudaDevice device_;
  std::unique_ptr<FakeCudaStream> stream_;
};

class DeviceOpsCudaKind : public FakeCudaRig, public ::testing::WithParamInterface<Op> {};

TEST_P(DeviceOpsCudaKind, RefusesWithADeviceErrorNamingTheOpAndEnqueuesNothing) {
  const Op op = GetParam();
  const std::size_t n = 1000;
  DeviceMemory a = device_.allocate(n * 4, "t"), b = device_.allocate(n * 4, "t"), c = device_.allocate(n * 4, "t"),
               d = device_.allocate(n * 4, "t");
  DeviceMemory sums = device_.allocate(sum_squares_blocks(n) * sizeof(double), "t");
  DeviceMemory exact = device_.allocate(sizeof(optim::ExactSquares), "t");
  const OpCall call{a.as<float>(), b.as<float>(), c.as<float>(), d.as<float>(), sums.as<double>(),
                    exact.as<optim::ExactSquares>(), n};
  try {
    enqueue_op(op, *stream_, call);
    FAIL() << op_name(op) << " on a cuda stream without a cudaStream_t must be refused";
  } catch (const DeviceError& e) {
    // With the CUDA backend: "has no CUDA stream"; without: "needs the CUDA backend".
    EXPECT_NE(std::string(e.what()).find(std::string("device op '") + op_name(op) + "'"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(stream_->enqueued, 0);
  EXPECT_NO_THROW(stream_->synchronize());
}

INSTANTIATE_TEST_SUITE_P(device_ops, DeviceOpsCudaKind, ::testing::ValuesIn(all_ops()), op_param_name);

// SGD and Lion have no CUDA kernel: the error says so, in every build, before anything else.
class DeviceOpsNotWiredForCuda : public FakeCudaRig, public ::testing::WithParamInterface<optim::OptimizerKind> {};

TEST_P(DeviceOpsNotWiredForCuda, OptimizerUpdateSaysSo) {
  const std::size_t n = 10;
  DeviceMemory a = device_.allocate(n * 4, "t"), b = device_.allocate(n * 4, "t"), g = device_.allocate(n * 4, "t");
  const optim::OptimShard shard{std::span<float>(a.as<float>(), n), std::span<float>(b.as<float>(), n), {},
                                optim::GradRef{g.data(), DType::F32}, {}};
  optim::SgdParams sgd;
  sgd.momentum = 0.9;
  const optim::ParamGroup group = GetParam() == optim::OptimizerKind::Sgd
                                      ? optim::ParamGroup::sgd("s", sgd)
                                      : optim::ParamGroup::lion("l", optim::LionParams{});
  try {
    optimizer_update(*stream_, group, std::span<const optim::OptimShard>(&shard, 1), 1.0f, 1);
    FAIL() << optim::optimizer_name(group.kind()) << " must be refused on cuda";
  } catch (const DeviceError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("not wired for cuda yet"), std::string::npos) << what;
    EXPECT_NE(what.find(std::string(optim::optimizer_name(group.kind()))), std::string::npos) << what;
  }
  EXPECT_EQ(stream_->enqueued, 0);
}

INSTANTIATE_TEST_SUITE_P(device_ops, DeviceOpsNotWiredForCuda,
                         ::testing::Values(optim::OptimizerKind::Sgd, optim::OptimizerKind::Lion),
                         [](const ::testing::TestParamInfo<optim::OptimizerKind>& info) {
                           return std::string(optim::optimizer_name(info.param));
                         });

}  // namespace
}  // namespace strata::device_ops
