// CublasHandles (models/kernels/cuda_kernels.h): the RAII owner of one cuBLAS handle bound to one
// CUDA stream, with a private workspace from the Device's allocator.
//
// The handle is created on the stream's device, bound to the stream (cublasSetStream) and given the
// workspace (cublasSetWorkspace), which cuBLAS needs for run-to-run identical results when several
// streams compute at once. Reduced-precision split-K reductions are disallowed so bf16/fp16 gemms
// accumulate in fp32 throughout, as the op set promises.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <utility>

#include <fmt/format.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "models/kernels/cuda_kernels.h"

namespace strata::models {

namespace {

// Makes `ordinal` the current device for the scope and restores the previous one.
class ScopedCudaDevice {
 public:
  explicit ScopedCudaDevice(int ordinal) {
    STRATA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != ordinal) {
      STRATA_CUDA_CHECK(cudaSetDevice(ordinal));
      restore_ = true;
    }
  }
  ~ScopedCudaDevice() {
    if (restore_) (void)cudaSetDevice(previous_);
  }
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

}  // namespace

CublasHandles::CublasHandles(Device& device, Stream& stream, std::size_t workspace_bytes) {
  if (device.kind() != DeviceKind::Cuda || stream.native_handle() == nullptr) {
    throw DeviceError(fmt::format("cuBLAS handles need a cuda device and one of its streams; got device {} and "
                                  "stream '{}' (use the sim device's CPU kernels instead, with no CublasHandles)",
                                  device.name(), stream.name()));
  }
  auto* native = static_cast<cudaStream_t>(stream.native_handle());
  STRATA_CUDA_CHECK(cudaStreamGetDevice(native, &ordinal_));
  if (workspace_bytes > 0) workspace_ = device.allocate(workspace_bytes, "cublas.workspace");
  const ScopedCudaDevice on(ordinal_);
  cublasHandle_t handle = nullptr;
  STRATA_CUBLAS_CHECK(cublasCreate(&handle));
  handle_ = handle;
  stream_ = native;
  try {
    STRATA_CUBLAS_CHECK(cublasSetStream(handle, native));
    STRATA_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace_.data(), workspace_.size_bytes()));
    STRATA_CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
    STRATA_CUBLAS_CHECK(cublasSetMathMode(
        handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  } catch (...) {
    destroy();
    throw;
  }
}

CublasHandles::~CublasHandles() { destroy(); }

CublasHandles::CublasHandles(CublasHandles&& other) noexcept
    : workspace_(std::move(other.workspace_)),
      handle_(std::exchange(other.handle_, nullptr)),
      stream_(std::exchange(other.stream_, nullptr)),
      ordinal_(other.ordinal_) {}

CublasHandles& CublasHandles::operator=(CublasHandles&& other) noexcept {
  if (this != &other) {
    destroy();
    workspace_ = std::move(other.workspace_);
    handle_ = std::exchange(other.handle_, nullptr);
    stream_ = std::exchange(other.stream_, nullptr);
    ordinal_ = other.ordinal_;
  }
  return *this;
}

// cublasDestroy synchronizes the device, so no queued gemm still uses the workspace when it is
// freed afterwards (by the caller or by workspace_'s destructor).
void CublasHandles::destroy() noexcept {
  if (handle_ == nullptr) return;
  int previous = 0;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != ordinal_ &&
                        cudaSetDevice(ordinal_) == cudaSuccess;
  (void)cublasDestroy(static_cast<cublasHandle_t>(handle_));
  if (switched) (void)cudaSetDevice(previous);
  handle_ = nullptr;
  stream_ = nullptr;
  workspace_.reset();
}

}  // namespace strata::models
