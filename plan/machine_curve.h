// A drive's bandwidth as a curve (a machine file's optional `drives.curve`, plan/machine.h): GB/s
// of one drive for reads and for writes, measured over a grid of kernel request sizes x queue
// depths, so that `strata simulate` plans each transfer with the figure of the request size and
// depth it issues rather than one number. `strata bench io --tune --machine-file M.json` writes it.
//
// Note [Drive curves]: `drives.curve` is
//
//   {"request_sizes": [262144, 1048576, 4194304], "queue_depths": [4, 16, 32],
//    "read_gbps":  [[r(256K, 4), r(256K, 16), r(256K, 32)], [...1M...], [...4M...]],
//    "write_gbps": [[...], [...], [...]]}
//
// one row per request size (ascending, whole 4 KiB pages), one column per queue depth (ascending,
// kernel requests in flight at one drive), GB/s (1e9 bytes/s) of one drive. `bench io --tune`
// measures each point with every request at an offset of its own (randread / randwrite rows of
// that block size): a step's keys lie in extents scattered over the swap file, so its requests are
// no sequential stream. Where several drives were measured together (one stream per drive, as the
// swap store stripes), a point is their sum divided by their count. Between grid points the figure
// is interpolated bilinearly in log2(request size) and log2(depth), the axes a drive's bandwidth is
// roughly piecewise linear in; outside the grid it is clamped to the nearest edge (no
// extrapolation: a drive measured up to depth 32 is not assumed faster at 64).
//
// The step simulator reads the curve once per NVMe transfer, at what that transfer really issues
// (sim/drive_model.h): its kernel requests are its keys' (engine/chunk_fields.h), each padded to
// 4 KiB, striped over the swap files (offload/striping.h) and cut at aio.request_size /
// aio.write_request_size (or the engine's defaults); the request size is bytes / requests, and the
// depth one drive sees is min(aio.queue_depth, requests x streams) x ranks / drives, where streams
// is how many such transfers the issuer keeps in flight: a chunk pipeline's jobs, min(slots, jobs)
// (Note [Chunk pipeline] in engine/offload_tier.h), or 1 for a parameter fetch, which is waited for.
// Without a curve, read_gbps
// and write_gbps are used as they are. What the model still leaves out (docs/MEASUREMENTS.md,
// "Replay beside simulate"): the drive's latency tail, which a step's waits (each fetch, each
// pipeline's drain) feel and a steady bench row does not, and reads and writes sharing the drive
// (served in turn, each at its own figure).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config_reader.h"

namespace strata {

enum class DriveOp { Read, Write };

struct DriveCurve {
  std::vector<std::uint64_t> request_bytes;  // ascending
  std::vector<unsigned> queue_depths;        // ascending
  std::vector<std::vector<double>> read_gbps;   // [request size][queue depth], one drive
  std::vector<std::vector<double>> write_gbps;  // same

  bool empty() const { return request_bytes.empty(); }
  // The figure at one request size and depth (Note [Drive curves]). The curve must not be empty.
  double gbps(DriveOp op, std::uint64_t request_bytes, double queue_depth) const;
  // The best point of the grid for `op`.
  double best_gbps(DriveOp op) const;
};

// Reads `drives.curve` through its section's reader (`max_gbps`: the machine file's unit-slip
// bound); one ConfigError naming the field, the problem and the form of a good one.
DriveCurve parse_drive_curve(ConfigReader curve, double max_gbps);
nlohmann::json drive_curve_to_json(const DriveCurve& curve);

}  // namespace strata
