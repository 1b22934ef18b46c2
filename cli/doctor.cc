// `strata doctor [--dir D] [--need BYTES] [--json]`: what this machine offers an offload run, and
// what is broken. Checks, in order: devices (sim always, CUDA when a driver and GPU are present),
// CPU cores and NUMA nodes (hwloc), SIMD level, io_uring (availability, kernel features, the
// io_uring_disabled sysctl), O_DIRECT on --dir (a real aligned write+read round trip), free space of
// --dir, RLIMIT_MEMLOCK. Each check is OK, WARN (an offload run works, but slower or with a fallback)
// or FAIL (an offload run into --dir would fail); the exit code is 1 when any check FAILs, and the
// reason is printed on the failing line with the fix.
//
// --measure then describes this machine as a machine file (sim/doctor_measure.h): printed as the
// "machine" member of --json's object (or as the file's text without --json), and written to --out
// for `strata estimate` and `strata simulate --machine`.
#include <fcntl.h>
#include <liburing.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cpu_features.h"
#include "core/device/device.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/host_buffer.h"
#include "core/topology.h"
#include "core/units.h"
#include "plan/machine.h"
#include "offload/io_engine.h"
#include "cli/commands.h"
#include "sim/doctor_measure.h"
#include "train/output_file.h"

namespace strata::cli {
namespace {

enum class Verdict { Ok, Warn, Fail };

struct Check {
  std::string name;
  Verdict verdict = Verdict::Ok;
  std::string detail;
};

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::Ok: return "ok";
    case Verdict::Warn: return "warn";
    case Verdict::Fail: return "FAIL";
  }
  return "?";
}

Check check_devices() {
  Check c{"devices", Verdict::Ok, ""};
  SimDeviceOptions sim_options;
  sim_options.capacity_bytes = 64 * MiB;
  auto sim = make_sim_device(sim_options);
  c.detail = fmt::format("{} (always available; capacity set by strata.device.memory)", sim->name());
  std::string why;
  const auto cuda = list_cuda_devices(&why);
  if (cuda.empty()) {
    c.detail += fmt::format("; no CUDA device: {}", why);
  }
  for (const auto& d : cuda) {
    c.detail += fmt::format("; cuda:{} {} ({}, sm_{}{})", d.ordinal, d.name, format_bytes(d.total_memory_bytes),
                            d.compute_capability_major, d.compute_capability_minor);
  }
  return c;
}

Check check_cpu(const Topology& topo) {
  Check c{"cpu", Verdict::Ok, ""};
  c.detail = fmt::format("{}: {} cores, {} logical CPUs, {} NUMA node(s)", topo.cpu_model(), topo.physical_cores(),
                         topo.logical_cpus(), topo.numa_nodes().size());
  for (const auto& n : topo.numa_nodes()) {
    c.detail += fmt::format("; node {} {}", n.os_index, format_bytes(n.memory_bytes));
  }
  return c;
}

Check check_simd() {
  const SimdLevel level = simd_level();
  Check c{"simd", Verdict::Ok, fmt::format("{} kernels", simd_level_name(level))};
  if (level == SimdLevel::Scalar) {
    c.verdict = Verdict::Warn;
    c.detail += " (no AVX2: CPU Adam and conversions run scalar, several times slower)";
  }
  return c;
}

Check check_io_uring() {
  Check c{"io_uring", Verdict::Ok, ""};
  std::ifstream sysctl("/proc/sys/kernel/io_uring_disabled");
  int disabled = 0;
  if (sysctl >> disabled && disabled != 0) {
    c.verdict = Verdict::Warn;
    c.detail = fmt::format("disabled by kernel.io_uring_disabled={}; the NVMe tier falls back to a pread/pwrite "
                           "thread pool (slower); fix: sysctl kernel.io_uring_disabled=0",
                           disabled);
    return c;
  }
  io_uring ring;
  io_uring_params params;
  std::memset(&params, 0, sizeof params);
  const int rc = io_uring_queue_init_params(8, &ring, &params);
  if (rc < 0) {
    c.verdict = Verdict::Warn;
    c.detail = fmt::format("io_uring_queue_init failed: {}; the NVMe tier falls back to a pread/pwrite thread pool "
                           "(slower); fix: allow io_uring (seccomp profile, container runtime, kernel >= 5.10)",
                           errno_text(-rc));
    return c;
  }
  std::vector<std::string> features;
  const auto has = [&](unsigned flag, const char* name) {
    if (params.features & flag) features.emplace_back(name);
  };
  has(IORING_FEAT_SINGLE_MMAP, "single_mmap");
  has(IORING_FEAT_NODROP, "nodrop");
  has(IORING_FEAT_SUBMIT_STABLE, "submit_stable");
  has(IORING_FEAT_FAST_POLL, "fast_poll");
  has(IORING_FEAT_SQPOLL_NONFIXED, "sqpoll_nonfixed");
  has(IORING_FEAT_EXT_ARG, "ext_arg");
  has(IORING_FEAT_NATIVE_WORKERS, "native_workers");
  has(IORING_FEAT_RSRC_TAGS, "rsrc_tags");
  std::string ops;
  if (io_uring_probe* probe = io_uring_get_probe_ring(&ring)) {
    const bool rw = io_uring_opcode_supported(probe, IORING_OP_READ) && io_uring_opcode_supported(probe, IORING_OP_WRITE);
    const bool fixed = io_uring_opcode_supported(probe, IORING_OP_READ_FIXED);
    ops = fmt::format("; read/write {}, read_fixed {}", rw ? "yes" : "no", fixed ? "yes" : "no");
    io_uring_free_probe(probe);
  }
  io_uring_queue_exit(&ring);
  std::string joined;
  for (const auto& f : features) joined += (joined.empty() ? "" : ",") + f;
  c.detail = fmt::format("available; features {}{}", joined.empty() ? "none" : joined, ops);
  return c;
}

