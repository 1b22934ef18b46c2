// The engine's device ops (engine/device_ops.h) on a cuda device: the same comparisons as the sim
// suite (device_ops_checks.h), through the Device API, against the same host references; finite
// values bit for bit, a NaN as any NaN (a GPU writes the canonical one). SGD and Lion must say
// they are not wired for cuda yet. Labelled `gpu` (tests/engine/CMakeLists.txt): where no cuda
// device is usable (no GPU, no driver, a build without the CUDA backend) every test skips and
// says why.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/device/device.h"
#include "engine/device_ops.h"
#include "tests/core/cuda_test_util.h"
#include "tests/engine/device_ops_checks.h"
#include "tests/engine/device_ops_suites.h"

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

// AdamW/Adam against ParamGroup::apply; SGD and Lion: "not wired for cuda yet".
STRATA_DEVICE_OPS_REFERENCE_SUITES(CudaDeviceOps, DeviceOpsCuda, device_ops_cuda, UpdateMatchesParamGroupApplyOrSaysNotWired);

}  // namespace
}  // namespace strata::device_ops
