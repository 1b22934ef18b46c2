// The engine's master test across ranks, run by ctest under `mpirun -np 2` and `-np 4`: in exact
// mode every stage (0-3), accumulation (1, 2) and sharding factor gives weights bit-identical to
// the stage-0 single-rank run over the same units (computed in-process on every rank with the
// local communicator); at stage 3 each rank's device bytes for model state are about 1/N of
// stage 0's. Prints "N passed, N failed" per rank; exits non-zero on any failure.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "engine/communicator.h"
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

struct Run {
  std::vector<std::vector<float>> weights;
  std::size_t state_bytes = 0;
};

// `units_per_step` units per step; this rank runs units a * world + rank for a < accumulation.
Run run(const TrainConfig& config, Communicator& comm, int steps, const ToyShape& shape) {
  SimDeviceOptions o;
  o.capacity_bytes = 256 << 20;
  auto device = make_sim_device(o);
  auto groups = testing_toy::toy_groups(shape, DType::F32);
  Run r;
  {
    ZeroEngine engine(config, *device, comm, groups, testing_toy::toy_init);
    auto stream = device->create_stream("compute");
    for (int s = 0; s < steps; ++s) {
      for (int a = 0; a < config.gradient_accumulation_steps; ++a) {
        engine.begin_micro_batch();
        testing_toy::toy_forward_backward(engine, *stream, shape, s,
                                          static_cast<std::int64_t>(a) * comm.world_size() + comm.rank());
        engine.end_micro_batch();
      }
      engine.step(config.optimizer.lr);
    }
    r.state_bytes = engine.model_state_device_bytes();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (std::size_t t = 0; t < groups[g].tensors.size(); ++t) r.weights.push_back(engine.gather_master(g, t));
    }
    stream->synchronize();
  }
  return r;
}

std::size_t count_differences(const Run& a, const Run& b) {
  std::size_t bad = 0;
  if (a.weights.size() != b.weights.size()) return 1;
  for (std::size_t i = 0; i < a.weights.size(); ++i) {
    if (a.weights[i].size() != b.weights[i].size()) return 1;
    for (std::size_t k = 0; k < a.weights[i].size(); ++k) {
      bad += std::memcmp(&a.weights[i][k], &b.weights[i][k], sizeof(float)) != 0;
    }
  }
  return bad;
}

}  // namespace

int main() {
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
  const int W = world->world_size();
  const ToyShape shape;
  const int steps = 5;

  for (int accumulation : {1, 2}) {
    // The reference: one rank, all W * accumulation units per step, stage 0.
    const Run reference = run(toy_config(0, W * accumulation, 0), *local, steps, shape);
    std::vector<int> factors = {0};
    if (W == 4) factors.push_back(2);
    for (int stage : {0, 1, 2, 3}) {
      for (int factor : factors) {
        if (stage == 0 && factor != 0) continue;
        const Run r = run(toy_config(stage, accumulation, factor), *world, steps, shape);
        const std::size_t bad = count_differences(r, reference);
        checks.expect(bad == 0,
               "world " + std::to_string(W) + " stage " + std::to_string(stage) + " accumulation " +
                   std::to_string(accumulation) + " sharding factor " + std::to_string(factor) + ": " +
                   std::to_string(bad) + " weights differ from the single-rank stage-0 run");
      }
    }
  }

  // Memory: a wider toy so padding does not dominate. Model-state bytes after a step at stage 3
  // against stage 0 on the same world: about 1/W, plus padding to whole aligned shards.
  ToyShape wide;
  wide.dim = 512;
  wide.layers = 2;
  wide.tokens = 2;
  const Run s0 = run(toy_config(0, 1, 0), *world, 1, wide);
  const Run s3 = run(toy_config(3, 1, 0), *world, 1, wide);
  const double ratio = static_cast<double>(s3.state_bytes) / static_cast<double>(s0.state_bytes);
  std::printf("rank %d: stage 3 model-state bytes %zu vs stage 0 %zu: ratio %.3f (1/W = %.3f)\n", rank, s3.state_bytes,
              s0.state_bytes, ratio, 1.0 / W);
  checks.expect(ratio <= 1.3 / W, "stage 3 holds about 1/W of stage 0's model state (ratio " + std::to_string(ratio) + ")");

  world->barrier();
  return checks.finish();
}
