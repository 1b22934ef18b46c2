// Machine files (plan/machine.h): a good file read field by field, every kind of bad field refused
// with one message naming the file, the field and the fix, the JSON round trip, the example files in
// configs/machines/, and the SSD wear arithmetic on numbers worked by hand.
#include "plan/machine.h"

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/units.h"

namespace strata {
namespace {

nlohmann::json good_machine() {
  return nlohmann::json::parse(R"({
    "name": "1x H100, 4 drives",
    "gpus": {"count": 1, "memory": "80GB", "bf16_tflops": 989, "pcie_h2d_gbps": 55, "pcie_d2h_gbps": 50,
             "link_gbps": 0},
    "host": {"memory": 549755813888, "cores": 112, "memory_gbps": 300, "adam_params_per_s": 5e9},
    "drives": {"count": 4, "read_gbps": 7, "write_gbps": 6.5, "endurance_tbw": 7000},
    "note": "figures from datasheets"
  })");
}

TEST(Machine, ReadsEveryField) {
  const MachineSpec m = parse_machine(good_machine(), "m.json");
  EXPECT_EQ(m.name, "1x H100, 4 drives");
  EXPECT_EQ(m.source, "m.json");
  EXPECT_EQ(m.note, "figures from datasheets");
  EXPECT_EQ(m.gpus.count, 1);
  EXPECT_EQ(m.gpus.memory_bytes, 80'000'000'000u);
  EXPECT_EQ(m.gpus.bf16_tflops, 989);
  EXPECT_EQ(m.gpus.pcie_h2d_gbps, 55);
  EXPECT_EQ(m.gpus.pcie_d2h_gbps, 50);
  EXPECT_EQ(m.gpus.link_gbps, 0);
  EXPECT_EQ(m.host.memory_bytes, 512 * GiB);
  EXPECT_EQ(m.host.cores, 112);
  EXPECT_EQ(m.host.memory_gbps, 300);
  EXPECT_EQ(m.host.adam_params_per_s, 5e9);
  EXPECT_EQ(m.drives.count, 4);
  EXPECT_TRUE(m.drives.paths.empty());
  EXPECT_EQ(m.drives.read_gbps, 7);
  EXPECT_EQ(m.drives.write_gbps, 6.5);
  EXPECT_EQ(m.drives.endurance_tbw, 7000);
  EXPECT_EQ(m.drives.capacity_bytes, 0u) << "capacity is optional: unknown";
}

TEST(Machine, RoundTripsThroughJson) {
  nlohmann::json in = good_machine();
  in["drives"]["capacity"] = "3.84TB";
  in["drives"]["paths"] = {"/nvme0", "/nvme1", "/nvme2", "/nvme3"};
  in["host"]["adam_params_per_s"] = 1.2345678901234567e9;  // every digit must survive
  const MachineSpec m = parse_machine(in, "m.json");
  const nlohmann::json out = machine_to_json(m);
  const MachineSpec back = parse_machine(out, "out.json");
  EXPECT_EQ(machine_to_json(back), out);
  EXPECT_EQ(back.drives.paths, m.drives.paths);
  EXPECT_EQ(back.drives.capacity_bytes, 3840000000000u);
  EXPECT_EQ(back.drives.capacity_bytes, m.drives.capacity_bytes);
  EXPECT_EQ(back.host.adam_params_per_s, 1.2345678901234567e9);
  EXPECT_EQ(back.gpus.memory_bytes, 80'000'000'000u);
  EXPECT_EQ(back.note, m.note);
  // Without a note, none is written.
  in.erase("note");
  EXPECT_FALSE(machine_to_json(parse_machine(in, "m.json")).contains("note"));
}

TEST(Machine, ZeroMeansUnknownWhereTheHeaderSaysSo) {
  nlohmann::json j = good_machine();
  j["gpus"]["bf16_tflops"] = 0;
  j["gpus"]["pcie_h2d_gbps"] = 0;
  j["gpus"]["pcie_d2h_gbps"] = 0;
  j["drives"] = {{"count", 0}, {"read_gbps", 0}, {"write_gbps", 0}, {"endurance_tbw", 0}};
  const MachineSpec m = parse_machine(j, "m.json");
  EXPECT_EQ(m.gpus.bf16_tflops, 0);
  EXPECT_EQ(m.drives.count, 0);
}

// One bad field: where it is (a JSON pointer), its value (absent: the field is removed), and what
// the one message must say besides the file's name.
struct BadField {
  const char* what;
  const char* pointer;
  nlohmann::json value;  // kRemove: the field is removed
  std::vector<std::string> says;
};

void PrintTo(const BadField& bad, std::ostream* os) { *os << bad.what; }

const nlohmann::json kRemove(nlohmann::json::value_t::discarded);

class MachineBadField : public ::testing::TestWithParam<BadField> {};

TEST_P(MachineBadField, IsOneClearError) {
  const BadField& bad = GetParam();
  nlohmann::json j = good_machine();
  const nlohmann::json::json_pointer at(bad.pointer);
  if (bad.value.is_discarded()) {
    j[at.parent_pointer()].erase(at.back());
  } else {
    j[at] = bad.value;
  }
  try {
    parse_machine(j, "machines/m.json");
    FAIL() << bad.what << ": accepted";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("machines/m.json: ", 0), 0u) << message;
    for (const std::string& s : bad.says) EXPECT_NE(message.find(s), std::string::npos) << "want '" << s << "' in: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

const BadField kBadFields[] = {
    // Missing.
    {"missing field", "/gpus/bf16_tflops", kRemove, {"gpus.bf16_tflops: missing; give the dense bf16", "989"}},
    {"missing name", "/name", kRemove, {"name: missing; give a name"}},
    {"missing section", "/host", kRemove, {"host: missing; give an object {memory, cores"}},
    {"null field", "/drives/count", nullptr, {"drives.count: missing"}},
    // Mistyped.
    {"count as text", "/gpus/count", "eight", {"gpus.count: expected an integer", "give the number of GPUs"}},
    {"memory as bool", "/host/memory", true, {"host.memory: expected a byte size", "give the host's memory"}},
    {"bits for bytes", "/gpus/memory", "80Gb", {"gpus.memory:", "bits", "give the memory of one GPU"}},
    {"name as number", "/name", 5, {"name: expected a string"}},
    {"empty name", "/name", "", {"name: is empty"}},
    {"rate as text", "/drives/read_gbps", "7 GB/s", {"drives.read_gbps: expected a number", "give the sequential read"}},
    {"auto", "/host/cores", "auto", {"host.cores: \"auto\" is not a figure", "physical CPU cores"}},
    {"section as number", "/gpus", 8, {"gpus: expected an object"}},
    {"paths as number", "/drives/paths", 3, {"drives.paths: expected a string or a list of strings"}},
    // Unknown, with the nearest name.
    {"typo in a field", "/gpus/bf16_tflop", 989, {"gpus.bf16_tflop: unknown key; did you mean 'bf16_tflops'?"}},
    {"typo in a section", "/drive", nlohmann::json::object(), {"drive: unknown key; did you mean 'drives'?"}},
    // Absurd.
    {"negative rate", "/drives/read_gbps", -1, {"drives.read_gbps: -1 is negative; allowed above 0"}},
    {"zero host bandwidth", "/host/memory_gbps", 0, {"host.memory_gbps: 0 leaves nothing to plan with", "e.g. 300"}},
    {"zero adam rate", "/host/adam_params_per_s", 0, {"host.adam_params_per_s: 0 leaves nothing"}},
    {"zero drive write rate", "/drives/write_gbps", 0, {"drives.write_gbps: 0 leaves nothing", "e.g. 6"}},
    {"negative endurance", "/drives/endurance_tbw", -5, {"drives.endurance_tbw: -5 is negative; allowed 0..1000000"}},
    {"drive capacity in TB as a number", "/drives/capacity", 4, {"drives.capacity: 4 B is outside", "\"3.84TB\""}},
    {"GPU memory as GB number", "/gpus/memory", 80, {"gpus.memory: 80 B is outside 1.00 GiB..", "\"80GB\""}},
    {"host memory too large", "/host/memory", "100TiB", {"host.memory: 100.00 TiB is outside", "64.00 TiB"}},
    {"too many GPUs", "/gpus/count", 2048, {"gpus.count: 2048 is out of range; allowed 1..1024"}},
    {"no GPU", "/gpus/count", 0, {"gpus.count: 0 is out of range; allowed 1..1024"}},
    {"no cores", "/host/cores", 0, {"host.cores: 0 is out of range"}},
    {"too many drives", "/drives/count", 1025, {"drives.count: 1025 is out of range; allowed 0..1024"}},
    {"bandwidth in bytes/s", "/gpus/pcie_h2d_gbps", 55e9, {"gpus.pcie_h2d_gbps: 55000000000 is above 10000", "another unit"}},
    {"link too fast", "/gpus/link_gbps", 20000, {"gpus.link_gbps: 20000 is above 10000"}},
    {"FLOP/s for TFLOPS", "/gpus/bf16_tflops", 989e12, {"gpus.bf16_tflops:", "is above 100000"}},
    {"paths for other drives", "/drives/paths", nlohmann::json::array({"/a", "/b"}),
     {"drives.paths: 2 directories for 4 drives; give one directory per drive"}},
    {"empty path", "/drives/paths", nlohmann::json::array({"/a", "", "/c", "/d"}), {"drives.paths: an empty directory"}},
};

INSTANTIATE_TEST_SUITE_P(EveryKind, MachineBadField, ::testing::ValuesIn(kBadFields),
                         [](const ::testing::TestParamInfo<BadField>& info) {
                           std::string name = info.param.what;
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

TEST(Machine, TopLevelMustBeAnObject) {
  EXPECT_THROW(parse_machine(nlohmann::json::array(), "m.json"), ConfigError);
}

class MachineFile : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("strata-machine-test-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(MachineFile, LoadsWithComments) {
  const std::string path = write("m.json", "// an H100\n" + good_machine().dump(2));
  const MachineSpec m = load_machine(path);
  EXPECT_EQ(m.source, path);
  EXPECT_EQ(m.gpus.bf16_tflops, 989);
}

TEST_F(MachineFile, MissingFileSaysHowToGetOne) {
  try {
    load_machine((dir_ / "nope.json").string());
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nope.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("strata doctor --json --measure"), std::string::npos) << e.what();
  }
}

TEST_F(MachineFile, BadJsonGivesLineAndColumn) {
  const std::string path = write("bad.json", "{\n  \"name\": \"x\",\n  \"gpus\": {,}\n}\n");
  try {
    load_machine(path);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json' is not valid JSON at line 3, column 12"), std::string::npos)
        << e.what();
  }
}

TEST_F(MachineFile, FieldErrorsNameTheFile) {
  nlohmann::json j = good_machine();
  j["host"]["cores"] = -1;
  const std::string path = write("m.json", j.dump());
  try {
    load_machine(path);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ": host.cores: ", 0), 0u) << e.what();
  }
}

// Every example in configs/machines/ loads, and says where its figures come from.
TEST(Machine, ExampleFilesLoad) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(STRATA_CONFIGS_DIR "/machines")) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    const MachineSpec m = load_machine(entry.path().string());
    EXPECT_FALSE(m.note.empty());
    EXPECT_GT(m.gpus.bf16_tflops, 0);
    EXPECT_GT(m.drives.count, 0);
    EXPECT_GT(m.drives.endurance_tbw, 0);
    ++files;
  }
  EXPECT_GE(files, 3);
}

