// The Adam-shaped memory pass (see optim/memory_pass.h).
#include "optim/memory_pass.h"

#include "optim/cpu_kernels.h"

namespace strata::optim {

void adam_shaped_memory_pass(std::span<const OptimShard> shards, const CpuExec& exec) {
  const detail::KernelSet& kernels = detail::kernels_for(exec.simd);
  detail::parallel_blocks(
      exec, shards.size(), [&](std::size_t s) { return shards[s].master.size(); },
      [&](std::size_t s, std::size_t begin, std::size_t end, std::size_t) {
        const OptimShard& sh = shards[s];
        const detail::AdamBlock block{sh.master.data() + begin,
                                      sh.moment1.data() + begin,
                                      sh.moment2.data() + begin,
                                      static_cast<const std::byte*>(sh.grad.data) + begin * dtype_bytes(sh.grad.dtype),
                                      sh.grad.dtype,
                                      nullptr,
                                      DType::BF16,
                                      end - begin};
        kernels.memory_pass(block);
      });
}

}  // namespace strata::optim
