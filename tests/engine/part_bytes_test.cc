// Each part of the engine allocates what the plan's byte functions say (see Note [Part bytes] in
// plan/part_bytes.h), on one rank: tests/engine/part_bytes_checks.h over every case. Worlds 2 and 4
// run the same checks under mpirun (tests/engine/part_bytes_mpi_main.cc).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "engine/offload_tier.h"
#include "tests/engine/part_bytes_checks.h"
#include "tests/offload/offload_test_util.h"

namespace strata {
namespace {

TEST(PartBytes, EveryPartAllocatesWhatThePlanSays) {
  offload::testing::TempDir dir;
  auto comm = make_local_communicator();
  for (const testing_parts::PartCase& k : testing_parts::part_cases()) {
    for (const std::string& line : testing_parts::check_part_bytes(k, *comm, dir.path() + "/swap")) ADD_FAILURE() << line;
  }
}

// A device held to the plan's figure trains (where gradients are written in place: every buffer
// of the step, the norm's partials with them, must fit) and exports (one rank gathers nothing;
// worlds 2 and 4 do, in part_bytes_mpi).
TEST(PartBytes, ADeviceHeldToThePlansFigureTrainsAndExports) {
  offload::testing::TempDir dir;
  auto comm = make_local_communicator();
  for (const testing_parts::PartCase& k : testing_parts::part_cases()) {
    if (k.precision != Precision::Fp32) continue;  // the toy model trains in fp32
    if (const std::string failure = testing_parts::check_at_plan(k, *comm, dir.path() + "/swap"); !failure.empty()) {
      ADD_FAILURE() << failure;
    }
  }
}

// The planner sums the same functions: where the gradients are written in place (one rank, one
// micro-batch, the state on the device) no part allocates a micro-batch buffer or a reduction, so
// the group in use costs only its gathered copy.
TEST(PartBytes, InPlaceGradientsCostNothingInTheWindow) {
  TrainConfig c = testing_parts::part_config({3, OffloadDevice::None, OffloadDevice::None, 1, true}, "");
  const auto groups = testing_toy::toy_groups({64, 96, 3, 6}, DType::F32);
  const RunPlan one = make_run_plan(c, groups, 1, 0);
  ASSERT_TRUE(one.gradients_in_place());
  std::uint64_t gathered = 0;
  for (std::size_t g = 0; g < one.groups.size(); ++g) {
    EXPECT_EQ(micro_grad_bytes(one, g), 0u);
    EXPECT_EQ(reduced_grad_bytes(one, g), 0u);
    gathered = std::max(gathered, gathered_bytes(one, g));
  }
  EXPECT_EQ(plan_tiers(one, 1, 0).device_window, gathered);
  EXPECT_EQ(plan_tiers(one, 1, 0).device_in_flight, 0u);
  // Two micro-batches: each group's buffer and its fp32 sums' input come back.
  c.gradient_accumulation_steps = 2;
  const RunPlan two = make_run_plan(c, groups, 1, 0);
  EXPECT_FALSE(two.gradients_in_place());
  EXPECT_GT(plan_tiers(two, 1, 0).device_window, gathered);
}

// A tier store holds host and NVMe arrays: an array whose home is the device is a caller's bug.
TEST(PartBytes, ATierStoreRefusesTheDevice) {
  EXPECT_EQ(tier_home(Home::Host), Home::Host);
  EXPECT_EQ(tier_home(Home::Nvme), Home::Nvme);
  EXPECT_THROW(tier_home(Home::Device), InternalError);
}

}  // namespace
}  // namespace strata
