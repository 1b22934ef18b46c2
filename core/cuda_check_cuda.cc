// Out-of-line failure paths of STRATA_CUDA_CHECK / STRATA_CUBLAS_CHECK / STRATA_NCCL_CHECK
// (core/cuda_check.h): they format the library's own name and text for the code.
#include "core/cuda_check.h"

#include <fmt/format.h>

namespace strata::detail {

void cuda_check_failed(cudaError_t err, const char* file, int line, const char* expr) {
  check_failed(file, line, expr,
               fmt::format("CUDA error {} {}: {}", static_cast<int>(err), cudaGetErrorName(err), cudaGetErrorString(err)));
}

void cublas_check_failed(cublasStatus_t status, const char* file, int line, const char* expr) {
  check_failed(file, line, expr,
               fmt::format("cuBLAS error {} {}: {}", static_cast<int>(status), cublasGetStatusName(status),
                           cublasGetStatusString(status)));
}

void nccl_check_failed(ncclResult_t result, const char* file, int line, const char* expr) {
  check_failed(file, line, expr, fmt::format("NCCL error {}: {}", static_cast<int>(result), ncclGetErrorString(result)));
}

}  // namespace strata::detail
