// DeepSpeed's model-state memory estimators, reproduced to the byte, so `strata estimate` can print
// DeepSpeed's answer for a model beside Strata's own plan.
//
// DeepSpeed (deepspeed/runtime/zero/stage_1_and_2.py and stage3.py, documented on the "Memory
// Requirements" page, docs/code-docs/source/memory.rst) estimates the bytes of parameters,
// gradients and optimizer states per GPU and per node's CPU from the parameter count alone:
//   ZeRO-2  estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node, num_nodes,
//                                                 cpu_offload, additional_buffer_factor)
//   ZeRO-3  estimate_zero3_model_states_mem_needs(total_params, largest_layer_params, ...,
//                                                 cpu_offload, cpu_offload_params, zero_init, ...)
// and `..._all_cold` prints one row per offload choice. These functions take the same arguments
// (a struct with DeepSpeed's keyword names and defaults, so a call reads like the Python one) and
// do the same arithmetic in the same order: integer products exact, Python's true division and
// float products in double, and int() truncating, so the results equal DeepSpeed's for parameter
// counts below 2^53 / 18 (5e14).
//
// The ZeRO-2 GPU figure without offload changed in DeepSpeed PR #5099 (2024): 2 * P + int(18 * P /
// gpus) now, 4 * P + int(16 * P / gpus) before, which is still what memory.rst's worked example
// shows. Zero2GpuFormula picks one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::deepspeed {

enum class Zero2GpuFormula { Current, BeforePr5099 };

struct Zero2Args {
  std::uint64_t total_params = 0;
  int num_gpus_per_node = 1;
  int num_nodes = 1;
  bool cpu_offload = true;
  double additional_buffer_factor = 1.5;
  Zero2GpuFormula formula = Zero2GpuFormula::Current;
};

struct Zero3Args {
  std::uint64_t total_params = 0;
  std::uint64_t largest_layer_params = 0;
  int num_gpus_per_node = 1;
  int num_nodes = 1;
  bool cpu_offload = true;
  bool cpu_offload_params = true;
  bool zero_init = true;
  double additional_buffer_factor = 1.5;
};

// DeepSpeed's return tuple: (cpu_mem, gpu_mem[, largest_layer_memory]), in bytes; cpu_mem is per
// node, gpu_mem per GPU. largest_layer_memory is 0 for ZeRO-2, which does not return one.
struct ModelStatesMem {
  std::uint64_t cpu_bytes = 0;
  std::uint64_t gpu_bytes = 0;
  std::uint64_t largest_layer_bytes = 0;
};

ModelStatesMem estimate_zero2_model_states_mem_needs(const Zero2Args& args);
ModelStatesMem estimate_zero3_model_states_mem_needs(const Zero3Args& args);

// One row of an `..._all_cold` table: the options as DeepSpeed prints them and its estimate.
struct EstimateRow {
  std::string options;  // e.g. "offload_param=cpu , offload_optimizer=none, zero_init=1"
  ModelStatesMem mem;
};

// The rows `estimate_zero{2,3}_model_states_mem_needs_all_cold` prints, in its order (ZeRO-2:
// offload_optimizer cpu, none; ZeRO-3: (param, optimizer) = (cpu, cpu), (none, cpu), (none, none),
// each with zero_init 1 then 0). The args' offload choices are ignored.
std::vector<EstimateRow> zero2_all_cold(const Zero2Args& args);
std::vector<EstimateRow> zero3_all_cold(const Zero3Args& args);

// The text those functions print for the rows, line for line ("Estimated memory needed for ...",
// "  per CPU  |  per GPU |   Options", then " 127.45GB |   5.31GB | offload_optimizer=cpu ").
std::string format_zero2_all_cold(const Zero2Args& args);
std::string format_zero3_all_cold(const Zero3Args& args);

}  // namespace strata::deepspeed
