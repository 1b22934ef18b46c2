// Kernels of the sim device: how the CPU code that stands in for a GPU kernel is enqueued on a sim
// stream. Only the backend dispatch of the device front layers (core/device/op_dispatch.h), the MPI
// communicator (whose collectives are the sim device's NCCL) and the sim backend's tools use it;
// no other engine code runs on a stream (Note [Host-driven offload] in docs/DESIGN.md).
//
// Note [Sim kernels]: on cuda a stream carries kernels, copies and event record/wait, and nothing on
// it ever waits for a host thread. On sim a kernel is a CPU function that the stream's worker runs
// in stream order, and the sim device holds it to what a CUDA kernel can do: it reads and writes
// device memory (host memory here) and host memory it was handed, and never waits for the host.
// Inside a sim kernel Event::synchronize, Stream::synchronize, a copy of pageable host memory
// (which blocks its caller, Note [Pageable copies] in core/device/sim_stream.cc) and pin_host
// throw DeviceError, so code that would make a GPU wait for the host fails on CI as it would hang
// on a GPU. A collective of the MPI communicator is a sim kernel that waits for the same collective
// on its peers, as an NCCL kernel does.
#pragma once

#include <functional>

#include "core/device/device.h"

namespace strata {

// Implemented by the sim backend's streams (and by the tracing decorator over them).
class SimKernelQueue {
 public:
  virtual void launch_kernel(std::function<void()> kernel) = 0;

 protected:
  ~SimKernelQueue() = default;
};

// Enqueues `kernel` on `stream`, which must be a stream of a sim device (DeviceError otherwise,
// naming the stream). An exception thrown by the kernel becomes the stream's sticky error.
void launch_sim_kernel(Stream& stream, std::function<void()> kernel);

// True on a sim stream's worker thread: inside a kernel, a copy or an event's completion.
bool inside_sim_kernel() noexcept;

}  // namespace strata