// By hand: 50 GB per 10 s step is 8640 steps a day, 4.32e14 bytes = 432 TB a day over all drives;
// 4 drives of 7000 TBW hold 2.8e16 bytes of writes: 2.8e16 / 4.32e14 = 64.81 days.
TEST(SsdWear, DaysToRatedEndurance) {
  const SsdWear w = ssd_wear(50e9, 10.0, 4, 7000);
  EXPECT_EQ(w.bytes_per_step, 50e9);
  EXPECT_DOUBLE_EQ(w.bytes_per_day, 4.32e14);
  EXPECT_DOUBLE_EQ(w.tb_per_day, 432);
  EXPECT_NEAR(w.days_to_rated, 64.8148, 1e-4);
  // Half the drives wear out in half the time.
  EXPECT_NEAR(ssd_wear(50e9, 10.0, 2, 7000).days_to_rated, 32.4074, 1e-4);
}

TEST(SsdWear, UnknownEnduranceOrNoWritesGiveNoDays) {
  EXPECT_EQ(ssd_wear(50e9, 10.0, 4, 0).days_to_rated, 0);
  EXPECT_DOUBLE_EQ(ssd_wear(50e9, 10.0, 4, 0).tb_per_day, 432);
  const SsdWear none = ssd_wear(0, 10.0, 4, 7000);
  EXPECT_EQ(none.bytes_per_day, 0);
  EXPECT_EQ(none.days_to_rated, 0);
  EXPECT_THROW(ssd_wear(1, 0.0, 1, 1), InternalError);
}

}  // namespace
}  // namespace strata
