// The before/after check of the engine's exact mode: the final weights and the loss curve of the toy
// model after a few steps, for every stage and every offload tier, hashed and compared with hashes
// committed here. The hashes were taken from the engine before its split into parameter fetcher,
// gradient reducer and optimizer-state homes (issue 14); a change to the engine that alters one bit
// of exact-mode training fails this test, even one that changes every configuration alike (which
// the in-memory comparisons of offload_test.cc cannot see).
//
// When a change is meant to alter the numbers (a new initializer, a different toy), the failure
// prints the new hash to paste below, with the reason in the commit message.
#include <gtest/gtest.h>

#include <xxhash.h>

#include <cinttypes>
#include <cstdio>
#include <string>

#include "engine/zero_engine.h"
#include "tests/engine/toy_model.h"
#include "tests/offload/offload_test_util.h"

namespace strata {
namespace {

using testing_toy::ToyRun;

struct Golden {
  int accumulation;
  bool clipping;  // on: the update waits for the whole step; off: an offloaded update may overlap backward
  std::uint64_t hash;
};

// Taken from the engine of commit c411ae4 (before the engine split: docs/MEASUREMENTS.md, "Engine
// split: before and after"), x86-64, Debian.
constexpr Golden kGolden[] = {
    {1, true, 0x51f417c11a3056f9ull},
    {4, true, 0xba06570f251fd0ebull},
    {2, false, 0x22eb85ca3b2ee574ull},
};

std::uint64_t hash_run(const ToyRun& r) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  for (const auto& w : r.weights) XXH64_update(st, w.data(), w.size() * sizeof(float));
  XXH64_update(st, r.losses.data(), r.losses.size() * sizeof(float));
  const std::uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

std::string hex(std::uint64_t h) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%016" PRIx64 "ull", h);
  return buf;
}

const char* name(OffloadDevice d) { return d == OffloadDevice::Nvme ? "nvme" : d == OffloadDevice::Cpu ? "cpu" : "none"; }

class EngineGolden : public ::testing::Test {
 protected:
  void SetUp() override { STRATA_SKIP_WITHOUT_DIRECT_IO(dir_.path()); }
  offload::testing::TempDir dir_;
};

TEST_F(EngineGolden, ExactWeightsMatchTheCommittedHashesForEveryStageAndTier) {
  for (const Golden& golden : kGolden) {
    for (int stage : {0, 1, 2, 3}) {
      for (OffloadDevice opt : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}) {
        for (OffloadDevice param : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}) {
          if (opt != OffloadDevice::None && stage == 0) continue;
          if (param != OffloadDevice::None && (stage != 3 || opt == OffloadDevice::None)) continue;
          TrainConfig c = testing_toy::toy_train_config(stage, golden.accumulation);
          c.zero.param_persistence_threshold_elems = 0;
          c.optimizer.lr = 2e-3;
          if (!golden.clipping) c.gradient_clipping = 0;
          if (opt != OffloadDevice::None) testing_toy::toy_offload(c, opt, param, dir_.path());
          testing_toy::ToyRunOptions o;
          o.steps = 3;
          o.shape.dim = 256;  // a block's weight spans several 16 Ki-element chunks
          o.shape.vocab = 64;
          o.shape.layers = 2;
          o.shape.tokens = 4;
          o.prepare_step = !golden.clipping;
          const ToyRun r = testing_toy::run_toy_local(c, o);
          const std::uint64_t h = hash_run(r);
          EXPECT_EQ(hex(h), hex(golden.hash))
              << "stage " << stage << ", accumulation " << golden.accumulation << ", clipping "
              << (golden.clipping ? "on" : "off") << ", optimizer " << name(opt) << ", params " << name(param)
              << ": the engine's exact-mode bits changed (new hash " << hex(h) << ")";
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata
