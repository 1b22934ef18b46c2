// A machine described by numbers: what `strata estimate` and `strata simulate` plan against, for
// machines Strata runs on and machines it does not (8x H100 nodes, a 4090 workstation). A machine
// file is JSON; `strata doctor --json --measure` writes one for the machine it runs on.
//
//   {
//     "name": "1x H100 80GB, 4 Gen4 drives",
//     "gpus":   {"count": 1, "memory": "80GB", "bf16_tflops": 989, "pcie_h2d_gbps": 55, "pcie_d2h_gbps": 55,
//                "link_gbps": 0},
//     "host":   {"memory": "2TB", "cores": 112, "memory_gbps": 300, "adam_params_per_s": 5e9},
//     "drives": {"count": 4, "read_gbps": 7, "write_gbps": 6, "endurance_tbw": 7000, "paths": [],
//                "curve": {...}},
//     "note": "where the figures come from"
//   }
//
// Sizes take the config's byte strings ("80GB", "512MiB") or plain numbers of bytes. Bandwidths are
// 1e9 bytes/s; `link_gbps` is the GPU-to-GPU bandwidth a collective sees per GPU (NVLink; 0 with one
// GPU). `endurance_tbw` is the drive's rated terabytes written (1e12 bytes), per drive.
//
// Every field is required except `drives.paths`, `drives.capacity`, `drives.curve` (the drive's
// GB/s by request size and queue depth, see Note [Drive curves] in plan/machine_curve.h) and `note`
// (free text: the sources of the figures).
// A zero means "not known" where a machine can honestly not know it, and is refused elsewhere:
// `gpus.bf16_tflops` 0 is unknown (doctor cannot time a GPU's tensor cores; a simulation needs it
// filled in), `gpus.pcie_*_gbps` 0 is no modeled link (copies at host memory speed, as on the sim
// device without strata.device.h2d_gbps; doctor also writes 0 for a CUDA device's link, which it
// does not time, and says so in the note), `gpus.link_gbps` 0 is no GPU-to-GPU link, and
// `drives.endurance_tbw` 0 is unknown; the drives' rates may be 0 only with `drives.count` 0. Limits
// well past any machine built today (kMachine* below) catch unit slips such as a size in GB given
// as a plain number or a rate in bytes/s.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/machine_curve.h"

namespace strata {

inline constexpr std::uint64_t kMachineMinMemoryBytes = std::uint64_t{1} << 30;  // 1 GiB, host and per GPU
inline constexpr std::uint64_t kMachineMaxMemoryBytes = std::uint64_t{64} << 40;  // 64 TiB
inline constexpr int kMachineMaxCount = 1024;                // GPUs, cores, drives
inline constexpr double kMachineMaxGbps = 10'000;            // any bandwidth, GB/s
inline constexpr double kMachineMaxTflops = 100'000;         // per GPU
inline constexpr double kMachineMaxAdamParamsPerS = 1e12;    // CPU AdamW, all cores
inline constexpr double kMachineMaxEnduranceTbw = 1e6;       // per drive

struct MachineGpus {
  int count = 1;
  std::uint64_t memory_bytes = 0;  // per GPU
  double bf16_tflops = 0;          // dense bf16 tensor-core rate per GPU, 1e12 FLOP/s
  double pcie_h2d_gbps = 0;        // per GPU, host -> device
  double pcie_d2h_gbps = 0;        // per GPU, device -> host
  double link_gbps = 0;            // GPU <-> GPU per GPU (collectives); 0: none
};

struct MachineHost {
  std::uint64_t memory_bytes = 0;
  int cores = 1;
  double memory_gbps = 0;        // host memory bandwidth (an Adam-shaped pass)
  double adam_params_per_s = 0;  // CPU AdamW update rate, all cores
};

struct MachineDrives {
  int count = 0;
  std::vector<std::string> paths;  // optional: the directories (one per drive) when known
  double read_gbps = 0;            // per drive
  double write_gbps = 0;           // per drive
  double endurance_tbw = 0;        // per drive, 1e12 bytes; 0: unknown
  std::uint64_t capacity_bytes = 0;  // optional `capacity`: space the swap files may take per drive; 0: unknown
  DriveCurve curve;                  // optional: empty when the file has none (read_gbps/write_gbps apply)

  // One drive's GB/s for `op` at a request size and queue depth: the curve's figure when there is
  // one, else read_gbps or write_gbps.
  double gbps(DriveOp op, std::uint64_t request_bytes, double queue_depth) const;
};

struct MachineSpec {
  std::string name;
  std::string source;  // the file it came from, for messages
  std::string note;    // free text, optional: where the figures come from
  MachineGpus gpus;
  MachineHost host;
  MachineDrives drives;
};

// Parses and checks a machine description. `source` names it in messages. Throws ConfigError
// naming the source, the field's path and the fix for a missing, mistyped or absurd field.
MachineSpec parse_machine(const nlohmann::json& root, const std::string& source);
// Reads a machine file (clear errors for a missing file or bad JSON, with line and column).
MachineSpec load_machine(const std::string& path);
nlohmann::json machine_to_json(const MachineSpec& machine);

// What writing `bytes_per_step` to NVMe at `step_seconds` per step means for the drives: bytes per
// day and, with a rated endurance, days until the drives reach it (writes spread over `drives`).
struct SsdWear {
  double bytes_per_step = 0;
  double bytes_per_day = 0;    // all drives together
  double tb_per_day = 0;       // 1e12 bytes
  double days_to_rated = 0;    // 0 when the endurance is unknown or nothing is written
};
SsdWear ssd_wear(double bytes_per_step, double step_seconds, int drives, double endurance_tbw_per_drive);

}  // namespace strata
