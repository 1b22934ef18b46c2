// The machine's topology through hwloc: cores, NUMA nodes, memory per node, and NUMA placement of
// host memory. One Topology is created by whoever needs it and passed down (no global state).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace strata {

struct NumaNodeInfo {
  int os_index = 0;
  std::size_t memory_bytes = 0;
};

class Topology {
 public:
  Topology();  // loads the topology; throws InternalError if hwloc fails
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  int physical_cores() const;
  int logical_cpus() const;
  const std::vector<NumaNodeInfo>& numa_nodes() const { return numa_nodes_; }
  std::string cpu_model() const;

  // Binds the pages of [ptr, ptr+bytes) to NUMA node `os_index` (hwloc_set_area_membind).
  // Returns false (and leaves the memory where it is) if the node does not exist or the kernel
  // refuses; placement is an optimization, never a correctness matter.
  bool bind_memory(void* ptr, std::size_t bytes, int os_index) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<NumaNodeInfo> numa_nodes_;
};

}  // namespace strata
