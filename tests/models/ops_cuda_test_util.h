// The fixture of the op-set GPU suites (ops_cuda_test.cc, ops_attention_cuda_test.cc): a cuda
// device, one stream and its cuBLAS handle; tensors held twice (the CPU run's host bytes, the CUDA
// run's device copy) and each op run on both sides. Labelled `gpu`: without a usable cuda device
// every test skips and says why.
//
// Note [CUDA op tolerances]: both paths widen the same stored inputs to fp32 exactly and compute in
// fp32, so each bound is an fp32 bound on |cuda - cpu| per element, built in double from the
// magnitudes of the terms that element is made of (eps = FLT_EPSILON = 2^-23, u = eps/2):
//  * exact ops (the same additions in the same order, one rounding each: bias_grad and layer-norm
//    dbias in fp32, embedding forward and backward, residual_add, cast) must match bit for bit;
//  * element ops run op_math.h's STRATA_HD math on both sides; they differ only where nvcc
//    contracts a*b+c into one FMA and where CUDA's expf/tanhf/powf/sinf/cosf (2-4 ulp) differ from
//    glibc's (<= 1 ulp): about 16 eps times the operand magnitudes (a few ulp with room to spare,
//    far below any wrong-formula or wrong-index error);
//  * reductions whose order differs (block trees and lane strides on the GPU, loops on the CPU,
//    cuBLAS's blocking against OpenBLAS's): the worst-case bound (n + c) eps sum|terms| for n terms,
//    not the typical sqrt(n) eps, so no input trips it by chance; for our n <= ~1000 that is still
//    below 1e-4 of sum|terms|, while a missing term, a wrong index or a wrong stride moves an
//    element by >~ 1/n of it;
//  * bf16/fp16 outputs: the fp32 bound plus one ulp of the output type (two fp32 values that close
//    may round to neighbouring 16-bit values), plus one ulp per extra rounding a kernel makes
//    (matmul's accumulation of items into one C, its bias prologue with beta != 0).
// Elements an op must not touch (row padding, columns past vocab) get bound 0: equal.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "models/kernels/cuda_kernels.h"
#include "models/kernels/ops.h"
#include "tests/core/cuda_test_util.h"
#include "tests/models/op_test_util.h"

namespace strata::models::testing {

inline constexpr double kEps = FLT_EPSILON;  // one fp32 ulp at 1
inline constexpr double kUnit = kEps / 2;    // fp32 unit roundoff
inline const KernelContext kInline{};         // null stream: the CPU kernel, on this thread

enum class Side { Cpu, Cuda };

// One tensor of a test in both runs: the CPU run's host bytes and the CUDA run's device copy,
// equal at the start. Token ids (int32) and fp32 statistics use it too; `dtype` says how to read
// the elements back (int32 ids are never read as values, only passed on).
struct Twin {
  DType dtype = DType::F32;
  std::vector<std::uint8_t> host;
  DeviceMemory dev;

  void* at(Side side) { return side == Side::Cpu ? static_cast<void*>(host.data()) : dev.data(); }
  void* at(Side side, std::int64_t elem) {  // element `elem` of a packed buffer
    return static_cast<std::uint8_t*>(at(side)) + static_cast<std::size_t>(elem) * dtype_bytes(dtype);
  }
  template <typename T>
  T* as(Side side) {
    return static_cast<T*>(at(side));
  }
  Buf cpu() const { return Buf{dtype, host}; }
};

inline std::string shape_name(std::initializer_list<std::int64_t> dims) {
  std::string s;
  for (std::int64_t d : dims) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

class CudaOps : public strata::testing::CudaDeviceTest {
 protected:
  void SetUp() override {
    CudaDeviceTest::SetUp();
    if (IsSkipped()) return;
    stream_ = device_->create_stream("models_ops");
    cublas_ = std::make_unique<CublasHandles>(*device_, *stream_);
    cuda_ = KernelContext{DeviceKind::Cuda, stream_.get(), cublas_.get()};
  }

  const KernelContext& ctx(Side side) const { return side == Side::Cpu ? kInline : cuda_; }

  // op(Side::Cpu) runs inline; op(Side::Cuda) enqueues on the stream, which is then drained (a
  // kernel fault surfaces here as the stream's error).
  template <typename Op>
  void both(Op&& op) {
    op(Side::Cpu);
    op(Side::Cuda);
    stream_->synchronize();
  }

  Twin twin(const Buf& buf) {
    Twin t{buf.dtype, buf.bytes, device_->allocate(std::max<std::size_t>(buf.bytes.size(), 1), "ops_cuda_test")};
    stream_->copy_h2d(t.dev.data(), t.host.data(), t.host.size());
    stream_->synchronize();  // the CPU run may write t.host next
    return t;
  }
  Twin twin(const Vec& values, DType dtype) { return twin(make_buf(values, dtype)); }
  Twin twin_ids(const std::vector<std::int32_t>& ids) {
    Buf b{DType::F32, std::vector<std::uint8_t>(ids.size() * 4)};
    std::memcpy(b.bytes.data(), ids.data(), b.bytes.size());
    return twin(b);
  }

  // The CUDA run's result.
  Buf fetch(const Twin& t) {
    Buf b{t.dtype, std::vector<std::uint8_t>(t.host.size())};
    stream_->copy_d2h(b.bytes.data(), t.dev.data(), b.bytes.size());
    stream_->synchronize();
    return b;
  }

  std::unique_ptr<Stream> stream_;        // declared after device_ (the base's): destroyed before it
  std::unique_ptr<CublasHandles> cublas_;
  KernelContext cuda_;
};

class CudaOpsByDtype : public CudaOps, public ::testing::WithParamInterface<DType> {
 protected:
  DType dt() const { return GetParam(); }
  std::string tag(const std::string& what) const { return what + " " + std::string(dtype_name(dt())); }
};

}  // namespace strata::models::testing
