// The one place an op of a device front layer picks its backend by the device kind. Both front
// layers, the engine's math (engine/device_ops.cc) and the models' op set (models/kernels/ops.cc),
// give each op once as a host kernel and a CUDA launcher and hand both to run_on_backend.
//
// Note [Op backends]: a backend is a device kind and what its case below does with an op:
//  * sim: the host kernel, enqueued as a sim kernel on the stream (core/device/sim_kernel.h), or
//    run inline on the calling thread when there is no stream (host memory: the plain reference
//    run of models/kernels/ops.h);
//  * cuda: the CUDA launcher, called with the stream's cudaStream_t (as void*). The launchers are
//    generic lambdas (an `auto` parameter), so a build without the CUDA backend never instantiates
//    them and refers to no CUDA code; there a cuda op is a DeviceError that says so.
// Adding a backend: its DeviceKind (core/device/device.h), its case here, and each op's launcher
// for it in the two front layers. Checks of an op's arguments stay in its front layer, before the
// dispatch, so both backends refuse the same things at enqueue time.
#pragma once

#include <functional>
#include <utility>

#include <fmt/format.h>

#include "core/device/device.h"
#include "core/device/sim_kernel.h"
#include "core/error.h"

namespace strata {

// Where an op runs and what to call it in messages ("device op 'add_left'", "model op 'matmul'").
struct OpSite {
  DeviceKind kind = DeviceKind::Sim;
  Stream* stream = nullptr;  // null: inline on the calling thread (sim only)
  const char* layer = "op";
  const char* op = "";
};

#if defined(STRATA_HAVE_CUDA)
// The cudaStream_t of the site's stream, after the checks the sim path does not need.
inline void* cuda_native_stream(const OpSite& site) {
  if (site.stream == nullptr) {
    throw DeviceError(fmt::format("{} '{}' on a cuda device needs a stream (a null stream means inline host "
                                  "execution, which only the sim device has)",
                                  site.layer, site.op));
  }
  void* native = site.stream->native_handle();
  if (native == nullptr) {
    throw DeviceError(fmt::format("{} '{}': stream '{}' of device {} (kind cuda) has no CUDA stream; create the "
                                  "stream on the cuda device",
                                  site.layer, site.op, site.stream->name(), site.stream->device().name()));
  }
  return native;
}
#endif

// Runs the op on the site's backend (Note [Op backends]): `host()` on sim, `cuda(native)` on cuda.
template <typename HostFn, typename CudaFn>
void run_on_backend(const OpSite& site, HostFn&& host, [[maybe_unused]] CudaFn&& cuda) {
  switch (site.kind) {
    case DeviceKind::Sim:
      if (site.stream == nullptr) {
        host();
      } else {
        launch_sim_kernel(*site.stream, std::function<void()>(std::forward<HostFn>(host)));
      }
      return;
    case DeviceKind::Cuda:
#if defined(STRATA_HAVE_CUDA)
      cuda(cuda_native_stream(site));
      return;
#else
      throw DeviceError(fmt::format("{} '{}' needs the CUDA backend, but this build of Strata has none (configure "
                                    "with -DSTRATA_CUDA=ON where nvcc is installed); use --device sim",
                                    site.layer, site.op));
#endif
  }
  STRATA_CHECK(false, "unknown device kind for {} '{}'", site.layer, site.op);
}

}  // namespace strata
