// DeepSpeed's model-state estimators (plan/deepspeed_estimate.h) against the outputs DeepSpeed
// documents on its "Memory Requirements" page (docs/code-docs/source/memory.rst, the worked examples
// for t5-3b on 1 node x 8 GPUs and for t5-large on 4 GPUs), character for character where the page
// prints a table.
#include "plan/deepspeed_estimate.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace strata::deepspeed {
namespace {

// The page's text has its lines' trailing spaces trimmed (" | offload_optimizer=cpu " prints as
// "... =cpu"), so tables are compared line by line without them.
std::string trim_lines(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line)) {
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

// memory.rst, ZeRO3, `estimate_zero3_model_states_mem_needs_all_cold(total_params=2851e6,
// largest_layer_params=32e6, num_gpus_per_node=8, num_nodes=1)`.
TEST(DeepSpeedEstimate, Zero3AllColdMatchesTheDocumentedTable) {
  const std::string documented =
      "Estimated memory needed for params, optim states and gradients for a:\n"
      "HW: Setup with 1 node, 8 GPUs per node.\n"
      "SW: Model with 2851M total params, 32M largest layer params.\n"
      "  per CPU  |  per GPU |   Options\n"
      "   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"
      "  127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0\n"
      "   63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1\n"
      "  127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0\n"
      "    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1\n"
      "  127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=0\n";
  EXPECT_EQ(format_zero3_all_cold({.total_params = 2'851'000'000, .largest_layer_params = 32'000'000,
                                   .num_gpus_per_node = 8, .num_nodes = 1}),
            documented);
}

// memory.rst, ZeRO3, the live t5-3b model (`..._all_live(model, num_gpus_per_node=8, num_nodes=1)`).
// The page prints only "2851M" and "32M"; 2,851,598,336 parameters with a largest layer of
// 32,899,072 (the shared 32128 x 1024 embedding) reproduce every figure of its table.
TEST(DeepSpeedEstimate, Zero3LiveT5_3bTable) {
  const std::string documented =
      "   71.71GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"
      "  127.48GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0\n"
      "   63.74GB |   0.79GB | offload_param=none, offload_optimizer=cpu , zero_init=1\n"
      "  127.48GB |   0.79GB | offload_param=none, offload_optimizer=cpu , zero_init=0\n"
      "    1.47GB |   6.10GB | offload_param=none, offload_optimizer=none, zero_init=1\n"
      "  127.48GB |   6.10GB | offload_param=none, offload_optimizer=none, zero_init=0\n";
  const std::string text = format_zero3_all_cold(
      {.total_params = 2'851'598'336, .largest_layer_params = 32'899'072, .num_gpus_per_node = 8, .num_nodes = 1});
  EXPECT_NE(text.find("SW: Model with 2851M total params, 32M largest layer params.\n"), std::string::npos) << text;
  EXPECT_NE(text.find(documented), std::string::npos) << text;
}

// memory.rst, ZeRO2, `estimate_zero2_model_states_mem_needs_all_cold(total_params=2851e6,
// num_gpus_per_node=8, num_nodes=1)` and the live t5-3b table, both printed before DeepSpeed PR
// #5099 changed the GPU figure without offload.
TEST(DeepSpeedEstimate, Zero2AllColdMatchesTheDocumentedTables) {
  const std::string cold =
      "Estimated memory needed for params, optim states and gradients for a:\n"
      "HW: Setup with 1 node, 8 GPUs per node.\n"
      "SW: Model with 2851M total params.\n"
      "  per CPU  |  per GPU |   Options\n"
      "  127.45GB |   5.31GB | offload_optimizer=cpu\n"
      "  127.45GB |  15.93GB | offload_optimizer=none\n";
  Zero2Args args{.total_params = 2'851'000'000, .num_gpus_per_node = 8, .num_nodes = 1,
                 .formula = Zero2GpuFormula::BeforePr5099};
  EXPECT_EQ(trim_lines(format_zero2_all_cold(args)), cold);

  args.total_params = 2'851'598'336;
  const std::string live = trim_lines(format_zero2_all_cold(args));
  EXPECT_NE(live.find("  127.48GB |   5.31GB | offload_optimizer=cpu\n"), std::string::npos) << live;
  EXPECT_NE(live.find("  127.48GB |  15.93GB | offload_optimizer=none\n"), std::string::npos) << live;
}

// The current formula, by hand: 2 * 2851e6 + int(18 * 2851e6 / 8) = 5,702,000,000 + 6,414,750,000.
TEST(DeepSpeedEstimate, Zero2CurrentGpuFormula) {
  const ModelStatesMem m = estimate_zero2_model_states_mem_needs(
      {.total_params = 2'851'000'000, .num_gpus_per_node = 8, .num_nodes = 1, .cpu_offload = false});
  EXPECT_EQ(m.gpu_bytes, 12'116'750'000u);
  EXPECT_EQ(m.cpu_bytes, 136'848'000'000u);  // 2851e6 * 4 * 8 * 1.5
  EXPECT_EQ(m.largest_layer_bytes, 0u);
  // Offloaded: the 16-bit parameters on the GPU, max(4 * 8, 16) bytes per parameter on the CPU.
  const ModelStatesMem off = estimate_zero2_model_states_mem_needs({.total_params = 2'851'000'000, .num_gpus_per_node = 8});
  EXPECT_EQ(off.gpu_bytes, 5'702'000'000u);
  EXPECT_EQ(off.cpu_bytes, 136'848'000'000u);
}

// memory.rst, "GPU RAM", ZeRO-3: t5-large (737.67M parameters, largest layer 32.90M: 737,668,096
// and the 32128 x 1024 embedding) on 4 GPUs prints, in MiB (>> 20):
//   largest layer memory: 125MB; case1 gpu memory: 3291MB; case2: 125MB; case3: 477MB.
TEST(DeepSpeedEstimate, Zero3GpuCasesOfT5Large) {
  const Zero3Args t5_large{.total_params = 737'668'096, .largest_layer_params = 32'899'072, .num_gpus_per_node = 4};
  Zero3Args none = t5_large, both = t5_large, optimizer = t5_large;
  none.cpu_offload = false;
  none.cpu_offload_params = false;
  optimizer.cpu_offload_params = false;
  EXPECT_EQ(estimate_zero3_model_states_mem_needs(none).largest_layer_bytes >> 20, 125u);
  EXPECT_EQ(estimate_zero3_model_states_mem_needs(none).gpu_bytes >> 20, 3291u);
  EXPECT_EQ(estimate_zero3_model_states_mem_needs(both).gpu_bytes >> 20, 125u);
  EXPECT_EQ(estimate_zero3_model_states_mem_needs(optimizer).gpu_bytes >> 20, 477u);
}

// Several nodes: gpus_factor = 1 / num_nodes divides the CPU figures per node, and without zero.Init
// max(4 * gpus per node, 18 * gpus_factor) picks the model's fp32 copy per GPU when it is larger.
// By hand for 1e9 parameters, 2 nodes x 8 GPUs:
//   zero_init:  1e9 * 18 * 0.5 * 1.5 = 13.5e9;   without: 1e9 * max(32, 9.0) * 1.5 = 48e9
//   GPU: 4 * 1e8 (largest layer), and with parameters on the GPU + int(2e9 / 16) = 125e6.
TEST(DeepSpeedEstimate, Zero3SeveralNodes) {
  Zero3Args a{.total_params = 1'000'000'000, .largest_layer_params = 100'000'000, .num_gpus_per_node = 8,
              .num_nodes = 2};
  EXPECT_EQ(estimate_zero3_model_states_mem_needs(a).cpu_bytes, 13'500'000'000u);
  EXPECT_EQ(estimate_zero3_model_states_mem_needs(a).gpu_bytes, 400'000'000u);
  a.zero_init = false;
  EXPECT_EQ(estimate_zero3_model_states_mem_needs(a).cpu_bytes, 48'000'000'000u);
  a.cpu_offload_params = false;
  EXPECT_EQ(estimate_zero3_model_states_mem_needs(a).gpu_bytes, 525'000'000u);
  // One GPU per node on 1 node: 18 * 1.0 beats 4 * 1, so the float branch of max() is taken.
  const Zero3Args one{.total_params = 1'000'000'000, .largest_layer_params = 1, .zero_init = false};
  EXPECT_EQ(estimate_zero3_model_states_mem_needs(one).cpu_bytes, 27'000'000'000u);
}

// int() truncates: 7 parameters on 3 GPUs, ZeRO-3 without offload: 4 * 1 + int(126 / 3 = 42.0) = 46;
// on 4 GPUs int(31.5) = 31 -> 35. ZeRO-2 offload CPU: int(7 * 16 * 1.5 = 168.0); factor 1.3:
// 7 * 16 * 1.3 = 145.6 -> 145.
TEST(DeepSpeedEstimate, TruncatesLikePythonInt) {
  Zero3Args a{.total_params = 7, .largest_layer_params = 1, .num_gpus_per_node = 3, .cpu_offload = false,
              .cpu_offload_params = false};
  EXPECT_EQ(estimate_zero3_model_states_mem_needs(a).gpu_bytes, 46u);
  a.num_gpus_per_node = 4;
  EXPECT_EQ(estimate_zero3_model_states_mem_needs(a).gpu_bytes, 35u);
  EXPECT_EQ(estimate_zero2_model_states_mem_needs({.total_params = 7}).cpu_bytes, 168u);
  EXPECT_EQ(estimate_zero2_model_states_mem_needs({.total_params = 7, .additional_buffer_factor = 1.3}).cpu_bytes, 145u);
}

}  // namespace
}  // namespace strata::deepspeed
