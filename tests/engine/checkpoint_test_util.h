// What the checkpoint tests (checkpoint_save_test.cc, checkpoint_load_test.cc) share: the toy
// shape and config they train, ToyTrainer (one engine on its own sim device, trained step by step,
// saving and loading as the trainer does), the uninterrupted reference run, the tier setups, and the
// `Checkpoint` fixture with its temporary directory. A named namespace, not an anonymous one: the
// fixture must be one type in both files for GoogleTest to accept one `Checkpoint` suite.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"
#include "engine/zero_engine.h"
#include "tests/engine/toy_model.h"
#include "tests/offload/offload_test_util.h"

namespace strata::testing_checkpoint {

using testing_toy::ToyRun;
using testing_toy::ToyShape;

inline constexpr const char* kModel = "toy";

// Wide enough that a block's weight spans several offload chunks.
inline ToyShape shape() {
  ToyShape s;
  s.dim = 192;
  s.vocab = 48;
  s.layers = 2;
  s.tokens = 4;
  return s;
}

inline TrainConfig config(int stage, int accumulation = 2) {
  TrainConfig c = testing_toy::toy_train_config(stage, accumulation);
  c.zero.param_persistence_threshold_elems = 0;
  c.optimizer.lr = 2e-3;
  return c;
}

// One engine on its own sim device, trained step by step.
struct ToyTrainer {
  ToyTrainer(const TrainConfig& c, const ToyShape& s = shape())
      : config(c),
        toy(s),
        device(make_device()),
        comm(make_local_communicator()),
        engine(std::make_unique<ZeroEngine>(config, *device, *comm, testing_toy::toy_groups(s, DType::F32, true),
                                            testing_toy::toy_init)),
        stream(device->create_stream("compute")) {}
  static std::unique_ptr<Device> make_device() {
    SimDeviceOptions o;
    o.capacity_bytes = 64 << 20;
    return make_sim_device(o);
  }
  void train(int from, int to) {
    for (int s = from; s < to; ++s) {
      if (overlap) engine->prepare_step(config.optimizer.lr);
      for (int a = 0; a < config.gradient_accumulation_steps; ++a) {
        engine->begin_micro_batch();
        testing_toy::toy_forward_backward(*engine, *stream, toy, s, a);
        engine->end_micro_batch();
      }
      engine->step(config.optimizer.lr);
    }
    stream->synchronize();
  }
  ToyRun weights() {
    ToyRun r;
    const auto groups = engine->groups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (std::size_t t = 0; t < groups[g].tensors.size(); ++t) r.weights.push_back(engine->gather_master(g, t));
    }
    return r;
  }
  static CheckpointSaveOptions options(const std::string& parent, int keep = 2,
                                       std::function<int(const std::string&)> hook = {},
                                       CheckpointRetention* retention = nullptr) {
    CheckpointSaveOptions o;
    o.parent = parent;
    o.keep = keep;
    o.fault_hook = std::move(hook);
    o.retention = retention;
    return o;
  }
  // Saves as the trainer does: old checkpoints are deleted in the background by `retention`.
  CheckpointSaveResult save(const std::string& parent, std::int64_t step, int keep = 2,
                            std::function<int(const std::string&)> hook = {}, PendingCheckpoint* pending = nullptr) {
    return save_checkpoint(*engine, *comm, config, kModel, step, options(parent, keep, std::move(hook), &retention),
                           pending);
  }
  // Trains up to `step` with the last step captured into a checkpoint begun before it.
  CheckpointSaveResult train_and_capture(const std::string& parent, int from, int step,
                                         std::function<int(const std::string&)> hook = {}) {
    train(from, step - 1);
    auto pending = begin_checkpoint(*engine, *comm, config, step, options(parent, 2, hook, &retention));
    train(step - 1, step);
    captured = engine->checkpoint().captured_pieces();
    return save(parent, step, 2, hook, pending.get());
  }
  CheckpointManifest load(const std::string& dir, const std::string& model = kModel) {
    return load_checkpoint(*engine, *comm, config, model, dir);
  }

  TrainConfig config;
  ToyShape toy;
  std::unique_ptr<Device> device;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<ZeroEngine> engine;
  std::unique_ptr<Stream> stream;
  bool overlap = false;       // announce each step's lr: offloaded updates overlap backward
  std::size_t captured = 0;   // pieces the last train_and_capture step handed out
  CheckpointRetention retention;
};


inline constexpr int kSteps = 5;
inline constexpr int kSaveAt = 2;

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline ToyRun uninterrupted(const TrainConfig& c) {
  ToyTrainer t(c);
  t.train(0, kSteps);
  return t.weights();
}

inline const char* tier(OffloadDevice d) {
  return d == OffloadDevice::Nvme ? "nvme" : d == OffloadDevice::Cpu ? "cpu" : "device";
}

struct TierSetup {
  int stage;
  OffloadDevice optimizer;
  OffloadDevice params;
  std::string name() const {
    return "stage " + std::to_string(stage) + " optimizer on " + tier(optimizer) + " params on " + tier(params);
  }
};

class Checkpoint : public ::testing::Test {
 protected:
  TrainConfig with(const TierSetup& s) {
    TrainConfig c = config(s.stage);
    if (s.optimizer != OffloadDevice::None) testing_toy::toy_offload(c, s.optimizer, s.params, dir_.sub("swap"));
    return c;
  }
  bool nvme_ok() { return offload::testing::direct_io_problem(dir_.path()).empty(); }
  offload::testing::TempDir dir_;
};

}  // namespace strata::testing_checkpoint
