// Machine files (plan/machine.h): reading and checking them, writing them, and what a write rate
// means for the drives' rated endurance.
//
// The fields are read through ConfigReader, so types, byte strings and unknown keys (with the
// nearest known name) behave as in a training config. What ConfigReader leaves to its callers is
// done here: every field is required, a zero is refused where a rate is needed, and sizes and rates
// past any machine built today are refused as unit slips. Each message ends with what the field is
// and an example, so the one line names the file, the field and the fix.
#include "plan/machine.h"

#include <cmath>
#include <limits>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/file_io.h"
#include "core/units.h"
#include "config/config_reader.h"
#include "config/json_input.h"

namespace strata {
namespace {

// Whether a rate may be 0, which then means what plan/machine.h says for that field.
enum class ZeroRate { Refused, Allowed };

// One object of a machine file (the top level, gpus, host or drives) and its required fields.
class MachineFields {
 public:
  MachineFields(ConfigReader reader, const nlohmann::json& object) : reader_(std::move(reader)), object_(object) {}

  int count(std::string_view key, int min, int max, std::string_view hint) {
    int value = 0;
    read(key, hint, [&] { reader_.get_int(key, &value, min, max); });
    return value;
  }

  double rate(std::string_view key, ZeroRate zero, double max, std::string_view hint) {
    double value = 0;
    read(key, hint, [&] {
      reader_.get_double(key, &value, std::numeric_limits<double>::lowest(), std::numeric_limits<double>::max());
      const std::string allowed = zero == ZeroRate::Allowed ? fmt::format("0..{}", max) : fmt::format("above 0, up to {}", max);
      if (value < 0) reader_.fail(key, fmt::format("{} is negative; allowed {}", value, allowed));
      if (value == 0 && zero == ZeroRate::Refused) reader_.fail(key, fmt::format("0 leaves nothing to plan with; allowed {}", allowed));
      if (value > max) {
        reader_.fail(key, fmt::format("{} is above {}, beyond any machine built today (a figure in another unit?)", value, max));
      }
    });
    return value;
  }

  std::uint64_t bytes(std::string_view key, std::string_view hint) {
    std::uint64_t value = 0;
    read(key, hint, [&] {
      reader_.get_bytes(key, &value);
      if (value < kMachineMinMemoryBytes || value > kMachineMaxMemoryBytes) {
        reader_.fail(key, fmt::format("{} is outside {}..{} (a plain number is bytes: write \"80GB\" for 80 GB)",
                                      format_bytes(value), format_bytes(kMachineMinMemoryBytes),
                                      format_bytes(kMachineMaxMemoryBytes)));
      }
    });
    return value;
  }

  std::string text(std::string_view key, std::string_view hint) {
    std::string value;
    read(key, hint, [&] {
      reader_.get_string(key, &value);
      if (value.empty()) reader_.fail(key, "is empty");
    });
    return value;
  }

  ConfigReader& reader() { return reader_; }

  // A nested object that must be present; `hint` lists its fields.
  MachineFields section(std::string_view key, std::string_view hint) {
    if (!present(key)) reader_.fail(key, fmt::format("missing; give an object {{{}}}", hint));
    return MachineFields(reader_.section(key), object_.at(std::string(key)));
  }

 private:
  bool present(std::string_view key) const {
    const auto it = object_.find(std::string(key));
    return it != object_.end() && !it->is_null();
  }

  // Runs the getter of a required field, adding `hint` (what the field is, an example) to its error.
  template <class Read>
  void read(std::string_view key, std::string_view hint, Read&& get) {
    if (!present(key)) reader_.fail(key, fmt::format("missing; give {}", hint));
    // ConfigReader takes "auto" as "keep the default"; a machine has no defaults.
    const nlohmann::json& value = object_.at(std::string(key));
    if (value.is_string() && value.get<std::string>() == "auto") {
      reader_.fail(key, fmt::format("\"auto\" is not a figure of a machine; give {}", hint));
    }
    try {
      get();
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("{}; give {}", e.what(), hint));
    }
  }

