// `strata doctor --measure` (sim/doctor_measure.h).
#include "sim/doctor_measure.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/device/device.h"
#include "core/error.h"
#include "core/units.h"
#include "config/config.h"
#include "models/sgemm_yardstick.h"
#include "offload/file.h"
#include "optim/adam_yardstick.h"
#include "plan/bench_disk.h"

namespace strata::sim {
namespace {

// Sizes that keep the whole measurement to a few seconds while running well outside the caches:
// the Adam pass moves 16M x 28 bytes = 448 MB per repetition, the disk passes 256 MiB each.
constexpr std::size_t kAdamParams = 16'000'000;
constexpr int kAdamReps = 3;
constexpr std::uint64_t kDiskPassBytes = 256 * MiB;
// The GPT-2 124M MLP up-projection for 512 tokens: a shape the sim device's matmul sees in training.
constexpr std::int64_t kGemmM = 512, kGemmN = 3072, kGemmK = 768;
constexpr double kGemmSeconds = 0.3;

std::uint64_t host_memory_bytes() {
  // sysconf's physical pages are the kernel's totalram, what /proc/meminfo calls MemTotal.
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "this machine";
  return name;
}

// The GPUs: the CUDA devices when there are any, else the sim device. Appends to `notes` how.
MachineGpus describe_gpus(const MeasureOptions& o, std::uint64_t host_bytes, std::vector<std::string>* notes) {
  MachineGpus g;
  std::string why;
  const std::vector<CudaDeviceInfo> cuda = list_cuda_devices(&why);
  if (!cuda.empty()) {
    if (o.device_memory_bytes != 0) {
      throw ConfigError("--device-memory sets the sim device's memory, but this machine has CUDA devices, whose "
                        "memory is read from the driver; drop --device-memory");
    }
    g.count = static_cast<int>(cuda.size());
    g.memory_bytes = cuda.front().total_memory_bytes;
    for (const CudaDeviceInfo& d : cuda) g.memory_bytes = std::min<std::uint64_t>(g.memory_bytes, d.total_memory_bytes);
    notes->push_back(fmt::format(
        "gpus: {} CUDA device(s), {} ({} each, the smallest if they differ); bf16_tflops, pcie_h2d_gbps, "
        "pcie_d2h_gbps and link_gbps are not measured by doctor (0: unknown): fill them in from the GPU's "
        "datasheet or a measurement before strata simulate",
        cuda.size(), cuda.front().name, format_bytes(g.memory_bytes)));
    return g;
  }
  g.count = 1;
  g.memory_bytes = o.device_memory_bytes != 0 ? o.device_memory_bytes : std::max<std::uint64_t>(GiB, host_bytes / 4 / GiB * GiB);
  const double gflops = models::measure_sgemm_gflops(kGemmM, kGemmN, kGemmK, kGemmSeconds);
  g.bf16_tflops = gflops / 1e3;
  notes->push_back(fmt::format(
      "gpus: no CUDA device ({}), so the sim device: memory {} ({}), bf16_tflops = this machine's fp32 sgemm "
      "rate through the matmul op ({:.1f} GFLOP/s at m={} n={} k={}), since the sim device computes on the CPU; "
      "pcie 0: copies at memory speed (set pcie_h2d_gbps/pcie_d2h_gbps to strata.device.h2d_gbps/d2h_gbps when "
      "a config models a link)",
      why, format_bytes(g.memory_bytes), o.device_memory_bytes != 0 ? "--device-memory" : "a quarter of host memory",
      gflops, kGemmM, kGemmN, kGemmK));
  return g;
}

MachineHost measure_host(const Topology& topo, std::uint64_t host_bytes, std::vector<std::string>* notes) {
  MachineHost h;
  h.memory_bytes = host_bytes;
  h.cores = topo.physical_cores();
  const optim::AdamRates rates = optim::measure_adam_rates(kAdamParams, kAdamReps);
  h.memory_gbps = rates.memory_gbps;
  h.adam_params_per_s = rates.adam_params_per_s;
  notes->push_back(fmt::format("host: {}, MemTotal; memory_gbps and adam_params_per_s from strata bench adam's "
                               "update run ({} fp32 parameters, all {} threads, best of {})",
                               topo.cpu_model(), kAdamParams, topo.logical_cpus(), kAdamReps));
  return h;
}

MachineDrives measure_drive(const std::string& dir, std::vector<std::string>* notes) {
  MachineDrives d;
  try {
    const DiskPassSeconds s = time_disk_passes(TrainConfig{}, dir, kDiskPassBytes, kDiskPassBytes);
    d.count = 1;
    d.paths = {std::filesystem::absolute(dir).lexically_normal().string()};
    d.read_gbps = static_cast<double>(kDiskPassBytes) / s.read / 1e9;
    d.write_gbps = static_cast<double>(kDiskPassBytes) / s.write / 1e9;
    d.capacity_bytes = offload::free_bytes(dir);  // what swap files could take there now
    if (d.capacity_bytes < kMachineMinMemoryBytes) d.capacity_bytes = 0;  // below what a file may say: unknown
    notes->push_back(fmt::format("drives: the drive of '{}', one sequential O_DIRECT pass of {} each way through "
                                 "Strata's I/O engine (as the benchmarks' disk yardstick); endurance_tbw is not "
                                 "known to doctor (0): set it from the drive's datasheet; capacity is the directory's free space now; "
                                 "more drives: set count and paths",
                                 dir, format_bytes(kDiskPassBytes)));
  } catch (const Error& e) {
    d.count = 0;  // not measurable: described as no drive, with the reason
    notes->push_back(fmt::format("drives: none measured: '{}' could not be timed ({})", dir, e.what()));
  }
  return d;
}

}  // namespace

MachineSpec measure_machine(const MeasureOptions& options, const Topology& topo) {
  if (options.device_memory_bytes != 0 &&
      (options.device_memory_bytes < kMachineMinMemoryBytes || options.device_memory_bytes > kMachineMaxMemoryBytes)) {
    throw ConfigError(fmt::format("--device-memory {} is outside {}..{}, the GPU memory a machine file describes",
                                  format_bytes(options.device_memory_bytes), format_bytes(kMachineMinMemoryBytes),
                                  format_bytes(kMachineMaxMemoryBytes)));
  }
  const std::uint64_t host_bytes = host_memory_bytes();
  std::vector<std::string> notes;
  MachineSpec m;
  m.name = fmt::format("{} ({}), measured by strata doctor --measure", host_name(), topo.cpu_model());
  m.gpus = describe_gpus(options, host_bytes, &notes);
  m.host = measure_host(topo, host_bytes, &notes);
  m.drives = measure_drive(options.dir, &notes);
  m.note = fmt::format("{}", fmt::join(notes, ". "));
  // What was written must read back: the same checks as any machine file.
  return parse_machine(machine_to_json(m), "strata doctor --measure");
}

}  // namespace strata::sim
