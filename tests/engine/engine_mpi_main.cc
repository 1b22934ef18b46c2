// The engine's master test across ranks, run by ctest under `mpirun -np 2` and `-np 4`: in exact
// mode every stage (0-3), accumulation (1, 2) and sharding factor gives weights bit-identical to
// the stage-0 single-rank run over the same units (computed in-process on every rank with the
// local communicator); at stage 3 each rank's device bytes for model state are about 1/N of
// stage 0's; with the optimizer (and parameters) offloaded to host memory or NVMe, waiting or overlapped with
// backward, the weights are the same bits too. With the argument `chaos`, only the offload cases
// run, each under several seeds of schedule chaos (random pauses before every stream task and
// offload host task, see Note [Schedule chaos] in core/device/schedule_chaos.h; STRATA_CHAOS_SEEDS
// seeds, default 3), and must give the same bits every time. Prints "N passed, N failed" per rank; exits non-zero on any failure.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "comm/communicator.h"
#include "tests/core/sim_device_test_util.h"
#include "tests/engine/rank_checks.h"
#include "engine/zero_engine.h"
#include "tests/engine/toy_model.h"

namespace {

using namespace strata;
using testing_toy::ToyShape;

TrainConfig toy_config(int stage, int accumulation, int factor) {
  TrainConfig c = testing_toy::toy_train_config(stage, accumulation);
  c.zero.sharding_factor = factor;
  c.zero.param_persistence_threshold_elems = 0;
  return c;
}

using Run = testing_toy::ToyRun;

// This rank runs units a * world + rank for a < accumulation.
// A non-zero `chaos_seed` seeds schedule chaos on the device and the offload host thread (each rank
// its own seed).
Run run(const TrainConfig& config, Communicator& comm, int steps, const ToyShape& shape, bool prepare = false,
        std::uint64_t chaos_seed = 0) {
  SimDeviceOptions o;
  o.capacity_bytes = 256 << 20;
  o.chaos_seed = chaos_seed == 0 ? 0 : chaos_seed * 16 + static_cast<std::uint64_t>(comm.rank());
  o.chaos_max_us = 150;
  auto device = make_sim_device(o);
  testing_toy::ToyRunOptions options;
  options.steps = steps;
  options.shape = shape;
  options.prepare_step = prepare;
  return testing_toy::run_toy_engine(config, *device, comm, options);
}

std::size_t count_differences(const Run& a, const Run& b) { return testing_toy::count_weight_differences(a, b); }

// "tensor T element E: X vs Y" for the first differing weight ("" when none).
std::string first_difference(const Run& a, const Run& b) {
  for (std::size_t i = 0; i < a.weights.size() && i < b.weights.size(); ++i) {
    for (std::size_t k = 0; k < a.weights[i].size() && k < b.weights[i].size(); ++k) {
      if (std::memcmp(&a.weights[i][k], &b.weights[i][k], sizeof(float)) != 0) {
        return "first at tensor " + std::to_string(i) + " element " + std::to_string(k) + ": " +
               std::to_string(a.weights[i][k]) + " vs " + std::to_string(b.weights[i][k]);
      }
    }
  }
  return "";
}

// Every stage (0-3), accumulation (1, 2) and sharding factor on `world`: the same bits as the
// single-rank stage-0 run over the same units.
void check_stages_match_single_rank(Communicator& world, Communicator& local, testing_mpi::RankChecks& checks) {
  const int W = world.world_size();
  const ToyShape shape;
  const int steps = 5;
  for (int accumulation : {1, 2}) {
    // The reference: one rank, all W * accumulation units per step, stage 0.
    const Run reference = run(toy_config(0, W * accumulation, 0), local, steps, shape);
    std::vector<int> factors = {0};
    if (W == 4) factors.push_back(2);
    for (int stage : {0, 1, 2, 3}) {
      for (int factor : factors) {
        if (stage == 0 && factor != 0) continue;
        const Run r = run(toy_config(stage, accumulation, factor), world, steps, shape);
        const std::size_t bad = count_differences(r, reference);
        checks.expect(bad == 0,
               "world " + std::to_string(W) + " stage " + std::to_string(stage) + " accumulation " +
                   std::to_string(accumulation) + " sharding factor " + std::to_string(factor) + ": " +
                   std::to_string(bad) + " weights differ from the single-rank stage-0 run");
      }
    }
  }
}

// Offload at stage 3 (and the optimizer alone at stage 2), on a toy wide enough for several chunks per
// group: the same bits as the single-rank in-memory run, with the update waiting (clipping on) and
// overlapped with backward (clipping off).
void check_offload_matches_in_memory(Communicator& world, Communicator& local, testing_mpi::RankChecks& checks,
                                     int chaos_seeds = 0) {
  const int rank = world.rank();
  const int W = world.world_size();
  const std::string dir = std::filesystem::current_path().string() + "/engine_mpi_swap_w" + std::to_string(W);
  std::filesystem::create_directories(dir);
  ToyShape wide;
  wide.dim = 256;
  wide.vocab = 64;
  wide.layers = 2;
  wide.tokens = 2;
  for (bool clip : {true, false}) {
    TrainConfig base = toy_config(0, W, 0);
    if (!clip) base.gradient_clipping = 0;
    const Run reference = run(base, local, 3, wide);
    struct Case {
      int stage;
      OffloadDevice opt, param;
    };
    for (Case k : {Case{3, OffloadDevice::Cpu, OffloadDevice::Cpu}, Case{3, OffloadDevice::Nvme, OffloadDevice::Nvme},
                   Case{3, OffloadDevice::Nvme, OffloadDevice::None}, Case{2, OffloadDevice::Cpu, OffloadDevice::None}}) {
      TrainConfig c = toy_config(k.stage, 1, 0);
      if (!clip) c.gradient_clipping = 0;
      testing_toy::toy_offload(c, k.opt, k.param, dir);
      for (int seed = chaos_seeds > 0 ? 1 : 0; seed <= chaos_seeds; ++seed) {
        c.strata.device.chaos_seed =  // the host thread's; run() seeds the device alike
            seed == 0 ? 0 : static_cast<std::uint64_t>(seed) * 16 + static_cast<std::uint64_t>(rank);
        const std::string what = "world " + std::to_string(W) + " stage " + std::to_string(k.stage) + " optimizer " +
                                 std::string(offload_device_name(k.opt)) + " params " +
                                 std::string(offload_device_name(k.param)) + (clip ? " (waiting)" : " (overlapped)") +
                                 (seed > 0 ? ", chaos seed " + std::to_string(seed) : "");
        testing_sim::HangWatchdog watchdog("engine_mpi rank " + std::to_string(rank) + ": " + what,
                                           std::chrono::seconds(120));
        const Run r = run(c, world, 3, wide, /*prepare=*/!clip, static_cast<std::uint64_t>(seed));
        checks.expect(count_differences(r, reference) == 0,
                      what + ": " + std::to_string(count_differences(r, reference)) +
                          " weights differ from the single-rank in-memory run; " + first_difference(r, reference));
        checks.expect(clip ? r.overlapped_updates == 0 : r.overlapped_updates == r.chunk_updates && r.chunk_updates > 0,
                      what + ": " + std::to_string(r.overlapped_updates) + " of " + std::to_string(r.chunk_updates) +
                          " chunk updates overlapped");
      }
    }
  }
  world.barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}

// Memory: a wider toy so padding does not dominate. Model-state bytes after a step at stage 3
// against stage 0 on the same world: about 1/W, plus padding to whole aligned shards.
void check_stage3_memory(Communicator& world, testing_mpi::RankChecks& checks) {
  const int rank = world.rank();
  const int W = world.world_size();
  ToyShape wide;
  wide.dim = 512;
  wide.layers = 2;
  wide.tokens = 2;
  const Run s0 = run(toy_config(0, 1, 0), world, 1, wide);
  const Run s3 = run(toy_config(3, 1, 0), world, 1, wide);
  const double ratio = static_cast<double>(s3.state_bytes) / static_cast<double>(s0.state_bytes);
  std::printf("rank %d: stage 3 model-state bytes %zu vs stage 0 %zu: ratio %.3f (1/W = %.3f)\n", rank, s3.state_bytes,
              s0.state_bytes, ratio, 1.0 / W);
  checks.expect(ratio <= 1.3 / W, "stage 3 holds about 1/W of stage 0's model state (ratio " + std::to_string(ratio) + ")");
}

}  // namespace

int main(int argc, char** argv) {
  const bool chaos = argc > 1 && std::strcmp(argv[1], "chaos") == 0;
  if (!launched_by_mpi()) {
    std::fprintf(stderr, "engine_mpi_test must run under mpirun (ctest does this)\n");
    return 1;
  }
  SimDeviceOptions o;
  o.capacity_bytes = 16 << 20;
  auto bootstrap_device = make_sim_device(o);
  auto world = make_world_communicator(*bootstrap_device, CommunicatorOptions{});
  auto local = make_local_communicator();
  const int rank = world->rank();
  testing_mpi::RankChecks checks(rank);
  if (chaos) {
    const char* v = std::getenv("STRATA_CHAOS_SEEDS");
    const int seeds = v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : 3;
    check_offload_matches_in_memory(*world, *local, checks, seeds);
    world->barrier();
    return checks.finish();
  }
  check_stages_match_single_rank(*world, *local, checks);
  check_offload_matches_in_memory(*world, *local, checks);
  check_stage3_memory(*world, checks);
  world->barrier();
  return checks.finish();
}