  ConfigReader reader_;
  const nlohmann::json& object_;
};

MachineGpus read_gpus(MachineFields f) {
  MachineGpus g;
  g.count = f.count("count", 1, kMachineMaxCount, "the number of GPUs, e.g. 8");
  g.memory_bytes = f.bytes("memory", "the memory of one GPU, e.g. \"80GB\"");
  g.bf16_tflops = f.rate("bf16_tflops", ZeroRate::Allowed, kMachineMaxTflops,
                         "the dense bf16 tensor-core TFLOPS of one GPU, e.g. 989 for an H100 SXM (0: unknown)");
  g.pcie_h2d_gbps = f.rate("pcie_h2d_gbps", ZeroRate::Allowed, kMachineMaxGbps,
                           "host-to-GPU GB/s of one GPU's link, e.g. 55 for PCIe gen5 x16 (0: copies at memory speed)");
  g.pcie_d2h_gbps = f.rate("pcie_d2h_gbps", ZeroRate::Allowed, kMachineMaxGbps,
                           "GPU-to-host GB/s of one GPU's link, e.g. 55 for PCIe gen5 x16 (0: copies at memory speed)");
  g.link_gbps = f.rate("link_gbps", ZeroRate::Allowed, kMachineMaxGbps,
                       "the GPU-to-GPU GB/s a collective sees per GPU, e.g. 450 for H100 NVLink (0: none)");
  f.reader().finish();
  return g;
}

MachineHost read_host(MachineFields f) {
  MachineHost h;
  h.memory_bytes = f.bytes("memory", "the host's memory, e.g. \"2TB\"");
  h.cores = f.count("cores", 1, kMachineMaxCount, "the host's physical CPU cores, e.g. 112");
  h.memory_gbps = f.rate("memory_gbps", ZeroRate::Refused, kMachineMaxGbps,
                         "the host memory GB/s of an Adam-shaped pass (strata bench adam), e.g. 300");
  h.adam_params_per_s = f.rate("adam_params_per_s", ZeroRate::Refused, kMachineMaxAdamParamsPerS,
                               "the CPU AdamW parameters per second on all cores (strata bench adam), e.g. 5e9");
  f.reader().finish();
  return h;
}

MachineDrives read_drives(MachineFields f) {
  MachineDrives d;
  d.count = f.count("count", 0, kMachineMaxCount, "the number of NVMe drives, e.g. 8 (0: none)");
  // Without drives nothing is read or written, so their rates may be 0.
  const ZeroRate zero = d.count == 0 ? ZeroRate::Allowed : ZeroRate::Refused;
  d.read_gbps = f.rate("read_gbps", zero, kMachineMaxGbps, "the sequential read GB/s of one drive, e.g. 7 for Gen4");
  d.write_gbps = f.rate("write_gbps", zero, kMachineMaxGbps, "the sequential write GB/s of one drive, e.g. 6 for Gen4");
  d.endurance_tbw = f.rate("endurance_tbw", ZeroRate::Allowed, kMachineMaxEnduranceTbw,
                           "the rated terabytes written of one drive, e.g. 7000 (0: unknown)");
  ConfigReader& r = f.reader();
  r.get_bytes("capacity", &d.capacity_bytes);  // optional: absent is unknown (0)
  if (r.has("capacity") && (d.capacity_bytes < kMachineMinMemoryBytes || d.capacity_bytes > kMachineMaxMemoryBytes)) {
    r.fail("capacity", fmt::format("{} is outside {}..{}; give the space the swap files may take on one drive, e.g. "
                                   "\"3.84TB\", or leave capacity out when it is not known",
                                   format_bytes(d.capacity_bytes), format_bytes(kMachineMinMemoryBytes),
                                   format_bytes(kMachineMaxMemoryBytes)));
  }
  r.get_string_list("paths", &d.paths);
  if (!d.paths.empty() && d.paths.size() != static_cast<std::size_t>(d.count)) {
    r.fail("paths", fmt::format("{} directories for {} drives; give one directory per drive, or leave paths out",
                                d.paths.size(), d.count));
  }
  for (const std::string& p : d.paths) {
    if (p.empty()) r.fail("paths", "an empty directory name; give one directory per drive, or leave paths out");
  }
  if (r.has("curve")) {
    if (d.count == 0) r.fail("curve", "a curve with drives.count 0; give count, or leave curve out");
    d.curve = parse_drive_curve(r.section("curve"), kMachineMaxGbps);
  }
  r.finish();
  return d;
}

}  // namespace

