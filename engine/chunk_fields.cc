// The arrays of the tiered state home's chunk jobs (engine/chunk_fields.h).
#include "engine/chunk_fields.h"

#include "engine/engine_context.h"

namespace strata {

namespace {

std::size_t add(std::vector<ChunkField>& fields, std::string key, Home tier, std::size_t bytes, ChunkField::Kind kind) {
  fields.push_back(ChunkField{std::move(key), tier, bytes, kind});
  return fields.size() - 1;
}

std::size_t state_bytes(const RunPlan& plan, std::size_t elems) {
  return static_cast<std::size_t>(plan.state_arrays) * 4 * elems;
}

}  // namespace

std::string state_key(std::size_t g, std::size_t k) { return "o" + std::to_string(g) + "." + std::to_string(k); }
std::string grad_key(std::size_t g, std::size_t k) { return "g" + std::to_string(g) + "." + std::to_string(k); }
std::string param_key(std::size_t g, std::size_t k) { return "w" + std::to_string(g) + "." + std::to_string(k); }
std::string level_key(std::size_t g, int level, std::size_t k) {
  return "l" + std::to_string(g) + "." + std::to_string(level) + "." + std::to_string(k);
}

bool weights_on_tier(const RunPlan& plan, std::size_t g) {
  return plan.params_offloaded() && plan.groups[g].sharded_params;
}

CombineFields combine_fields(const RunPlan& plan, std::size_t g, std::size_t k, int unit, bool exact,
                             bool overlap_step) {
  const StateChunk& c = plan.groups[g].chunks[k];
  const std::size_t n = c.elems;
  const std::size_t wbytes = plan.working_bytes();
  const bool last = unit + 1 == plan.accumulation;
  const bool overlap = last && overlap_step;
  const Home tier = tier_home(c.grads);  // the partial sums; the state (overlapped update) has its own
  CombineFields f;
  f.stage = add(f.fields, "", Home::Host, n * wbytes, ChunkField::Scratch);
  if (exact) {
    const int merges = counter_merges(unit);
    std::vector<int> levels;
    for (int level = 0; level < merges; ++level) levels.push_back(level);
    if (last) {
      const std::vector<int> left = counter_levels_left(plan.accumulation, merges);
      levels.insert(levels.end(), left.begin(), left.end());
    }
    for (int level : levels) {
      f.adds.push_back(add(f.fields, level_key(g, level, k), tier, 4 * n, ChunkField::Read));
      f.remove_after.push_back(level_key(g, level, k));
    }
    if (overlap) {
      f.out = add(f.fields, "", Home::Host, 4 * n, ChunkField::Scratch);
    } else {
      f.out = add(f.fields, last ? grad_key(g, k) : level_key(g, merges, k), tier, 4 * n, ChunkField::Write);
    }
  } else if (unit == 0) {
    f.out = overlap ? add(f.fields, "", Home::Host, 4 * n, ChunkField::Scratch)
                    : add(f.fields, grad_key(g, k), tier, 4 * n, ChunkField::Write);
  } else {
    f.out = add(f.fields, grad_key(g, k), tier, 4 * n, overlap ? ChunkField::Read : ChunkField::Update);
    if (overlap) f.remove_after.push_back(grad_key(g, k));
    f.tmp = add(f.fields, "", Home::Host, 4 * n, ChunkField::Scratch);
  }
  if (overlap) {
    f.state = add(f.fields, state_key(g, k), tier_home(c.state), state_bytes(plan, n), ChunkField::Update);
    f.weights = weights_on_tier(plan, g)
                    ? add(f.fields, param_key(g, k), tier_home(c.params), n * wbytes, ChunkField::Write)
                    : add(f.fields, "", Home::Host, n * wbytes, ChunkField::Scratch);
  }
  return f;
}

UpdateFields update_fields(const RunPlan& plan, std::size_t g, std::size_t k) {
  const StateChunk& c = plan.groups[g].chunks[k];
  const std::size_t n = c.elems;
  const std::size_t wbytes = plan.working_bytes();
  UpdateFields f;
  add(f.fields, state_key(g, k), tier_home(c.state), state_bytes(plan, n), ChunkField::Update);
  add(f.fields, grad_key(g, k), tier_home(c.grads), 4 * n, ChunkField::Read);
  f.remove_after.push_back(grad_key(g, k));
  if (weights_on_tier(plan, g)) {
    add(f.fields, param_key(g, k), tier_home(c.params), n * wbytes, ChunkField::Write);
  } else {
    add(f.fields, "", Home::Host, n * wbytes, ChunkField::Scratch);
  }
  return f;
}

}  // namespace strata
