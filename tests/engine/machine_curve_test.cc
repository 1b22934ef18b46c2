// Drive curves of machine files (plan/machine_curve.h, Note [Drive curves] in plan/machine_curve.h): read and written
// with the machine file, interpolated in log2 of size and depth on figures worked by hand, clamped at
// the grid's edges, and every kind of bad curve refused naming the field.
#include "plan/machine_curve.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "plan/machine.h"

namespace strata {
namespace {

nlohmann::json machine_with_curve(const nlohmann::json& curve) {
  nlohmann::json m = nlohmann::json::parse(R"({
    "name": "one drive",
    "gpus": {"count": 1, "memory": "80GB", "bf16_tflops": 989, "pcie_h2d_gbps": 55, "pcie_d2h_gbps": 50,
             "link_gbps": 0},
    "host": {"memory": "512GB", "cores": 112, "memory_gbps": 300, "adam_params_per_s": 5e9},
    "drives": {"count": 2, "read_gbps": 7, "write_gbps": 6.5, "endurance_tbw": 7000}
  })");
  m["drives"]["curve"] = curve;
  return m;
}

// 256 KiB and 1 MiB (two octaves apart), depths 4 and 16 (two octaves apart).
nlohmann::json good_curve() {
  return nlohmann::json::parse(R"({"request_sizes": [262144, "1MiB"], "queue_depths": [4, 16],
    "read_gbps": [[1, 2], [3, 5]], "write_gbps": [[0.5, 1], [1.5, 2.5]]})");
}

TEST(DriveCurve, ReadsAndWritesBackWithTheMachineFile) {
  const MachineSpec m = parse_machine(machine_with_curve(good_curve()), "m.json");
  ASSERT_FALSE(m.drives.curve.empty());
  EXPECT_EQ(m.drives.curve.request_bytes, (std::vector<std::uint64_t>{262144, 1048576}));
  EXPECT_EQ(m.drives.curve.queue_depths, (std::vector<unsigned>{4, 16}));
  EXPECT_EQ(m.drives.curve.write_gbps[1][1], 2.5);
  const nlohmann::json back = machine_to_json(m);
  EXPECT_EQ(machine_to_json(parse_machine(back, "back.json")), back);
  EXPECT_EQ(back["drives"]["curve"]["request_sizes"], (nlohmann::json{262144, 1048576}));
  // A file without a curve writes none.
  nlohmann::json plain = machine_with_curve(nullptr);
  plain["drives"].erase("curve");
  EXPECT_FALSE(machine_to_json(parse_machine(plain, "p.json"))["drives"].contains("curve"));
}

TEST(DriveCurve, InterpolatesInLogOfSizeAndDepth) {
  const MachineDrives d = parse_machine(machine_with_curve(good_curve()), "m.json").drives;
  EXPECT_DOUBLE_EQ(d.gbps(DriveOp::Read, 262144, 4), 1);  // grid points as they are
  EXPECT_DOUBLE_EQ(d.gbps(DriveOp::Read, 1 << 20, 16), 5);
  EXPECT_DOUBLE_EQ(d.gbps(DriveOp::Write, 1 << 20, 4), 1.5);
  // 512 KiB is halfway between in log2, depth 8 halfway between 4 and 16.
  EXPECT_DOUBLE_EQ(d.gbps(DriveOp::Read, 512 << 10, 4), 2);
  EXPECT_DOUBLE_EQ(d.gbps(DriveOp::Read, 262144, 8), 1.5);
  EXPECT_DOUBLE_EQ(d.gbps(DriveOp::Read, 512 << 10, 8), (1.5 + 4) / 2);
  // Outside the grid: the nearest edge, never extrapolated.
  EXPECT_DOUBLE_EQ(d.gbps(DriveOp::Read, 4096, 1), 1);
  EXPECT_DOUBLE_EQ(d.gbps(DriveOp::Read, 64 << 20, 1024), 5);
  EXPECT_DOUBLE_EQ(d.gbps(DriveOp::Write, 64 << 20, 2), 1.5);
  EXPECT_DOUBLE_EQ(d.curve.best_gbps(DriveOp::Write), 2.5);
}

TEST(DriveCurve, OnePointIsOneNumberAndNoCurveIsTheFlatFigures) {
  const MachineDrives one = parse_machine(machine_with_curve(nlohmann::json::parse(R"({"request_sizes": [1048576],
    "queue_depths": [32], "read_gbps": [[3]], "write_gbps": [[2]]})")), "m.json").drives;
  EXPECT_DOUBLE_EQ(one.gbps(DriveOp::Read, 4096, 1), 3);
  EXPECT_DOUBLE_EQ(one.gbps(DriveOp::Write, 8 << 20, 64), 2);
  nlohmann::json plain = machine_with_curve(nullptr);
  plain["drives"].erase("curve");
  const MachineDrives flat = parse_machine(plain, "p.json").drives;
  EXPECT_DOUBLE_EQ(flat.gbps(DriveOp::Read, 4096, 1), 7);
  EXPECT_DOUBLE_EQ(flat.gbps(DriveOp::Write, 4096, 1), 6.5);
}

void expect_refused(const nlohmann::json& curve, const std::string& want) {
  try {
    parse_machine(machine_with_curve(curve), "m.json");
    ADD_FAILURE() << "accepted " << curve.dump();
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("m.json"), std::string::npos) << what;
    EXPECT_NE(what.find(want), std::string::npos) << what;
  }
}

TEST(DriveCurve, BadCurvesAreRefusedNamingTheField) {
  nlohmann::json c = good_curve();
  c["request_sizes"] = {1048576, 262144};
  expect_refused(c, "drives.curve.request_sizes");
  c = good_curve();
  c["request_sizes"] = {5000, 1048576};
  expect_refused(c, "multiple of 4 KiB");
  c = good_curve();
  c["queue_depths"] = {0, 16};
  expect_refused(c, "drives.curve.queue_depths");
  c = good_curve();
  c["read_gbps"] = {{1, 2}};
  expect_refused(c, "must hold 2 rows");
  c = good_curve();
  c["write_gbps"][0][1] = 0;
  expect_refused(c, "drives.curve.write_gbps");
  c = good_curve();
  c["read_gbps"][1][0] = 3e9;
  expect_refused(c, "another unit");
  c = good_curve();
  c.erase("write_gbps");
  expect_refused(c, "drives.curve.write_gbps");
  c = good_curve();
  c["jobs"] = 2;
  expect_refused(c, "jobs");
  nlohmann::json none = machine_with_curve(good_curve());
  none["drives"]["count"] = 0;
  EXPECT_THROW(parse_machine(none, "m.json"), ConfigError);
}

}  // namespace
}  // namespace strata