// O_DIRECT round trip: write one aligned 4 KiB block, read it back, compare, unlink.
Check check_o_direct(const std::string& dir) {
  Check c{"o_direct", Verdict::Ok, ""};
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    c.verdict = Verdict::Fail;
    c.detail = fmt::format("'{}' is not an existing directory; fix: create it or pass --dir with the directory that "
                           "will hold the swap files",
                           dir);
    return c;
  }
  std::string path = dir + "/.strata-doctor-XXXXXX";
  std::vector<char> name(path.begin(), path.end());
  name.push_back('\0');
  const int tmp_fd = mkstemp(name.data());
  if (tmp_fd < 0) {
    c.verdict = Verdict::Fail;
    c.detail = fmt::format("cannot create a file in '{}': {}; fix: make it writable or choose another --dir", dir,
                           errno_text(errno));
    return c;
  }
  close(tmp_fd);  // only the unique name is needed: the file is reopened with O_DIRECT
  path.assign(name.data());
  UniqueFd fd(open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    unlink(path.c_str());
    c.verdict = Verdict::Fail;
    c.detail = fmt::format("the filesystem of '{}' refuses O_DIRECT ({}); fix: put swap files on a local ext4/xfs "
                           "NVMe filesystem (tmpfs and some overlay filesystems do not support O_DIRECT)",
                           dir, errno_text(err));
    return c;
  }
  HostBuffer out = HostBuffer::allocate(4096);
  HostBuffer in = HostBuffer::allocate(4096);
  for (std::size_t i = 0; i < 4096; ++i) out.as<unsigned char>()[i] = static_cast<unsigned char>(i * 7 + 3);
  std::string write_failure, read_failure;
  try {
    write_exact(fd.get(), out.data(), 4096, 0, path);
  } catch (const Error& e) {
    write_failure = e.what();
  }
  if (write_failure.empty()) {
    try {
      read_exact(fd.get(), in.data(), 4096, 0, path);
      if (std::memcmp(out.data(), in.data(), 4096) != 0) read_failure = "data differs from what was written";
    } catch (const Error& e) {
      read_failure = e.what();
    }
  }
  fd.reset();
  unlink(path.c_str());
  if (!write_failure.empty()) {
    c.verdict = Verdict::Fail;
    c.detail = fmt::format("O_DIRECT write of 4 KiB into '{}' failed: {}", dir, write_failure);
  } else if (!read_failure.empty()) {
    c.verdict = Verdict::Fail;
    c.detail = fmt::format("O_DIRECT read back from '{}' failed: {}", dir, read_failure);
  } else {
    const std::optional<std::size_t> disk_max = offload::disk_max_request_bytes(dir);
    c.detail = fmt::format("'{}' supports O_DIRECT (4 KiB aligned write and read back verified); its disk takes "
                           "requests of up to {} unsplit (max_sectors_kb), Strata's I/O engine issues reads of up "
                           "to {} and writes of up to {}",
                           dir, disk_max ? format_bytes(*disk_max) : std::string("? (sysfs does not say)"),
                           format_bytes(offload::kDefaultMaxReadRequestBytes),
                           format_bytes(offload::kDefaultMaxWriteRequestBytes));
  }
  return c;
}

Check check_free_space(const std::string& dir, std::size_t need_bytes) {
  Check c{"free_space", Verdict::Ok, ""};
  struct statvfs vfs;
  if (statvfs(dir.c_str(), &vfs) != 0) {
    c.verdict = Verdict::Fail;
    c.detail = fmt::format("statvfs('{}') failed: {}", dir, errno_text(errno));
    return c;
  }
  const std::size_t free_bytes = static_cast<std::size_t>(vfs.f_bavail) * vfs.f_frsize;
  const std::size_t total_bytes = static_cast<std::size_t>(vfs.f_blocks) * vfs.f_frsize;
  c.detail = fmt::format("{} free of {} in '{}'", format_bytes(free_bytes), format_bytes(total_bytes), dir);
  if (need_bytes > 0 && free_bytes < need_bytes) {
    c.verdict = Verdict::Fail;
    c.detail += fmt::format("; the run needs {} (--need); fix: free {} or choose another --dir", format_bytes(need_bytes),
                            format_bytes(need_bytes - free_bytes));
  }
  return c;
}

