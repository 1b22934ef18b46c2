// The workers of `strata bench io --jobs` (see bench/bench_io_jobs.h).
#include "bench/bench_io_jobs.h"

#include <hwloc.h>

#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"

namespace strata::bench::bench_io {
namespace {

// An hwloc topology with the I/O devices (block devices under their PCI parents) kept.
class IoTopology {
 public:
  IoTopology() {
    STRATA_CHECK(hwloc_topology_init(&topo_) == 0, "hwloc_topology_init");
    hwloc_topology_set_io_types_filter(topo_, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo_) != 0) {
      hwloc_topology_destroy(topo_);
      STRATA_CHECK(false, "hwloc_topology_load failed");
    }
  }
  ~IoTopology() { hwloc_topology_destroy(topo_); }
  IoTopology(const IoTopology&) = delete;
  IoTopology& operator=(const IoTopology&) = delete;

  // The smallest non-I/O object (a NUMA node's package, a group, the machine) holding the block
  // device `name`; nothing when hwloc does not list it.
  hwloc_obj_t near_device(const std::string& name) const {
    for (hwloc_obj_t os = hwloc_get_next_osdev(topo_, nullptr); os != nullptr; os = hwloc_get_next_osdev(topo_, os)) {
      if (os->name != nullptr && name == os->name) return hwloc_get_non_io_ancestor_obj(topo_, os);
    }
    return nullptr;
  }
  hwloc_obj_t root() const { return hwloc_get_root_obj(topo_); }
  // Cores, or logical CPUs where hwloc shows no cores.
  hwloc_obj_type_t unit() const { return hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU; }
  unsigned units() const { return static_cast<unsigned>(hwloc_get_nbobjs_by_type(topo_, unit())); }
  hwloc_obj_t unit_at(unsigned i) const { return hwloc_get_obj_by_type(topo_, unit(), i); }

 private:
  hwloc_topology_t topo_ = nullptr;
};

// "NUMA node 0", "NUMA nodes 0-1" or "machine" for the objects' node set.
std::string locality_name(hwloc_obj_t near, bool placed) {
  if (!placed) return "machine (hwloc does not place the drive)";
  const int nodes = hwloc_bitmap_weight(near->nodeset);
  if (nodes == 1) return fmt::format("NUMA node {}", hwloc_bitmap_first(near->nodeset));
  char text[128];
  hwloc_bitmap_list_snprintf(text, sizeof text, near->nodeset);
  return fmt::format("NUMA nodes {}", text);
}

}  // namespace

Placement place_jobs(const std::vector<TestFile>& files, unsigned jobs) {
  IoTopology topo;
  Placement out;
  std::vector<bool> taken(topo.units(), false);
  unsigned next_shared = 0;
  for (const TestFile& f : files) {
    const std::optional<std::string> device = offload::block_device_name(f.path);
    hwloc_obj_t near = device ? topo.near_device(*device) : nullptr;
    const bool placed = near != nullptr;
    if (!placed) near = topo.root();
    for (unsigned j = 0; j < jobs; ++j) {
      // A free core near the drive, else any free core, else one shared in turn.
      std::optional<unsigned> pick;
      for (int pass = 0; pass < 2 && !pick; ++pass) {
        for (unsigned u = 0; u < taken.size() && !pick; ++u) {
          const bool is_near = hwloc_bitmap_intersects(topo.unit_at(u)->cpuset, near->cpuset) != 0;
          if (!taken[u] && (pass == 1 || is_near)) pick = u;
        }
      }
      const bool shared = !pick;
      if (shared) pick = next_shared++ % static_cast<unsigned>(taken.size());
      taken[*pick] = true;
      hwloc_obj_t unit = topo.unit_at(*pick);
      const int cpu = hwloc_bitmap_first(unit->cpuset);
      out.cpus.push_back(cpu);
      out.report.push_back({{"path", f.path},
                            {"device", device.value_or("")},
                            {"job", j},
                            {"cpu", cpu},
                            {"core", unit->logical_index},
                            {"near", locality_name(near, placed)},
                            {"near_drive", hwloc_bitmap_isset(near->cpuset, static_cast<unsigned>(cpu)) != 0},
                            {"shared_core", shared}});
    }
  }
  return out;
}

JobEngines::JobEngines(const offload::IoEngineOptions& options, std::vector<TestFile>& files, unsigned jobs,
                       const std::vector<int>& cpus, std::span<std::byte> buffer)
    : files_(files) {
  const std::span<std::byte> spans[] = {buffer};
  for (std::size_t f = 0; f < files.size(); ++f) {
    for (unsigned j = 0; j < jobs; ++j) {
      offload::IoEngineOptions o = options;
      const std::size_t index = f * jobs + j;
      o.cpu = index < cpus.size() ? cpus[index] : -1;
      auto engine = offload::make_io_engine(o);
      Job job{engine.get(), f, {}, j, jobs};
      for (TestFile& t : files) job.file_ids.push_back(engine->register_file(t.fd.get(), t.path));
      engine->register_buffers(spans);
      jobs_.push_back(std::move(job));
      engines_.push_back(std::move(engine));
    }
  }
  for (std::size_t f = 0; f < files.size(); ++f) files[f].id = jobs_.front().file_ids[f];
}

JobEngines::~JobEngines() {
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    for (std::size_t f = 0; f < files_.size(); ++f) engines_[e]->unregister_file(jobs_[e].file_ids[f]);
  }
}

}  // namespace strata::bench::bench_io
