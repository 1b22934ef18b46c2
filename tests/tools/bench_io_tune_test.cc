// `strata bench io --tune`'s config fragment (bench/bench_io_tune.h): it holds only keys the engine
// reads, so it loads through the strict config reader (as `strata train --config-fragment` merges
// it) and changes the run plan's I/O engine; a key the engine does not read is refused by the same
// reader, which is what keeps the fragment honest.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "bench/bench_io_tune.h"
#include "sim/step_sim.h"
#include "train/trainer.h"

namespace strata::bench {
namespace {

std::string write_fragment(const nlohmann::json& fragment, const std::string& name) {
  const std::string path = (std::filesystem::temp_directory_path() / (name + std::to_string(::getpid()) + ".json")).string();
  std::ofstream(path) << fragment.dump(2);
  return path;
}

// The built-in demo (it swaps to NVMe) with the fragment merged as train merges it.
RunPlan plan_with(const std::vector<std::string>& fragment_keys) {
  const TrainConfig cfg = train::load_train_config_or_demo("", fragment_keys);
  return sim::make_step_workload(cfg, 1, std::uint64_t{6} << 20).plan;
}

TEST(TuneFragment, LoadsThroughTheStrictReaderAndChangesThePlan) {
  const bench_io::TuneChoice choice{12, std::size_t{512} << 10, std::size_t{128} << 10};
  const nlohmann::json fragment = bench_io::tuned_fragment(choice);
  const std::string path = write_fragment(fragment, "tuned");
  const std::vector<std::string> keys = train::config_fragment_overrides(path);
  std::filesystem::remove(path);
  EXPECT_EQ(keys.size(), 3u);

  const RunPlan before = plan_with({});
  const RunPlan after = plan_with(keys);
  ASSERT_FALSE(after.offload.nvme_dirs.empty());
  EXPECT_EQ(after.offload.io.queue_depth, 12u);
  EXPECT_EQ(after.offload.io.max_request_bytes, std::size_t{512} << 10);
  EXPECT_EQ(after.offload.io.max_write_request_bytes, std::size_t{128} << 10);
  EXPECT_NE(before.offload.io.queue_depth, after.offload.io.queue_depth);
  EXPECT_NE(before.offload.io.max_request_bytes, after.offload.io.max_request_bytes);
  EXPECT_NE(before.offload.io.max_write_request_bytes, after.offload.io.max_write_request_bytes);
}

TEST(TuneFragment, AKeyTheEngineDoesNotReadIsRefused) {
  nlohmann::json fragment = bench_io::tuned_fragment({8, std::size_t{1} << 20, std::size_t{1} << 20});
  fragment["aio"]["jobs"] = 2;  // --tune sweeps jobs, but the engine has no such setting
  const std::string path = write_fragment(fragment, "tuned-bad");
  const std::vector<std::string> keys = train::config_fragment_overrides(path);
  std::filesystem::remove(path);
  try {
    plan_with(keys);
    ADD_FAILURE() << "aio.jobs was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("aio.jobs"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::bench
