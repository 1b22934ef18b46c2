// The step simulator's drives (Note [Step simulator] in sim/step_sim.h): how many kernel requests
// one of the step's NVMe transfers becomes, and how long the machine's drives take for it at the
// request size and queue depth it really has (Note [Drive curves] in plan/machine_curve.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "offload/io_engine.h"
#include "plan/machine.h"
#include "plan/run_plan.h"

namespace strata::sim {

struct DriveModel {
  MachineDrives drives;          // the machine's; count 0: no model (the flat rates apply)
  int ranks = 1;                 // ranks of the node sharing the drives, each running the same step
  unsigned queue_depth = 32;     // one rank's aio.queue_depth (its engine's requests in flight)
  offload::RequestLimits limits{offload::kDefaultMaxReadRequestBytes, offload::kDefaultMaxWriteRequestBytes};
  std::size_t swap_files = 1;    // the plan's nvme directories: the swap store stripes over them
  std::uint64_t stripe_min_bytes = 1024 * 1024;  // per file (offload::SwapStoreOptions)

  bool set() const { return drives.count > 0; }

  // The kernel requests the swap store and engine turn one key of `bytes` into: padded to 4 KiB,
  // striped over the swap files as offload::plan_stripes does, each stripe cut at the engine's
  // largest request for `op`.
  double key_requests(DriveOp op, std::uint64_t bytes) const;

  // Seconds the drives take for `bytes` of `op` in `requests` kernel requests, while the issuer
  // keeps `streams` such transfers in flight at once (a chunk pipeline's jobs in flight; 1 for a
  // transfer that is waited for): the curve read at the mean request, bytes / requests in whole
  // bytes, and at the depth one drive sees, min(queue_depth, requests x streams) x ranks / drives
  // (at least 1). Without a curve, the drives' read_gbps / write_gbps, whatever the requests.
  double seconds(DriveOp op, double bytes, double requests, double streams) const;
};

// The model for `plan` on the machine's `drives`, shared by `ranks` ranks.
DriveModel drive_model(const MachineDrives& drives, int ranks, const RunPlan& plan);

}  // namespace strata::sim
