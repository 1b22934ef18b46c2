// The CUDA, cuBLAS and NCCL members of the CHECK family (see core/error.h). Included only by code
// that already includes the CUDA headers; each macro throws InternalError with file:line, the
// failing call, the numeric code and the library's own text for it.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "core/error.h"

namespace strata::detail {

inline void cuda_check(cudaError_t err, const char* file, int line, const char* expr) {
  if (err != cudaSuccess) [[unlikely]] {
    check_failed(file, line, expr,
                 fmt::format("CUDA error {} {}: {}", static_cast<int>(err), cudaGetErrorName(err),
                             cudaGetErrorString(err)));
  }
}

inline void cublas_check(cublasStatus_t status, const char* file, int line, const char* expr) {
  if (status != CUBLAS_STATUS_SUCCESS) [[unlikely]] {
    check_failed(file, line, expr,
                 fmt::format("cuBLAS error {} {}: {}", static_cast<int>(status),
                             cublasGetStatusName(status), cublasGetStatusString(status)));
  }
}

inline void nccl_check(ncclResult_t result, const char* file, int line, const char* expr) {
  if (result != ncclSuccess) [[unlikely]] {
    check_failed(file, line, expr,
                 fmt::format("NCCL error {}: {}", static_cast<int>(result), ncclGetErrorString(result)));
  }
}

}  // namespace strata::detail

#define STRATA_CUDA_CHECK(call) ::strata::detail::cuda_check((call), __FILE__, __LINE__, #call)
#define STRATA_CUBLAS_CHECK(call) ::strata::detail::cublas_check((call), __FILE__, __LINE__, #call)
#define STRATA_NCCL_CHECK(call) ::strata::detail::nccl_check((call), __FILE__, __LINE__, #call)
