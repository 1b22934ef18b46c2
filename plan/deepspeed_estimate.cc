// DeepSpeed's model-state memory estimators (plan/deepspeed_estimate.h). Each function follows
// DeepSpeed's expression term by term; the helpers below say which Python operation each step is.
#include "plan/deepspeed_estimate.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace strata::deepspeed {
namespace {

// Python's int * float: the int becomes a double (exact below 2^53), then one rounded product.
double mul(std::uint64_t i, double f) { return static_cast<double>(i) * f; }

// Python's int / int: the correctly rounded quotient, which IEEE division of exact operands gives.
double true_div(std::uint64_t a, std::uint64_t b) { return static_cast<double>(a) / static_cast<double>(b); }

// Python's int() of a non-negative float: truncation.
std::uint64_t py_int(double x) { return static_cast<std::uint64_t>(std::trunc(x)); }

// Python's total_params * max(an_int, a_float): max keeps the first operand unless the second is
// larger, and the product stays an exact integer when the int wins.
double mul_max(std::uint64_t total_params, std::uint64_t an_int, double a_float) {
  if (a_float > static_cast<double>(an_int)) return mul(total_params, a_float);
  return static_cast<double>(total_params * an_int);
}

void check_gpus(int num_gpus_per_node, int num_nodes) {
  STRATA_CHECK(num_gpus_per_node >= 1 && num_nodes >= 1, "DeepSpeed estimate for {} GPUs per node on {} nodes",
               num_gpus_per_node, num_nodes);
}

// The "HW:" line both tables print.
std::string hardware_line(int num_gpus_per_node, int num_nodes) {
  return fmt::format("HW: Setup with {} {}, {} {} per node.\n", num_nodes, num_nodes > 1 ? "nodes" : "node",
                     num_gpus_per_node, num_gpus_per_node > 1 ? "GPUs" : "GPU");
}

// The table after the "SW:" line: f" {cpu_mem/2**30:7.2f}GB | {gpu_mem/2**30:6.2f}GB | {options}".
std::string table(const std::vector<EstimateRow>& rows) {
  constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
  std::string out = "  per CPU  |  per GPU |   Options\n";
  for (const EstimateRow& r : rows) {
    out += fmt::format(" {:7.2f}GB | {:6.2f}GB | {}\n", true_div(r.mem.cpu_bytes, kGiB), true_div(r.mem.gpu_bytes, kGiB),
                       r.options);
  }
  return out;
}

// f'{OffloadDeviceEnum.cpu:4}' pads "cpu" to four characters.
const char* device_name(bool cpu) { return cpu ? "cpu " : "none"; }

}  // namespace

ModelStatesMem estimate_zero2_model_states_mem_needs(const Zero2Args& a) {
  check_gpus(a.num_gpus_per_node, a.num_nodes);
  const std::uint64_t p = a.total_params;
  const auto total_gpus = static_cast<std::uint64_t>(a.num_nodes) * static_cast<std::uint64_t>(a.num_gpus_per_node);
  const auto gpus_per_node = static_cast<std::uint64_t>(a.num_gpus_per_node);
  ModelStatesMem m;
  if (a.cpu_offload) {
    m.gpu_bytes = 2 * p;
    m.cpu_bytes = py_int(mul(p * std::max<std::uint64_t>(4 * total_gpus, 16), a.additional_buffer_factor));
  } else {
    if (a.formula == Zero2GpuFormula::Current) {
      m.gpu_bytes = 2 * p + py_int(true_div(18 * p, total_gpus));
    } else {
      m.gpu_bytes = 4 * p + py_int(true_div(16 * p, total_gpus));
    }
    m.cpu_bytes = py_int(mul(p * 4 * gpus_per_node, a.additional_buffer_factor));
  }
  return m;
}

ModelStatesMem estimate_zero3_model_states_mem_needs(const Zero3Args& a) {
  check_gpus(a.num_gpus_per_node, a.num_nodes);
  const std::uint64_t p = a.total_params;
  const auto total_gpus = static_cast<std::uint64_t>(a.num_nodes) * static_cast<std::uint64_t>(a.num_gpus_per_node);
  const auto gpus_per_node = static_cast<std::uint64_t>(a.num_gpus_per_node);
  const double gpus_factor = 1.0 / a.num_nodes;
  const double abf = a.additional_buffer_factor;
  ModelStatesMem m;
  m.largest_layer_bytes = 4 * a.largest_layer_params;
  if (a.cpu_offload) {
    // 18 bytes per parameter on the CPU with the parameters there too (16 + the 16-bit copy), else 16.
    const std::uint64_t per_param = a.cpu_offload_params ? 18 : 16;
    m.gpu_bytes = a.cpu_offload_params ? m.largest_layer_bytes
                                       : m.largest_layer_bytes + py_int(true_div(2 * p, total_gpus));
    if (a.zero_init) {
      m.cpu_bytes = py_int(mul(p * per_param, gpus_factor) * abf);
    } else {
      m.cpu_bytes = py_int(mul_max(p, 4 * gpus_per_node, static_cast<double>(per_param) * gpus_factor) * abf);
    }
  } else {
    m.gpu_bytes = m.largest_layer_bytes + py_int(true_div(18 * p, total_gpus));
    const std::uint64_t initialized = a.zero_init ? a.largest_layer_params : p;
    m.cpu_bytes = py_int(mul(initialized * 4 * gpus_per_node, abf));
  }
  return m;
}

std::vector<EstimateRow> zero2_all_cold(const Zero2Args& args) {
  std::vector<EstimateRow> rows;
  for (const bool cpu_offload : {true, false}) {
    Zero2Args a = args;
    a.cpu_offload = cpu_offload;
    rows.push_back({fmt::format("offload_optimizer={}", device_name(cpu_offload)), estimate_zero2_model_states_mem_needs(a)});
  }
  return rows;
}

std::vector<EstimateRow> zero3_all_cold(const Zero3Args& args) {
  std::vector<EstimateRow> rows;
  for (const bool cpu_offload : {true, false}) {
    for (const bool cpu_offload_params : {true, false}) {
      if (!cpu_offload && cpu_offload_params) continue;  // parameters offload only with the optimizer
      for (const bool zero_init : {true, false}) {
        Zero3Args a = args;
        a.cpu_offload = cpu_offload;
        a.cpu_offload_params = cpu_offload_params;
        a.zero_init = zero_init;
        rows.push_back({fmt::format("offload_param={}, offload_optimizer={}, zero_init={}", device_name(cpu_offload_params),
                                    device_name(cpu_offload), zero_init ? 1 : 0),
                        estimate_zero3_model_states_mem_needs(a)});
      }
    }
  }
  return rows;
}

std::string format_zero2_all_cold(const Zero2Args& args) {
  return "Estimated memory needed for params, optim states and gradients for a:\n" +
         hardware_line(args.num_gpus_per_node, args.num_nodes) +
         fmt::format("SW: Model with {}M total params.\n", py_int(static_cast<double>(args.total_params) / 1e6)) +
         table(zero2_all_cold(args));
}

std::string format_zero3_all_cold(const Zero3Args& args) {
  return "Estimated memory needed for params, optim states and gradients for a:\n" +
         hardware_line(args.num_gpus_per_node, args.num_nodes) +
         fmt::format("SW: Model with {}M total params, {}M largest layer params.\n",
                     py_int(static_cast<double>(args.total_params) / 1e6),
                     py_int(static_cast<double>(args.largest_layer_params) / 1e6)) +
         table(zero3_all_cold(args));
}

}  // namespace strata::deepspeed
