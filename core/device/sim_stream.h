// The sim device's streams (core/device/sim_stream.cc): each an ordered queue of copies, kernels
// and event records and waits, run by a worker thread of its own. Internal to the sim backend.
#pragma once

#include <memory>
#include <string>

#include "core/device/device.h"
#include "core/device/sim_state.h"

namespace strata::sim_backend {

// A new stream of the device whose state is `device`, named `name` in messages.
std::unique_ptr<Stream> make_sim_stream(const std::shared_ptr<SimDeviceState>& device, std::string name);

}  // namespace strata::sim_backend
