// The CUDA, cuBLAS and NCCL members of the CHECK family (see core/error.h). Included only by code
// that already includes the CUDA headers, .cu files among them (so no fmt here); each macro throws
// InternalError with file:line, the failing call, the numeric code and the library's text for it.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "core/error.h"

namespace strata::detail {

// Out of line in core/cuda_check_cuda.cc.
[[noreturn]] void cuda_check_failed(cudaError_t err, const char* file, int line, const char* expr);
[[noreturn]] void cublas_check_failed(cublasStatus_t status, const char* file, int line, const char* expr);
[[noreturn]] void nccl_check_failed(ncclResult_t result, const char* file, int line, const char* expr);

inline void cuda_check(cudaError_t err, const char* file, int line, const char* expr) {
  if (err != cudaSuccess) cuda_check_failed(err, file, line, expr);
}
inline void cublas_check(cublasStatus_t status, const char* file, int line, const char* expr) {
  if (status != CUBLAS_STATUS_SUCCESS) cublas_check_failed(status, file, line, expr);
}
inline void nccl_check(ncclResult_t result, const char* file, int line, const char* expr) {
  if (result != ncclSuccess) nccl_check_failed(result, file, line, expr);
}

}  // namespace strata::detail

#define STRATA_CUDA_CHECK(call) ::strata::detail::cuda_check((call), __FILE__, __LINE__, #call)
#define STRATA_CUBLAS_CHECK(call) ::strata::detail::cublas_check((call), __FILE__, __LINE__, #call)
#define STRATA_NCCL_CHECK(call) ::strata::detail::nccl_check((call), __FILE__, __LINE__, #call)
