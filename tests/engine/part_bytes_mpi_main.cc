// Each part of the engine allocates what the plan's byte functions say (see Note [Part bytes] in
// plan/part_bytes.h) on every rank of a world of 2 or 4, run by ctest under mpirun:
// tests/engine/part_bytes_checks.h over every case (sharded state, reduce-scatter, all-gathered
// shards, each rank's swap file), and a device of exactly the plan's figure trains and exports
// (gather_master's all-gathers). Prints "N passed, N failed" per rank; exits non-zero on any
// failure.
#include <cstdio>
#include <filesystem>
#include <string>

#include "comm/communicator.h"
#include "core/device/device.h"
#include "tests/engine/part_bytes_checks.h"
#include "tests/engine/rank_checks.h"

int main() {
  using namespace strata;
  if (!launched_by_mpi()) {
    std::fprintf(stderr, "part_bytes_mpi must run under mpirun (ctest does this)\n");
    return 1;
  }
  SimDeviceOptions o;
  o.capacity_bytes = 16 << 20;
  auto bootstrap_device = make_sim_device(o);
  auto world = make_world_communicator(*bootstrap_device, CommunicatorOptions{});
  testing_mpi::RankChecks checks(world->rank());
  // One directory per world size: ctest may run the np2 and np4 tests at once.
  const std::string dir =
      std::filesystem::current_path().string() + "/part_bytes_swap_w" + std::to_string(world->world_size());
  std::filesystem::create_directories(dir);
  for (const testing_parts::PartCase& k : testing_parts::part_cases()) {
    const std::vector<std::string> bad = testing_parts::check_part_bytes(k, *world, dir + "/swap");
    checks.expect(bad.empty(), testing_parts::case_name(k));
    for (const std::string& line : bad) std::fprintf(stderr, "rank %d: %s\n", world->rank(), line.c_str());
    if (k.precision != Precision::Fp32) continue;  // the toy model trains in fp32
    const std::string failure = testing_parts::check_at_plan(k, *world, dir + "/swap");
    checks.expect(failure.empty(), testing_parts::case_name(k) + " at the plan's figure");
    if (!failure.empty()) std::fprintf(stderr, "rank %d: %s\n", world->rank(), failure.c_str());
  }
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
  return checks.finish();
}
