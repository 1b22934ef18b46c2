// "A trace shows prefetch copies and collectives running during compute": a stage-3 run of the toy
// model on a traced sim device whose device-to-device copies are throttled (so gathers take real
// time), then the recorded timeline must show work of the engine's communication stream running
// while the compute stream runs the model, and the Chrome trace file must be valid JSON.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/device/traced_device.h"
#include "engine/zero_engine.h"
#include "tests/engine/toy_model.h"

namespace strata {
namespace {

TEST(Trace, PrefetchGathersOverlapCompute) {
  SimDeviceOptions o;
  o.capacity_bytes = 64 << 20;
  o.d2d_gbps = 0.5;  // a 128x128 fp32 group gather takes ~0.5 ms: comparable to its compute
  auto sim = make_sim_device(o);
  auto recorder = std::make_shared<TraceRecorder>();
  auto device = make_traced_device(*sim, recorder);
  auto comm = make_local_communicator();

  TrainConfig c = parse_train_config(nlohmann::json::object(), "test");
  c.strata.exact = true;
  c.zero.stage = 3;
  c.zero.param_persistence_threshold_elems = 0;
  c.zero.prefetch_bucket_size_elems = 1 << 20;
  testing_toy::ToyShape shape;
  shape.dim = 128;
  shape.layers = 6;
  shape.tokens = 8;
  ZeroEngine engine(c, *device, *comm, testing_toy::toy_groups(shape, DType::F32), testing_toy::toy_init);
  auto stream = device->create_stream("compute");
  for (int s = 0; s < 3; ++s) {
    engine.begin_micro_batch();
    testing_toy::toy_forward_backward(engine, *stream, shape, s, 0);
    engine.end_micro_batch();
    engine.step(1e-3);
  }
  EXPECT_GT(engine.prefetched_gathers(), 0u);

  const auto slices = recorder->slices();
  std::size_t overlaps = 0, comm_slices = 0;
  for (const auto& a : slices) {
    if (a.stream != "zero.comm") continue;
    ++comm_slices;
    for (const auto& b : slices) {
      if (b.stream == "compute" && b.op == "kernel" && a.begin_us < b.end_us && b.begin_us < a.end_us) {
        ++overlaps;
        break;
      }
    }
  }
  EXPECT_GT(comm_slices, 0u);
  EXPECT_GT(overlaps, 0u) << "no communication-stream work ran during compute (" << comm_slices << " comm slices)";

  const std::string path = ::testing::TempDir() + "/strata_trace.json";
  recorder->write_chrome_trace(path);
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  ASSERT_TRUE(j.contains("traceEvents"));
  EXPECT_GE(j["traceEvents"].size(), slices.size());
}

}  // namespace
}  // namespace strata
