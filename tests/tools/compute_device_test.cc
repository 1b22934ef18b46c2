// tools/compute_device.h: which device a training config computes on. These choices are made from
// the config alone (no GPU needed), so they are checked here on every machine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "engine/config.h"
#include "tools/compute_device.h"

namespace strata::tools {
namespace {

TrainConfig config(const std::string& strata_device, const std::string& zero) {
  return load_train_config_text(R"({"zero_optimization": )" + zero + R"(, "strata": {"device": )" + strata_device + "}}",
                                "compute_device_test", {});
}

class ComputeDeviceChoice : public ::testing::Test {
 protected:
  void SetUp() override { ::unsetenv("STRATA_CUDA_OFFLOAD"); }
  void TearDown() override { ::unsetenv("STRATA_CUDA_OFFLOAD"); }
};

// Offload has not run correctly on a GPU: auto takes sim for a config that asks for it.
TEST_F(ComputeDeviceChoice, AutoTakesSimForAnOffloadingConfig) {
  EXPECT_EQ(training_device_choice(config(R"({"kind": "auto"})",
                                          R"({"stage": 3, "offload_optimizer": {"device": "cpu"}})")),
            DeviceChoice::Sim);
  EXPECT_EQ(training_device_choice(config(R"({"kind": "auto"})",
                                          R"({"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"},
                                              "offload_param": {"device": "nvme", "nvme_path": "/tmp"}})")),
            DeviceChoice::Sim);
}

TEST_F(ComputeDeviceChoice, AutoStaysAutoWithoutOffloadOrWithTheOptIn) {
  EXPECT_EQ(training_device_choice(config(R"({"kind": "auto"})", R"({"stage": 3})")), DeviceChoice::Auto);
  ::setenv("STRATA_CUDA_OFFLOAD", "1", 1);
  EXPECT_EQ(training_device_choice(config(R"({"kind": "auto"})",
                                          R"({"stage": 3, "offload_optimizer": {"device": "cpu"}})")),
            DeviceChoice::Auto);
}

TEST_F(ComputeDeviceChoice, AnExplicitSimIsKept) {
  EXPECT_EQ(training_device_choice(config(R"({"kind": "sim"})",
                                          R"({"stage": 3, "offload_optimizer": {"device": "cpu"}})")),
            DeviceChoice::Sim);
}

}  // namespace
}  // namespace strata::tools
