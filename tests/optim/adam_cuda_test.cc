// The CUDA AdamW kernel against the same scalar reference as the CPU paths, bit for bit (the
// kernel calls the same adam_element; see optim/adam_cuda.h). Skipped where the build has CUDA but
// the machine has no GPU; in a build without CUDA the entry point must refuse clearly.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/adam_cuda.h"
#include "tests/optim/optim_test_util.h"

#if defined(STRATA_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace strata::optim {
namespace {

using testing::ShardData;
using testing::same_bits;

#if defined(STRATA_HAVE_CUDA)

// Device copy of a host buffer, freed on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(const void* host, std::size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes), cudaSuccess);
    if (bytes > 0) {
      EXPECT_EQ(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  void copy_to(void* host) const {
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(host, ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    }
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

TEST(AdamCuda, KernelIsBitExactAgainstTheReference) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "the build has CUDA but this machine has no usable GPU";
  }
  for (DType gt : {DType::F32, DType::BF16, DType::F16}) {
    for (WeightDecayMode mode : {WeightDecayMode::Decoupled, WeightDecayMode::L2}) {
      AdamParams params;
      params.weight_decay = 0.05;
      params.weight_decay_mode = mode;
      const AdamStepConsts c = make_adam_consts(params, 3, 0.5f);
      const std::size_t sizes[] = {1, 8191, 8193, 100000};
      std::vector<ShardData> host, ref;
      std::vector<std::unique_ptr<DeviceBuffer>> keep;
      std::vector<DeviceAdamTensor> tensors;
      for (std::size_t i = 0; i < 4; ++i) {
        host.emplace_back(sizes[i], gt, DType::BF16, true);
        host.back().fill(static_cast<std::uint32_t>(70 + i));
      }
      ref = host;
      for (ShardData& d : ref) testing::reference_adam(c, mode, d);
      for (ShardData& d : host) {
        const std::size_t n = d.p.size();
        keep.push_back(std::make_unique<DeviceBuffer>(d.p.data(), 4 * n));
        keep.push_back(std::make_unique<DeviceBuffer>(d.m.data(), 4 * n));
        keep.push_back(std::make_unique<DeviceBuffer>(d.v.data(), 4 * n));
        keep.push_back(std::make_unique<DeviceBuffer>(d.g.data(), dtype_bytes(gt) * n));
        keep.push_back(std::make_unique<DeviceBuffer>(d.out.data(), 2 * n));
        const std::size_t k = keep.size();
        tensors.push_back(DeviceAdamTensor{static_cast<float*>(keep[k - 5]->get()),
                                           static_cast<float*>(keep[k - 4]->get()),
                                           static_cast<float*>(keep[k - 3]->get()), keep[k - 2]->get(),
                                           keep[k - 1]->get(), n});
      }
      adam_step_cuda(c, mode, gt, DType::BF16, tensors, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      for (std::size_t i = 0; i < host.size(); ++i) {
        keep[5 * i + 0]->copy_to(host[i].p.data());
        keep[5 * i + 1]->copy_to(host[i].m.data());
        keep[5 * i + 2]->copy_to(host[i].v.data());
        keep[5 * i + 4]->copy_to(host[i].out.data());
        SCOPED_TRACE(::testing::Message() << dtype_name(gt) << " tensor " << i);
        EXPECT_TRUE(same_bits(host[i].p, ref[i].p, "master"));
        EXPECT_TRUE(same_bits(host[i].m, ref[i].m, "exp_avg"));
        EXPECT_TRUE(same_bits(host[i].v, ref[i].v, "exp_avg_sq"));
        EXPECT_TRUE(host[i].out == ref[i].out) << "bf16 copy";
      }
    }
  }
}

#else

TEST(AdamCuda, BuildWithoutCudaRefusesClearly) {
  EXPECT_FALSE(adam_cuda_built());
  try {
    adam_step_cuda(AdamStepConsts{}, WeightDecayMode::Decoupled, DType::F32, DType::BF16, {}, nullptr);
    FAIL() << "adam_step_cuda must throw in a build without CUDA";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("without the CUDA backend"), std::string::npos) << e.what();
  }
}

#endif

}  // namespace
}  // namespace strata::optim
