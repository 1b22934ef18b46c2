// hwloc topology (see core/topology.h).
#include "core/topology.h"

#include <hwloc.h>

#include "core/error.h"

namespace strata {

struct Topology::Impl {
  hwloc_topology_t topo = nullptr;
};

Topology::Topology() : impl_(std::make_unique<Impl>()) {
  STRATA_CHECK(hwloc_topology_init(&impl_->topo) == 0, "hwloc_topology_init");
  if (hwloc_topology_load(impl_->topo) != 0) {
    hwloc_topology_destroy(impl_->topo);
    impl_->topo = nullptr;
    STRATA_CHECK(false, "hwloc_topology_load failed");
  }
  const int n = hwloc_get_nbobjs_by_type(impl_->topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t obj = hwloc_get_obj_by_type(impl_->topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNodeInfo info;
    info.os_index = static_cast<int>(obj->os_index);
    info.memory_bytes = obj->attr != nullptr ? obj->attr->numanode.local_memory : 0;
    numa_nodes_.push_back(info);
  }
}

Topology::~Topology() {
  if (impl_ && impl_->topo != nullptr) hwloc_topology_destroy(impl_->topo);
}

int Topology::physical_cores() const { return hwloc_get_nbobjs_by_type(impl_->topo, HWLOC_OBJ_CORE); }

int Topology::logical_cpus() const { return hwloc_get_nbobjs_by_type(impl_->topo, HWLOC_OBJ_PU); }

std::string Topology::cpu_model() const {
  hwloc_obj_t pkg = hwloc_get_obj_by_type(impl_->topo, HWLOC_OBJ_PACKAGE, 0);
  if (pkg == nullptr) return "unknown";
  const char* model = hwloc_obj_get_info_by_name(pkg, "CPUModel");
  return model != nullptr ? model : "unknown";
}

bool Topology::bind_memory(void* ptr, std::size_t bytes, int os_index) const {
  hwloc_obj_t node = nullptr;
  for (int i = 0;; ++i) {
    node = hwloc_get_obj_by_type(impl_->topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    if (node == nullptr) return false;
    if (static_cast<int>(node->os_index) == os_index) break;
  }
  return hwloc_set_area_membind(impl_->topo, ptr, bytes, node->nodeset, HWLOC_MEMBIND_BIND,
                                HWLOC_MEMBIND_BYNODESET) == 0;
}

}  // namespace strata
