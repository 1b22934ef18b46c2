// What the sim device tests (sim_device_test.cc, sim_device_link_stress_test.cc) share: a small
// sim device's options and a byte pattern that shows a shifted or partial copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "core/device/device.h"
#include "core/units.h"

namespace strata::testing_sim {

inline SimDeviceOptions small_device(std::size_t capacity_bytes = 64 * MiB) {
  SimDeviceOptions o;
  o.capacity_bytes = capacity_bytes;
  return o;
}

// A pattern that differs at every offset, so a shifted or partial copy shows. Word stores: a
// byte loop over 256 MiB is slow under sanitizers.
inline void fill_pattern(std::span<unsigned char> buf, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::size_t i = 0;
  for (; i + 8 <= buf.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(buf.data() + i, &x, 8);
  }
  for (; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 31 + seed);
}

}  // namespace strata::testing_sim
