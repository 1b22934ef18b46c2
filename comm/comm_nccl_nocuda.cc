// Without the CUDA backend there is no NCCL communicator; asking for one says so.
#include "core/error.h"
#include "comm/communicator.h"

namespace strata {

std::unique_ptr<Communicator> make_nccl_world_communicator(Device&, const CommunicatorOptions&) {
  throw DeviceError("this build of Strata has no CUDA backend, so no NCCL communicator; rebuild with "
                    "-DSTRATA_CUDA=ON (needs nvcc and NCCL) or run on the sim device (strata.device.kind=sim)");
}

}  // namespace strata
