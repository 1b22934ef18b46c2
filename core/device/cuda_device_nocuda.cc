// The cuda backend's entry points in a build without CUDA (configured with -DSTRATA_CUDA=OFF, or
// AUTO where no nvcc was found): no devices, and a clear error for anyone who asks for one.
#include <fmt/format.h>

#include "core/device/device.h"
#include "core/error.h"

namespace strata {
namespace {
// Why there are no devices (list_cuda_devices): callers add their own advice about the choice.
constexpr const char* kNoCuda =
    "this build of Strata has no CUDA backend (configure with -DSTRATA_CUDA=ON and the CUDA toolkit installed "
    "to build it)";
}  // namespace

std::vector<CudaDeviceInfo> list_cuda_devices(std::string* why) {
  if (why != nullptr) *why = kNoCuda;
  return {};
}

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& options) {
  throw DeviceError(fmt::format("cannot open cuda:{}: {}, or use the sim device: strata.device.kind = \"sim\"",
                                options.ordinal, kNoCuda));
}

}  // namespace strata
