// The step simulator's drives (sim/drive_model.h, Note [Drive curves] in plan/machine_curve.h): a
// key's kernel requests, the curve read at a transfer's mean request and the depth its issuer
// keeps, and a chunk pipeline's NVMe operations timed by it. Hand-worked figures; no timings.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sim/drive_model.h"
#include "sim/step_sim_timeline.h"

namespace strata::sim {
namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * 1024;

// Sizes 256 KiB and 1 MiB (two octaves apart), depths 1 and 16 (four octaves apart); reads
// and writes apart so that a mix-up shows.
DriveModel model(int drives) {
  DriveModel m;
  m.drives.count = drives;
  m.drives.read_gbps = m.drives.write_gbps = 100;  // not used: the curve is
  m.drives.curve = DriveCurve{{256 * kKiB, kMiB}, {1, 16}, {{1, 2}, {3, 4}}, {{0.5, 1}, {1.5, 2}}};
  m.queue_depth = 32;
  m.limits = {4 * kMiB, kMiB};
  m.swap_files = 1;
  return m;
}

TEST(DriveModel, AKeyIsPaddedStripedAndCutAtTheEnginesLimits) {
  DriveModel m = model(1);
  EXPECT_EQ(m.key_requests(DriveOp::Read, 0), 0);
  EXPECT_EQ(m.key_requests(DriveOp::Read, 1), 1);                  // one 4 KiB page
  EXPECT_EQ(m.key_requests(DriveOp::Read, 4 * kMiB), 1);
  EXPECT_EQ(m.key_requests(DriveOp::Read, 4 * kMiB + 1), 2);       // padded past the limit
  EXPECT_EQ(m.key_requests(DriveOp::Write, 3 * kMiB + 5), 4);     // writes cut at 1 MiB
  m.swap_files = 2;  // below 2 x 1 MiB a key stays whole in one file
  EXPECT_EQ(m.key_requests(DriveOp::Write, 1536 * kKiB), 2);
  // 6 MiB: 3 MiB in each file, each cut into three 1 MiB writes and one read.
  EXPECT_EQ(m.key_requests(DriveOp::Write, 6 * kMiB), 6);
  EXPECT_EQ(m.key_requests(DriveOp::Read, 6 * kMiB), 2);
}

TEST(DriveModel, TheCurveIsReadAtTheMeanRequestAndTheDepthInFlight) {
  const DriveModel m = model(2);
  const double bytes = 8.0 * kMiB;
  // 32 requests of 256 KiB, 1 stream: min(32, 32) in flight over 2 drives is depth 16.
  EXPECT_DOUBLE_EQ(m.seconds(DriveOp::Read, bytes, 32, 1), bytes / (2 * 2 * 1e9));
  // 8 requests of 1 MiB, 4 streams: 32 in flight, depth 16; writes read their own grid.
  EXPECT_DOUBLE_EQ(m.seconds(DriveOp::Read, bytes, 8, 4), bytes / (2 * 4 * 1e9));
  EXPECT_DOUBLE_EQ(m.seconds(DriveOp::Write, bytes, 8, 4), bytes / (2 * 2 * 1e9));
  // 2 requests of 4 MiB (past the grid: its 1 MiB edge), 1 stream: depth 2 / 2 drives = 1.
  EXPECT_DOUBLE_EQ(m.seconds(DriveOp::Read, bytes, 2, 1), bytes / (2 * 3 * 1e9));
  // 8 requests of 512 KiB (halfway in log2), 1 stream: depth 8 / 2 = 4 (halfway in log2).
  EXPECT_DOUBLE_EQ(m.seconds(DriveOp::Read, bytes / 2, 8, 1), bytes / 2 / (2 * 2.5 * 1e9));
  // The engine's queue depth bounds what is in flight: 64 x 4 is 32, depth 16.
  EXPECT_DOUBLE_EQ(m.seconds(DriveOp::Read, bytes, 32, 4), m.seconds(DriveOp::Read, bytes, 32, 1));
  // A depth below one request per drive is one.
  EXPECT_DOUBLE_EQ(m.seconds(DriveOp::Read, 256.0 * kKiB, 1, 1), 256.0 * kKiB / (2 * 1 * 1e9));
}

TEST(DriveModel, RanksShareTheDrivesAndDeepenTheirQueues) {
  DriveModel m = model(2);
  m.ranks = 2;
  const double bytes = 4.0 * kMiB;
  // 16 requests of 256 KiB from each of 2 ranks over 2 drives: depth 16, half the bandwidth each.
  EXPECT_DOUBLE_EQ(m.seconds(DriveOp::Read, bytes, 16, 1), bytes / (2 * 2 * 1e9 / 2));
}

TEST(DriveModel, WithoutACurveEveryRequestIsTheFlatFigure) {
  DriveModel m = model(2);
  m.drives.curve = DriveCurve{};
  m.drives.read_gbps = 3;
  m.drives.write_gbps = 1.5;
  m.ranks = 3;
  const double bytes = 6.0 * kMiB;
  for (double requests : {1.0, 6.0, 24.0}) {
    EXPECT_DOUBLE_EQ(m.seconds(DriveOp::Read, bytes, requests, 4), bytes / (2 * 3 * 1e9 * (1.0 / 3)));
    EXPECT_DOUBLE_EQ(m.seconds(DriveOp::Write, bytes, requests, 1), bytes / (2 * 1.5 * 1e9 * (1.0 / 3)));
  }
}

// A pipeline's reads and writes are timed at their jobs' requests, with min(slots, jobs) jobs in
// flight as the streams.
TEST(DriveModel, APipelinesTransfersKeepItsJobsInFlight) {
  PipelineRates rates{0, 0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(), model(1)};
  const auto job = [](std::string name) {
    PipelineJob j;
    j.name = std::move(name);
    j.nvme_read_bytes = 2 * kMiB;
    j.nvme_read_requests = 8;  // 256 KiB each
    j.nvme_write_bytes = kMiB;
    j.nvme_write_requests = 1;
    return j;
  };
  for (std::size_t slots : {1, 2, 4}) {
    Timeline t;
    const std::vector<PipelineJob> jobs{job("a"), job("b")};
    simulate_pipeline(t, SimLane::Worker, 0, jobs, slots, rates);
    const double streams = static_cast<double>(std::min<std::size_t>(slots, jobs.size()));
    for (const SimOp& op : t.ops()) {
      if (op.queue != SimQueue::Nvme) continue;
      const bool read = op.name.rfind("nvme read", 0) == 0;
      // Reads: 8 x streams in flight on one drive; writes: 1 x streams.
      const double depth = (read ? 8 : 1) * streams;
      const double gbps = read ? 1 + (2 - 1) * std::log2(depth) / 4 : 1.5 + (2 - 1.5) * std::log2(depth) / 4;
      EXPECT_DOUBLE_EQ(op.end - op.begin, static_cast<double>(op.bytes) / (gbps * 1e9))
          << op.name << " with " << slots << " slots";
    }
  }
}

}  // namespace
}  // namespace strata::sim
