// The CUDA twin of the CPU AdamW: a fused multi-tensor kernel (optim/adam_kernel.cu) that runs
// optim/optim_math.h's adam_element on every element of a list of device tensors in one launch,
// reading the gradient in fp32/bf16/fp16 and writing the bf16/fp16 copy of the new weights in the
// same pass. The element math is the very function the CPU paths and the host tests use; with
// nvcc's defaults (IEEE sqrt and division, no flush-to-zero) and no contractible a*b+c left in it
// (Note [Explicit fma] in optim/optim_math.h), the device gives the host's bits.
//
// This header includes no CUDA header: the stream is passed as void* (a cudaStream_t; nullptr is
// the default stream). Builds without the CUDA backend link optim/adam_cuda_nocuda.cc, whose entry
// point throws DeviceError.
#pragma once

#include <cstddef>
#include <span>

#include "core/dtype.h"
#include "optim/optim_math.h"

namespace strata::optim {

// One tensor of a launch; every pointer is device memory. out may be null (no low-precision copy).
struct DeviceAdamTensor {
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const void* grad = nullptr;
  void* out = nullptr;
  std::size_t elems = 0;
};

// True when this build has the CUDA kernel.
bool adam_cuda_built();

// Enqueues one AdamW/Adam step over all tensors on `stream` (asynchronous; the caller orders it
// with events). All gradients have grad_dtype; every non-null out has out_dtype (BF16 or F16).
// Throws ConfigError for a bad dtype, DeviceError in a build without CUDA, InternalError if the
// launch fails.
void adam_step_cuda(const AdamStepConsts& consts, WeightDecayMode mode, DType grad_dtype, DType out_dtype,
                    std::span<const DeviceAdamTensor> tensors, void* stream);

}  // namespace strata::optim
