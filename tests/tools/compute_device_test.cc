// train/compute_device.h: which device a training config computes on. These choices are made from
// the config alone (no GPU needed), so they are checked here on every machine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "config/config.h"
#include "train/compute_device.h"

namespace strata::train {
namespace {

TrainConfig config(const std::string& strata_device, const std::string& zero) {
  return load_train_config_text(R"({"zero_optimization": )" + zero + R"(, "strata": {"device": )" + strata_device + "}}",
                                "compute_device_test", {});
}

class ComputeDeviceChoice : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("STRATA_CUDA_OFFLOAD");
    ::unsetenv("STRATA_CUDA_PARALLEL");
  }
  void TearDown() override {
    ::unsetenv("STRATA_CUDA_OFFLOAD");
    ::unsetenv("STRATA_CUDA_PARALLEL");
  }
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

// Tensor slices, tensor and pipeline ranks run on sim only (the vocabulary-parallel CUDA kernels
// have not run on a GPU): auto takes sim, an explicit cuda is refused naming the keys (where no
// GPU is usable, the missing GPU is refused first).
TEST_F(ComputeDeviceChoice, TensorSlicesStayOnSim) {
  const auto sliced = [](const std::string& kind) {
    return load_train_config_text(R"({"strata": {"device": {"kind": ")" + kind +
                                      R"("}, "parallel": {"tensor_slices": 2}}})",
                                  "compute_device_test", {});
  };
  EXPECT_EQ(training_device_choice(sliced("auto")), DeviceChoice::Sim);
  try {
    training_device_choice(sliced("cuda"));
    FAIL() << "tensor_slices 2 on cuda was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    if (what.find("no cuda device is usable") != std::string::npos) return;
    EXPECT_NE(what.find("tensor_slices = 2"), std::string::npos) << what;
    EXPECT_NE(what.find("have not run on a GPU"), std::string::npos) << what;
  }
}

// STRATA_CUDA_PARALLEL=1 lifts the refusal: an explicit cuda with pipeline stages is kept (auto
// still takes sim). Where no GPU is usable the missing GPU is refused first, so the opt-in cannot
// be seen to take effect.
TEST_F(ComputeDeviceChoice, TheParallelOptInKeepsCuda) {
  const auto piped = [](const std::string& kind) {
    return load_train_config_text(R"({"strata": {"device": {"kind": ")" + kind +
                                      R"("}, "parallel": {"pipeline": 2}}})",
                                  "compute_device_test", {});
  };
  ::setenv("STRATA_CUDA_PARALLEL", "1", 1);
  EXPECT_EQ(training_device_choice(piped("auto")), DeviceChoice::Sim);
  try {
    EXPECT_EQ(training_device_choice(piped("cuda")), DeviceChoice::Cuda);
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find("pipeline = 2"), std::string::npos) << "refused despite the opt-in: " << what;
    if (what.find("no cuda device is usable") != std::string::npos) {
      GTEST_SKIP() << "no usable GPU here, so cuda is refused before the opt-in matters: " << what;
    }
    FAIL() << what;
  }
}

}  // namespace
}  // namespace strata::train
