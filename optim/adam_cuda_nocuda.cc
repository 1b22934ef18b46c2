// The CUDA AdamW entry point in a build without the CUDA backend: it says so (see optim/adam_cuda.h).
#include "core/error.h"
#include "optim/adam_cuda.h"

namespace strata::optim {

bool adam_cuda_built() { return false; }

void adam_step_cuda(const AdamStepConsts&, WeightDecayMode, DType, DType, std::span<const DeviceAdamTensor>, void*) {
  throw DeviceError("adam_step_cuda: this Strata was built without the CUDA backend; rebuild with "
                    "-DSTRATA_CUDA=ON (needs nvcc) or run the optimizer on the CPU");
}

}  // namespace strata::optim
