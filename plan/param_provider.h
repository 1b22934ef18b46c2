// The param-group provider: the contract between a model and whoever owns its parameters.
//
// A model owns no parameter memory (docs/DESIGN.md, "One training step"). It declares its param
// groups once (one per transformer block, the embedding, the final norm/head: the unit of fetch and
// release), and while it runs it asks the provider for a group's tensor views before use and hands
// the group back after use. Gradients travel the same way: the model acquires a group's gradient
// views, accumulates into them (it never overwrites: the provider zeroes them at the start of a
// step, so micro-batches accumulate for free), then declares them ready.
//
// Ordering is by stream, never by host synchronization: acquire_* returns views that are valid for
// work enqueued on `stream` after the call (a provider that fetches asynchronously makes `stream`
// wait on its fetch event); release_*/grads_ready are called after the model has enqueued the last
// work that uses the views on `stream` (the provider records an event there before it frees, reduces
// or offloads). A null `stream` means the model runs inline on the calling thread over host memory
// (the plain in-memory reference run); providers then treat every call as already ordered.
//
// The ZeRO coordinator (engine/) implements this behind fetch/release with trace-based prefetch;
// models/resident_provider.h is the "all resident" implementation the tests use. This header is
// deliberately dependency-light so that engine/ can implement it without including models/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace strata {

class Stream;

// One parameter tensor inside a group.
struct ParamTensorSpec {
  std::string name;                // model-internal name, e.g. "blocks.3.attn.qkv.weight"
  std::vector<std::int64_t> shape;  // row-major; a Linear weight is [out, in]
  DType dtype = DType::F32;

  std::size_t elems() const {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    return n;
  }
  std::size_t bytes() const { return elems() * dtype_bytes(dtype); }
};

// One unit of fetch and release.
struct ParamGroupSpec {
  std::string name;  // "embedding", "blocks.3", "head"
  std::vector<ParamTensorSpec> tensors;
  // How many times one backward pass calls grads_ready for this group (2 for an embedding tied to
  // the head). 0: unknown, and a provider learns it in the first micro-batch, holding every
  // group's gradients until that micro-batch ends; declaring it lets the very first backward
  // release each group's gradients as soon as they are final (what a model larger than the
  // device needs).
  int grads_ready_calls = 0;
  // Groups the model keeps acquired while it uses this one, by name (GPT-2's head runs on the tied
  // embedding's weights; a tile runs beside its block's base group): the tier planner counts their
  // gathered copies in this group's window (Note [Groups gathered together], plan/tier_plan.cc).
  std::vector<std::string> gathered_with{};

  std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& t : tensors) n += t.bytes();
    return n;
  }
};

// Why a group is being acquired: forward and backward (recompute included) are separate phases in
// the coordinator's trace.
enum class ParamPhase { Forward, Backward };

// Device pointers to a group's tensors, in the order of its ParamGroupSpec::tensors.
struct GroupViews {
  std::vector<void*> tensors;
  void* operator[](std::size_t i) const { return tensors[i]; }
};

class ParamProvider {
 public:
  virtual ~ParamProvider() = default;

  // The groups the model declared, in model order (index = group id).
  virtual std::span<const ParamGroupSpec> groups() const = 0;

  // Views of group `group`'s weights, valid for work enqueued on `stream` after this call and until
  // the matching release_params.
  virtual GroupViews acquire_params(std::size_t group, ParamPhase phase, Stream* stream) = 0;
  // The model has enqueued its last use of the views on `stream`.
  virtual void release_params(std::size_t group, Stream* stream) = 0;

  // Views of group `group`'s gradient accumulators (same shapes and dtypes as the weights). The
  // model adds into them; they hold zeros at the start of each optimizer step.
  virtual GroupViews acquire_grads(std::size_t group, Stream* stream) = 0;
  // The model has enqueued all its accumulation into the group for this backward pass on `stream`.
  virtual void grads_ready(std::size_t group, Stream* stream) = 0;
};

}  // namespace strata
