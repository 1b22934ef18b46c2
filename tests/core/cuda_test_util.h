// The start of every gpu-labelled suite: a cuda device, or the test skips and says why (no GPU, no
// driver, a build without the CUDA backend). Fixtures derive from CudaDeviceTest; one that adds to
// SetUp calls CudaDeviceTest::SetUp() first and returns when IsSkipped().
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/device/device.h"

namespace strata::testing {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (list_cuda_devices(&why).empty()) GTEST_SKIP() << "no usable cuda device: " << why;
    device_ = make_cuda_device(CudaDeviceOptions{});
  }

  std::unique_ptr<Device> device_;
};

}  // namespace strata::testing
