// Element-type conversions on a CUDA stream: the device-side twin of core/dtype_bulk.h.
//
// The kernels (core/dtype_convert.cu) call the very STRATA_HD functions of core/dtype.h per
// element, so the bits on the device are the bits the host test suite checks exhaustively
// (docs/DESIGN.md, "The device abstraction": shared host-tested math). This header includes no
// CUDA header — the stream is passed as `void*` (a cudaStream_t, e.g. Stream::native_handle()) —
// so host-only code may include it; the definitions exist only in builds with the CUDA backend.
#pragma once

#include <cstddef>

#include "core/dtype.h"

namespace strata::cuda {

#if defined(STRATA_HAVE_CUDA)

// Converts n_elems elements of device memory `src` (src_dtype) to `dst` (dst_dtype) in stream
// order on `stream` (nullptr: the legacy default stream). Same dtype is a device-to-device copy;
// bf16 <-> fp16 widens to fp32 exactly and rounds once, like the host path. Source and
// destination must not overlap. Returns after enqueueing; throws InternalError (STRATA_CUDA_CHECK)
// if the launch fails.
void convert_async(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n_elems, void* stream);

#endif

}  // namespace strata::cuda
