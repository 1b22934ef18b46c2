// The engine's device ops (engine/device_ops.h) on a cuda device: the same comparisons as the sim
// suite (device_ops_checks.h), through the Device API, against the same host references; finite
// values bit for bit, a NaN as any NaN (a GPU writes the canonical one). SGD and Lion must say
// they are not wired for cuda yet. Labelled `gpu` (tests/engine/CMakeLists.txt): where no cuda
// device is usable (no GPU, no driver, a build without the CUDA backend) every test skips and
// says why.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>

#include "core/device/device.h"
#include "engine/device_ops.h"
#include "tests/core/cuda_test_util.h"
#include "tests/engine/device_ops_checks.h"

namespace strata::device_ops {
namespace {

using testing::NanBits;
using testing::Rig;

class CudaDeviceOps : public strata::testing::CudaDeviceTest {
 protected:
  void SetUp() override {
    CudaDeviceTest::SetUp();
    if (IsSkipped()) return;
    stream_ = device_->create_stream("device_ops");
  }

  Rig rig() { return Rig{*device_, *stream_, NanBits::AnyNan}; }

  std::unique_ptr<Stream> stream_;
};

using DTypePair = std::tuple<DType, DType>;

class DeviceOpsCudaConvert : public CudaDeviceOps, public ::testing::WithParamInterface<DTypePair> {};

TEST_P(DeviceOpsCudaConvert, MatchesReferenceBitForBit) {
  const auto [from, to] = GetParam();
  Rig r = rig();
  for (std::size_t n : testing::op_sizes()) testing::check_convert(r, from, to, n);
}

INSTANTIATE_TEST_SUITE_P(device_ops_cuda, DeviceOpsCudaConvert,
                         ::testing::Combine(::testing::ValuesIn(testing::all_dtypes()),
                                            ::testing::ValuesIn(testing::all_dtypes())),
                         [](const ::testing::TestParamInfo<DTypePair>& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_to_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

class DeviceOpsCudaSized : public CudaDeviceOps, public ::testing::WithParamInterface<std::size_t> {};

TEST_P(DeviceOpsCudaSized, AddLeftMatchesReference) {
  Rig r = rig();
  testing::check_add_left(r, GetParam());
}

TEST_P(DeviceOpsCudaSized, ConvertAddLeftMatchesReferenceAndTheTwoOpForm) {
  Rig r = rig();
  for (DType dtype : testing::all_dtypes()) testing::check_convert_add_left(r, dtype, GetParam());
}

TEST_P(DeviceOpsCudaSized, BlockSumSquaresMatchesGradStatsPerBlock) {
  Rig r = rig();
  for (DType dtype : testing::all_dtypes()) {
    testing::check_block_sum_squares(r, GetParam(), testing::Poison::No, dtype);
    testing::check_block_sum_squares(r, GetParam(), testing::Poison::Yes, dtype);
  }
}

TEST_P(DeviceOpsCudaSized, ExactSumSquaresMatchesOneAccumulator) {
  Rig r = rig();
  for (DType dtype : testing::all_dtypes()) {
    testing::check_exact_sum_squares(r, GetParam(), testing::Poison::No, dtype);
    testing::check_exact_sum_squares(r, GetParam(), testing::Poison::Yes, dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(device_ops_cuda, DeviceOpsCudaSized, ::testing::ValuesIn(testing::op_sizes()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           return "n" + std::to_string(info.param);
                         });

class DeviceOpsCudaOptimizer : public CudaDeviceOps, public ::testing::WithParamInterface<testing::OptimCase> {};

// AdamW/Adam against ParamGroup::apply; SGD and Lion: "not wired for cuda yet".
TEST_P(DeviceOpsCudaOptimizer, UpdateMatchesParamGroupApplyOrSaysNotWired) {
  Rig r = rig();
  testing::check_optimizer_update(r, GetParam());
}

INSTANTIATE_TEST_SUITE_P(device_ops_cuda, DeviceOpsCudaOptimizer, ::testing::ValuesIn(testing::optim_cases()),
                         [](const ::testing::TestParamInfo<testing::OptimCase>& info) { return info.param.name; });

}  // namespace
}  // namespace strata::device_ops
