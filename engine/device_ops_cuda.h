// Internal: the CUDA launchers engine/device_ops.cc calls for a cuda stream. No CUDA header is
// included here (the stream travels as void*, a cudaStream_t from Stream::native_handle()), so
// device_ops.cc may include it in every build.
//
// The launchers are defined only in builds with the CUDA backend (engine/device_ops_cuda.cu);
// device_ops.cc reaches them only there (generic lambdas, as in models/kernels/ops.cc). Each one
// enqueues its kernel on `stream` and returns; arguments and semantics are those of the same-named
// op in engine/device_ops.h. Throws InternalError (STRATA_CUDA_CHECK) if a launch fails.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace strata::device_ops::cuda {

// core/dtype_convert.h convert_async, under the name the front layer dispatches to.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n_elems, void* stream);

void add_left(float* dst, const float* left, std::size_t n_elems, void* stream);

void convert_add_left(const void* src, DType src_dtype, float* dst, std::size_t n_elems, void* stream);

// Writes one double per block of block_elems (optim::kCpuBlockElems, passed in so that this file
// needs no oneTBB header) to out_device (device memory, the caller's buffer).
void block_sum_squares(const void* grad, DType grad_dtype, std::size_t n_elems, std::size_t block_elems,
                       double* out_device, void* stream);

// Adds the exact squares (optim/exact_squares.h) of run p of optim::kExactMaxAdds elements into the
// zeroed words of accumulator p of out_device (device memory laid out as optim::ExactSquares).
void exact_sum_squares(const void* grad, DType grad_dtype, std::size_t n_elems, std::uint64_t* out_device,
                       void* stream);

}  // namespace strata::device_ops::cuda
