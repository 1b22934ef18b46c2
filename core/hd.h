// STRATA_HD marks functions compiled for both host and device. Per-element math that the CUDA
// kernels use lives in such functions so that the host test suite exercises the very same code
// (docs/DESIGN.md, "The device abstraction": the cuda backend is verified by compilation plus
// shared math).
#pragma once

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__ __forceinline__
#else
#define STRATA_HD inline
#endif