Check check_memlock() {
  Check c{"memlock", Verdict::Ok, ""};
  rlimit lim;
  getrlimit(RLIMIT_MEMLOCK, &lim);
  const auto fmt_lim = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : format_bytes(v); };
  c.detail = fmt::format("RLIMIT_MEMLOCK soft {}, hard {}", fmt_lim(lim.rlim_cur), fmt_lim(lim.rlim_max));
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < 64 * MiB && geteuid() != 0) {
    c.verdict = Verdict::Warn;
    c.detail += "; registered io_uring buffers may be refused on older kernels and fall back to unregistered ones; "
                "fix: ulimit -l unlimited (or raise memlock in /etc/security/limits.conf)";
  }
  return c;
}

struct DoctorArgs {
  std::string dir = ".";
  std::string need;
  bool json = false;
  bool measure = false;
  std::string out;            // --out: the machine file (with --measure)
  std::string device_memory;  // --device-memory: the sim device's (with --measure)
};

// Writes the measured machine to `path` and reads it back as any machine file is read.
void write_machine_file(const std::string& path, const nlohmann::json& machine) {
  train::OutputFile out(path, "--out machine file", train::OutputFile::Mode::Truncate);
  out.write(machine.dump(2) + "\n");
  out.close();
  if (std::filesystem::is_regular_file(path)) {
    STRATA_CHECK(machine_to_json(load_machine(path)) == machine, "the machine file {} does not read back as written", path);
  }
}

int run_doctor(const DoctorArgs& args) {
  const std::size_t need_bytes = args.need.empty() ? 0 : parse_bytes_or_throw(args.need, "--need");
  sim::MeasureOptions measure{args.dir, 0};
  if (!args.measure && (!args.out.empty() || !args.device_memory.empty())) {
    throw ConfigError("--out and --device-memory describe the machine --measure measures; add --measure");
  }
  if (!args.device_memory.empty()) measure.device_memory_bytes = parse_bytes_or_throw(args.device_memory, "--device-memory");
  train::check_output_path(args.out, "--out", train::OutputWrite::InPlace);
  Topology topo;
  std::vector<Check> checks;
  checks.push_back(check_devices());
  checks.push_back(check_cpu(topo));
  checks.push_back(check_simd());
  checks.push_back(check_io_uring());
  checks.push_back(check_o_direct(args.dir));
  checks.push_back(check_free_space(args.dir, need_bytes));
  checks.push_back(check_memlock());
  const nlohmann::json machine = args.measure ? machine_to_json(sim::measure_machine(measure, topo)) : nlohmann::json();

  bool failed = false;
  for (const auto& c : checks) failed = failed || c.verdict == Verdict::Fail;
  if (args.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& c : checks) out.push_back({{"check", c.name}, {"verdict", verdict_name(c.verdict)}, {"detail", c.detail}});
    nlohmann::json report{{"ok", !failed}, {"checks", out}};
    if (args.measure) report["machine"] = machine;
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    for (const auto& c : checks) std::printf("%-5s %-11s %s\n", verdict_name(c.verdict), c.name.c_str(), c.detail.c_str());
    std::printf("%s\n", failed ? "strata doctor: an offload run into this directory would fail (see FAIL lines)"
                               : "strata doctor: this machine can run Strata offload jobs");
    if (args.measure) std::printf("machine (measured):\n%s\n", machine.dump(2).c_str());
  }
  if (!args.out.empty()) write_machine_file(args.out, machine);
  return failed ? 1 : 0;
}

}  // namespace

void register_doctor(CLI::App& app, bench::CommandTable& table) {
  auto* cmd = app.add_subcommand("doctor", "report what this machine offers an offload run, and what is broken");
  auto args = std::make_shared<DoctorArgs>();
  cmd->add_option("--dir", args->dir, "directory that will hold NVMe swap files (default: .)");
  cmd->add_option("--need", args->need, "fail unless --dir has this much free space (e.g. 20GiB)");
  cmd->add_flag("--json", args->json, "print the checks as JSON");
  cmd->add_flag("--measure", args->measure,
                "also describe this machine as a machine file, measured in a few seconds (CPU Adam, memory, the "
                "drive of --dir, the devices)");
  cmd->add_option("--out", args->out, "with --measure: write the machine file here");
  cmd->add_option("--device-memory", args->device_memory,
                  "with --measure and no CUDA device: the sim device's memory (default: a quarter of host memory)");
  table[cmd] = [args] { return run_doctor(*args); };
}

}  // namespace strata::cli