MachineSpec parse_machine(const nlohmann::json& root, const std::string& source) {
  MachineFields top(ConfigReader(root, source), root);
  MachineSpec m;
  m.source = source;
  m.name = top.text("name", "a name for the machine, e.g. \"8x H100 80GB node\"");
  top.reader().get_string("note", &m.note);
  m.gpus = read_gpus(top.section("gpus", "count, memory, bf16_tflops, pcie_h2d_gbps, pcie_d2h_gbps, link_gbps"));
  m.host = read_host(top.section("host", "memory, cores, memory_gbps, adam_params_per_s"));
  m.drives = read_drives(
      top.section("drives", "count, read_gbps, write_gbps, endurance_tbw and optionally paths, capacity, curve"));
  top.reader().finish();
  return m;
}

MachineSpec load_machine(const std::string& path) {
  std::string text;
  try {
    text = read_text_file(path, "machine file");
  } catch (const IoError& e) {
    throw ConfigError(fmt::format("{}; pass an existing machine file (strata doctor --json --measure --out M.json "
                                  "writes one for this machine; configs/machines/ has examples)",
                                  e.what()));
  }
  JsonInputError error;
  const std::optional<nlohmann::json> root = parse_json_input(text, JsonComments::Allow, &error);
  if (!root) {
    const std::string place = json_error_place(text, error);
    throw ConfigError(fmt::format("machine file '{}' is not valid JSON{}: {}", path, place.empty() ? "" : " at " + place,
                                  error.message));
  }
  return parse_machine(*root, path);
}

nlohmann::json machine_to_json(const MachineSpec& machine) {
  const MachineGpus& g = machine.gpus;
  const MachineHost& h = machine.host;
  const MachineDrives& d = machine.drives;
  nlohmann::json j = {
      {"name", machine.name},
      {"gpus",
       {{"count", g.count},
        {"memory", g.memory_bytes},
        {"bf16_tflops", g.bf16_tflops},
        {"pcie_h2d_gbps", g.pcie_h2d_gbps},
        {"pcie_d2h_gbps", g.pcie_d2h_gbps},
        {"link_gbps", g.link_gbps}}},
      {"host",
       {{"memory", h.memory_bytes},
        {"cores", h.cores},
        {"memory_gbps", h.memory_gbps},
        {"adam_params_per_s", h.adam_params_per_s}}},
      {"drives",
       {{"count", d.count},
        {"paths", d.paths},
        {"read_gbps", d.read_gbps},
        {"write_gbps", d.write_gbps},
        {"endurance_tbw", d.endurance_tbw}}},
  };
  if (d.capacity_bytes > 0) j["drives"]["capacity"] = d.capacity_bytes;
  if (!d.curve.empty()) j["drives"]["curve"] = drive_curve_to_json(d.curve);
  if (!machine.note.empty()) j["note"] = machine.note;
  return j;
}

double MachineDrives::gbps(DriveOp op, std::uint64_t request_bytes, double queue_depth) const {
  if (!curve.empty()) return curve.gbps(op, request_bytes, queue_depth);
  return op == DriveOp::Read ? read_gbps : write_gbps;
}

SsdWear ssd_wear(double bytes_per_step, double step_seconds, int drives, double endurance_tbw_per_drive) {
  STRATA_CHECK(bytes_per_step >= 0 && step_seconds > 0 && drives >= 0 && endurance_tbw_per_drive >= 0,
               "ssd_wear({}, {}, {}, {}): needs bytes >= 0, a step time > 0, drives >= 0, endurance >= 0",
               bytes_per_step, step_seconds, drives, endurance_tbw_per_drive);
  constexpr double kSecondsPerDay = 86'400;
  SsdWear w;
  w.bytes_per_step = bytes_per_step;
  w.bytes_per_day = bytes_per_step * (kSecondsPerDay / step_seconds);
  w.tb_per_day = w.bytes_per_day / 1e12;
  // The swap files are striped over the drives, so each drive takes 1/drives of the writes.
  const double rated_bytes = endurance_tbw_per_drive * 1e12 * drives;
  if (rated_bytes > 0 && w.bytes_per_day > 0) w.days_to_rated = rated_bytes / w.bytes_per_day;
  return w;
}

}  // namespace strata
