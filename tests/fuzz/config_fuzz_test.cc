// Fuzzes the config readers: whole config files (load_train_config, from the configs/*.json seeds)
// and `--set key.path=value` overrides (apply_override, then the parse) against a valid config.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "config/config.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/offload/offload_test_util.h"

namespace strata::fuzz {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> config_seeds() {
  std::vector<std::string> seeds;
  for (const auto& e : std::filesystem::directory_iterator(STRATA_CONFIGS_DIR)) {
    if (e.path().extension() == ".json") seeds.push_back(slurp(e.path().string()));
  }
  seeds.push_back("{}");
  seeds.push_back(R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2, "sub_group_size": "500M"},
                      "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.95]}},
                      "strata": {"device": {"kind": "sim", "memory": "8GiB"}, "offload": {"pinned_buffer": 1048576}}})");
  return seeds;
}

// key.path=value for every leaf of `j`.
void leaves(const nlohmann::json& j, const std::string& path, std::vector<std::string>* out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [k, v] : j.items()) leaves(v, path.empty() ? k : path + "." + k, out);
  } else if (!path.empty()) {
    out->push_back(path + "=" + j.dump());
  }
}

void check_sane(const TrainConfig& c) {
  if (!c.raw.is_object() || c.zero.stage < 0 || c.zero.stage > 3 || c.micro_batch_size < 1 ||
      c.gradient_accumulation_steps < 1) {
    throw InsaneResult("a config was accepted with out-of-range values: " + c.raw.dump().substr(0, 300));
  }
}

TEST(FuzzConfig, ConfigFiles) {
  offload::testing::TempDir dir;
  const std::string path = dir.path() + "/config.json";
  const FuzzStats s = fuzz_loop("config", config_seeds(), mutate_json, [&](const std::string& input) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << input;
    check_sane(load_train_config(path, {}));
  });
  EXPECT_GT(s.refused, 0u);
}

TEST(FuzzConfig, Overrides) {
  offload::testing::TempDir dir;
  const std::string path = dir.path() + "/config.json";
  const std::string base = slurp(std::string(STRATA_CONFIGS_DIR) + "/tiny.json");
  std::ofstream(path, std::ios::binary) << base;
  std::vector<std::string> seeds;
  for (const std::string& text : config_seeds()) {
    leaves(nlohmann::json::parse(text, nullptr, true, true), "", &seeds);
  }
  const Mutator mutate = [](std::string& a, Rng& rng, const std::vector<std::string>& others) {
    const auto eq = a.find('=');
    if (eq == std::string::npos || rng.one_in(3)) return mutate_bytes(a, rng, others);
    std::string value = a.substr(eq + 1);
    mutate_json(value, rng, others);
    a = a.substr(0, eq + 1) + value;
  };
  const FuzzStats s = fuzz_loop("set", seeds, mutate, [&](const std::string& assignment) {
    check_sane(load_train_config(path, {assignment}));
  });
  EXPECT_GT(s.refused, 0u);
}

}  // namespace
}  // namespace strata::fuzz
