// The fused multi-tensor AdamW/Adam kernel (see optim/adam_cuda.h). Tensors are cut into chunks of
// kChunkElems; one thread block updates one chunk, so a launch covers many tensors of any sizes
// (the apex/DeepSpeed multi_tensor_apply shape, without its per-launch chunk tables: a block finds
// its tensor in a short prefix table passed by value). Per element it calls adam_element, the
// function the CPU paths and the host tests use.
#include <algorithm>
#include <cstdint>
#include <string>

#include "core/cuda_check.h"
#include "core/error.h"
#include "optim/adam_cuda.h"

namespace strata::optim {
namespace {

constexpr int kMaxTensorsPerLaunch = 48;  // keeps the by-value argument well under 4 KiB
constexpr std::size_t kChunkElems = 8192;
constexpr int kThreads = 256;

enum class OutKind : int { None, BF16, F16 };

struct TensorList {
  DeviceAdamTensor tensors[kMaxTensorsPerLaunch];
  unsigned first_chunk[kMaxTensorsPerLaunch + 1];  // prefix sum of chunk counts
  int count;
};

template <typename G>
__device__ __forceinline__ float load_grad(const void* g, std::size_t i) {
  return to_f32(static_cast<const G*>(g)[i]);
}

template <WeightDecayMode kMode, typename G, OutKind kOut>
__global__ void __launch_bounds__(kThreads) adam_multi_tensor(AdamStepConsts c, TensorList list) {
  const unsigned chunk = blockIdx.x;
  int t = 0;
  while (t + 1 < list.count && chunk >= list.first_chunk[t + 1]) ++t;
  const DeviceAdamTensor& x = list.tensors[t];
  const std::size_t begin = static_cast<std::size_t>(chunk - list.first_chunk[t]) * kChunkElems;
  const std::size_t end = begin + kChunkElems < x.elems ? begin + kChunkElems : x.elems;
  for (std::size_t i = begin + threadIdx.x; i < end; i += kThreads) {
    float p = x.master[i];
    float m = x.exp_avg[i];
    float v = x.exp_avg_sq[i];
    adam_element<kMode>(p, m, v, load_grad<G>(x.grad, i), c);
    x.master[i] = p;
    x.exp_avg[i] = m;
    x.exp_avg_sq[i] = v;
    if constexpr (kOut == OutKind::BF16) {
      if (x.out != nullptr) static_cast<bf16*>(x.out)[i] = f32_to_bf16(p);
    } else if constexpr (kOut == OutKind::F16) {
      if (x.out != nullptr) static_cast<fp16*>(x.out)[i] = f32_to_f16(p);
    }
  }
}

template <WeightDecayMode kMode, typename G>
void launch_out(OutKind out, const AdamStepConsts& c, const TensorList& list, unsigned blocks, cudaStream_t s) {
  switch (out) {
    case OutKind::None: adam_multi_tensor<kMode, G, OutKind::None><<<blocks, kThreads, 0, s>>>(c, list); break;
    case OutKind::BF16: adam_multi_tensor<kMode, G, OutKind::BF16><<<blocks, kThreads, 0, s>>>(c, list); break;
    case OutKind::F16: adam_multi_tensor<kMode, G, OutKind::F16><<<blocks, kThreads, 0, s>>>(c, list); break;
  }
}

template <WeightDecayMode kMode>
void launch_grad(DType grad, OutKind out, const AdamStepConsts& c, const TensorList& list, unsigned blocks,
                 cudaStream_t s) {
  switch (grad) {
    case DType::F32: launch_out<kMode, float>(out, c, list, blocks, s); break;
    case DType::BF16: launch_out<kMode, bf16>(out, c, list, blocks, s); break;
    case DType::F16: launch_out<kMode, fp16>(out, c, list, blocks, s); break;
  }
}

void launch(const AdamStepConsts& c, WeightDecayMode mode, DType grad, OutKind out, const TensorList& list,
            unsigned blocks, cudaStream_t s) {
  // L2 with no decay is the decoupled update with decay 1, as on the CPU.
  if (mode == WeightDecayMode::L2 && c.l2_weight_decay != 0.0f) {
    launch_grad<WeightDecayMode::L2>(grad, out, c, list, blocks, s);
  } else {
    launch_grad<WeightDecayMode::Decoupled>(grad, out, c, list, blocks, s);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool adam_cuda_built() { return true; }

void adam_step_cuda(const AdamStepConsts& consts, WeightDecayMode mode, DType grad_dtype, DType out_dtype,
                    std::span<const DeviceAdamTensor> tensors, void* stream) {
  if (out_dtype == DType::F32) {
    throw ConfigError("adam_step_cuda: the low-precision copy must be bf16 or fp16, not fp32");
  }
  bool any_out = false;
  for (const DeviceAdamTensor& t : tensors) any_out = any_out || t.out != nullptr;
  const OutKind out = !any_out ? OutKind::None : (out_dtype == DType::BF16 ? OutKind::BF16 : OutKind::F16);
  const auto s = static_cast<cudaStream_t>(stream);
  TensorList list{};
  unsigned chunks = 0;
  auto flush = [&] {
    if (list.count > 0 && chunks > 0) launch(consts, mode, grad_dtype, out, list, chunks, s);
    list.count = 0;
    chunks = 0;
  };
  for (const DeviceAdamTensor& t : tensors) {
    if (t.elems == 0) continue;
    const std::size_t tensor_chunks = (t.elems + kChunkElems - 1) / kChunkElems;
    if (tensor_chunks > (1u << 30)) {
      // (fmt's compile-time format strings do not build under nvcc, hence the concatenation.)
      throw ConfigError("adam_step_cuda: a tensor of " + std::to_string(t.elems) +
                        " elements is too large for one launch; split it");
    }
    if (list.count == kMaxTensorsPerLaunch || chunks + tensor_chunks > (1u << 30)) flush();
    list.tensors[list.count] = t;
    list.first_chunk[list.count] = chunks;
    chunks += static_cast<unsigned>(tensor_chunks);
    list.first_chunk[list.count + 1] = chunks;
    ++list.count;
  }
  flush();
}

}  // namespace strata::optim
