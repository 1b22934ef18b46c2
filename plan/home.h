// Where an array of a training run lives: the one enum for it. The run plan says which home each
// array has (plan/run_plan.h); the engine's tier store holds the arrays whose home is the host or
// NVMe (engine/offload_tier.h) and refuses Device; the config's OffloadDevice (config/config.h) is
// what a user asks for ("none", "cpu", "nvme", "auto"), turned into homes by the plan only.
#pragma once

#include <cstdint>

namespace strata {

enum class Home : std::uint8_t { Device, Host, Nvme };

inline const char* home_name(Home home) {
  switch (home) {
    case Home::Device: return "device";
    case Home::Host: return "host";
    case Home::Nvme: return "nvme";
  }
  return "?";
}

}  // namespace strata
