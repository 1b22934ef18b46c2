// The step simulator's drives (sim/drive_model.h).
#include "sim/drive_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "offload/striping.h"
#include "offload/swap_store.h"
#include "sim/step_sim_timeline.h"

namespace strata::sim {

double DriveModel::key_requests(DriveOp op, std::uint64_t bytes) const {
  if (bytes == 0) return 0;
  const std::uint64_t limit = op == DriveOp::Read ? limits.read_bytes : limits.write_bytes;
  const std::vector<std::uint64_t> free(std::max<std::size_t>(swap_files, 1), 1);  // equal: equal shares
  double requests = 0;
  for (std::uint64_t part : offload::plan_stripes(offload::SwapStore::padded(bytes), free, stripe_min_bytes)) {
    requests += static_cast<double>((part + limit - 1) / limit);
  }
  return requests;
}

double DriveModel::seconds(DriveOp op, double bytes, double requests, double streams) const {
  if (bytes <= 0) return 0;
  STRATA_CHECK(set() && requests >= 1 && streams >= 1,
               "DriveModel::seconds: {} bytes in {} requests, {} streams, {} drives", bytes, requests, streams,
               drives.count);
  const auto request = static_cast<std::uint64_t>(std::max(1.0, std::round(bytes / requests)));
  const double in_flight = std::min(static_cast<double>(queue_depth), requests * streams);
  const double depth = std::max(1.0, in_flight * ranks / drives.count);
  const double share = 1.0 / ranks;
  return transfer_seconds(bytes, drives.count * drives.gbps(op, request, depth) * 1e9 * share);
}

DriveModel drive_model(const MachineDrives& drives, int ranks, const RunPlan& plan) {
  DriveModel m;
  m.drives = drives;
  m.ranks = std::max(ranks, 1);
  m.queue_depth = std::max(plan.offload.io.queue_depth, 1u);
  m.limits = offload::request_limits(plan.offload.io);
  m.swap_files = std::max<std::size_t>(plan.offload.nvme_dirs.size(), 1);
  m.stripe_min_bytes = offload::SwapStoreOptions{}.stripe_min_bytes;
  return m;
}

}  // namespace strata::sim
