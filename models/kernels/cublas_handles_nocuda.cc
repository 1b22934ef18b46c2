// CublasHandles in builds without the CUDA backend: constructing one is a clear DeviceError (there
// is no cuda device to bind it to); the other members exist so that host code links unchanged.
#include "core/error.h"
#include "models/kernels/cuda_kernels.h"

namespace strata::models {

CublasHandles::CublasHandles(Device& /*device*/, Stream& /*stream*/, std::size_t /*workspace_bytes*/) {
  throw DeviceError(
      "cuBLAS handles need the CUDA backend, but this build of Strata has none (configure with -DSTRATA_CUDA=ON "
      "where nvcc is installed); use the sim device");
}

CublasHandles::~CublasHandles() = default;
CublasHandles::CublasHandles(CublasHandles&& other) noexcept = default;
CublasHandles& CublasHandles::operator=(CublasHandles&& other) noexcept = default;
void CublasHandles::destroy() noexcept {}

}  // namespace strata::models
