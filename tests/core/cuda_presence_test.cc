// The cuda backend's entry points on a machine without a usable GPU (this project's machines):
// listing devices returns nothing and says why; making a device throws a DeviceError that says what
// to do. With a GPU present the test checks the listing instead.
#include <gtest/gtest.h>

#include <string>

#include "core/device/device.h"
#include "core/error.h"

namespace strata {
namespace {

TEST(CudaPresence, ListingExplainsAnEmptyResult) {
  std::string why;
  const auto devices = list_cuda_devices(&why);
  if (!devices.empty()) {
    for (const auto& d : devices) {
      EXPECT_FALSE(d.name.empty());
      EXPECT_GT(d.total_memory_bytes, 0u);
    }
    GTEST_SKIP() << "a CUDA device is present: " << devices.front().name;
  }
  EXPECT_FALSE(why.empty()) << "an empty device list must say why";
}

TEST(CudaPresence, MakingADeviceWithoutOneIsAClearError) {
  std::string why;
  if (!list_cuda_devices(&why).empty()) GTEST_SKIP() << "a CUDA device is present";
  try {
    make_cuda_device(CudaDeviceOptions{});
    FAIL() << "make_cuda_device succeeded without a device";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("sim"), std::string::npos) << "the message should point to the sim device: "
                                                                    << e.what();
  }
}

}  // namespace
}  // namespace strata
