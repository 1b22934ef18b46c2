// The rank's slices of a tensor-parallel decoder (see models/tensor_parallel.h).
#include "models/tensor_parallel.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "models/decoder_params.h"
#include "models/pipeline.h"

namespace strata::models {

namespace {

bool power_of_two(std::int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

RowRange part_of(std::int64_t n, int size, int rank) { return {rank * n / size, (rank + 1) * n / size}; }

// Rows: the rank's share of each consecutive block of `block` rows in a tensor of `blocks` blocks
// (GPT-2's qkv is three blocks of d_model rows).
TensorSlice row_blocks(std::int64_t block, int blocks, int size, int rank) {
  TensorSlice s{SliceKind::Rows, {}};
  for (int b = 0; b < blocks; ++b) {
    const RowRange r = part_of(block, size, rank);
    s.ranges.push_back({b * block + r.begin, b * block + r.end});
  }
  return s;
}
TensorSlice rows(std::int64_t n, int size, int rank) { return row_blocks(n, 1, size, rank); }
TensorSlice columns(std::int64_t n, int size, int rank) { return {SliceKind::Columns, {part_of(n, size, rank)}}; }

TensorSlice block_slice(const ModelConfig& c, std::size_t k, int T, int t) {
  const std::int64_t d = c.d_model, f = c.ffn_hidden, hd = c.head_dim();
  if (c.arch == Architecture::Gpt2) {
    using namespace gpt2_block;
    switch (k) {
      case kQkvW:
      case kQkvB: return row_blocks(d, 3, T, t);
      case kAttnProjW: return columns(d, T, t);
      case kFcW:
      case kFcB: return rows(f, T, t);
      case kMlpProjW: return columns(f, T, t);
      default: return {};
    }
  }
  using namespace llama_block;
  switch (k) {
    case kQ:
    case kQBias: return rows(c.n_heads * hd, T, t);
    case kK:
    case kV:
    case kKBias:
    case kVBias: {
      const int r = kv_replicas(c, T);  // Note [Replicated KV heads] in models/tensor_parallel.h: the whole KV head of the rank's queries
      return r == 1 ? rows(c.n_kv_heads * hd, T, t) : rows(c.n_kv_heads * hd, T / r, t / r);
    }
    case kO: return columns(c.n_heads * hd, T, t);
    case kGate:
    case kUp: return rows(f, T, t);
    case kDown: return columns(f, T, t);
    default: return {};
  }
}

// The sliced shape of a tensor of shape `whole`.
std::vector<std::int64_t> sliced_shape(const std::vector<std::int64_t>& whole, const TensorSlice& s) {
  std::vector<std::int64_t> shape = whole;
  if (s.kind == SliceKind::Rows) {
    std::int64_t n = 0;
    for (const RowRange& r : s.ranges) n += r.rows();
    shape[0] = n;
  } else if (s.kind == SliceKind::Columns) {
    shape.back() = s.ranges[0].rows();
  }
  return shape;
}

std::int64_t row_elems(const ParamTensorSpec& t) {
  std::int64_t n = 1;
  for (std::size_t i = 1; i < t.shape.size(); ++i) n *= t.shape[i];
  return n;
}

// Calls fn(whole offset, slice offset, count) for each contiguous run of the slice.
template <typename Fn>
void for_each_run(const ParamTensorSpec& whole, const TensorSlice& s, Fn&& fn) {
  switch (s.kind) {
    case SliceKind::Whole: fn(std::size_t{0}, std::size_t{0}, whole.elems()); return;
    case SliceKind::Rows: {
      const auto row = static_cast<std::size_t>(row_elems(whole));
      std::size_t at = 0;
      for (const RowRange& r : s.ranges) {
        const std::size_t n = static_cast<std::size_t>(r.rows()) * row;
        fn(static_cast<std::size_t>(r.begin) * row, at, n);
        at += n;
      }
      return;
    }
    case SliceKind::Columns: {
      const auto cols = static_cast<std::size_t>(whole.shape.back());
      const auto n = static_cast<std::size_t>(s.ranges[0].rows());
      const std::size_t rows_n = whole.elems() / cols;
      for (std::size_t r = 0; r < rows_n; ++r) fn(r * cols + static_cast<std::size_t>(s.ranges[0].begin), r * n, n);
      return;
    }
  }
}

}  // namespace

void check_tensor_parallel(const ModelConfig& m, int size, int slices, std::int64_t chunks,
                           const std::string& source) {
  const bool kv_ok = m.n_kv_heads >= size ? m.n_kv_heads % size == 0 : size % m.n_kv_heads == 0;
  if (m.n_heads % size != 0 || m.ffn_hidden % size != 0 || !kv_ok) {
    throw ConfigError(fmt::format("{}: strata.parallel.tensor = {} does not split model '{}' evenly ({} attention heads, "
                                  "{} KV heads, MLP width {}: each must divide by it, or KV heads fewer than the ranks "
                                  "divide it)",
                                  source, size, m.name, m.n_heads, m.n_kv_heads, m.ffn_hidden));
  }
  const std::int64_t smallest = std::min({m.n_heads * m.head_dim(), m.ffn_hidden, m.vocab_size});
  std::string valid;
  for (std::int64_t s = size; s <= chunks && s <= smallest; s *= 2) {
    const bool ok = size <= m.n_kv_heads || kv_pieces(m, s);
    if (chunks % s == 0 && ok) valid += fmt::format("{}{}", valid.empty() ? "" : ", ", s);
  }
  // See Note [Replicated KV heads] in models/tensor_parallel.h.
  // With KV heads on several ranks, a slice is whole query heads of one KV head.
  const bool heads_ok = size <= m.n_kv_heads || kv_pieces(m, slices);
  if (!power_of_two(slices) || slices % size != 0 || chunks % slices != 0 || slices > smallest || !heads_ok) {
    throw ConfigError(fmt::format(
        "{}: strata.parallel.tensor_slices = {} cannot slice model '{}' with strata.parallel.tensor = {}: it must be a "
        "power of two, a multiple of the tensor ranks, divide strata.tiling.chunks ({}) and be at most {} (Note "
        "[Tensor slices]); with more tensor ranks than the {} KV heads, a multiple of them dividing the {} attention "
        "heads (Note [Replicated KV heads] in models/tensor_parallel.h); valid choices: {}",
        source, slices, m.name, size, chunks, smallest, m.n_kv_heads, m.n_heads, valid.empty() ? "none" : valid));
  }
}

int kv_replicas(const ModelConfig& c, int size) {
  return size > c.n_kv_heads ? size / static_cast<int>(c.n_kv_heads) : 1;
}
bool kv_pieces(const ModelConfig& c, int slices) {
  return slices > c.n_kv_heads && c.n_kv_heads < c.n_heads && slices % c.n_kv_heads == 0 && c.n_heads % slices == 0;
}

RowRange vocab_rows(const ModelConfig& c, int size, int rank) { return part_of(c.vocab_size, size, rank); }

TensorParallelLayout tensor_parallel_layout(const ModelConfig& c, int size, int rank) {
  STRATA_CHECK(size >= 1 && rank >= 0 && rank < size, "tensor rank {} of {}", rank, size);
  TensorParallelLayout L;
  const std::vector<ParamGroupSpec> untiled = decoder_param_groups(c);
  L.logical = untiled;
  L.where.resize(untiled.size());
  for (std::size_t g = 0; g < untiled.size(); ++g) {
    std::vector<TensorSlice> cuts;
    for (std::size_t k = 0; k < untiled[g].tensors.size(); ++k) {
      TensorSlice s;
      if (size > 1) {
        if (g == embedding_group_index()) {
          if (k == embedding_group::kWte) s = rows(c.vocab_size, size, rank);
        } else if (g == head_group_index(c)) {
          if (!c.tied_embeddings && k == head_group::kLmHead) s = rows(c.vocab_size, size, rank);
        } else {
          s = block_slice(c, k, size, rank);
        }
      }
      L.logical[g].tensors[k].shape = sliced_shape(untiled[g].tensors[k].shape, s);
      cuts.push_back(std::move(s));
    }
    // Physical groups: the split tensors, the KV heads' copies (Note [Replicated KV heads] in
    // models/tensor_parallel.h), then the replicated tensors (T = 1: the group as it is).
    const auto kind_of = [&](std::size_t k) {
      if (size == 1) return 0;
      if (cuts[k].kind == SliceKind::Whole) return 2;
      const bool kv = c.arch == Architecture::Llama && g != embedding_group_index() && g != head_group_index(c) &&
                      (k == llama_block::kK || k == llama_block::kV || k == llama_block::kKBias ||
                       k == llama_block::kVBias);
      return kv && kv_replicas(c, size) > 1 ? 1 : 0;
    };
    std::vector<TensorLocation> ordered(untiled[g].tensors.size());
    bool first_part = true;
    for (const int kind : {0, 1, 2}) {
      ParamGroupSpec part{untiled[g].name, {}, untiled[g].grads_ready_calls};
      part.gathered_with = untiled[g].gathered_with;  // the first part keeps the logical name they refer to
      ParamGroupSpec whole_part = part;
      std::vector<TensorSlice> part_cuts;
      for (std::size_t k = 0; k < untiled[g].tensors.size(); ++k) {
        if (kind_of(k) != kind) continue;
        ordered[k] = {L.groups.size(), part.tensors.size()};
        part.tensors.push_back(L.logical[g].tensors[k]);
        whole_part.tensors.push_back(untiled[g].tensors[k]);
        part_cuts.push_back(cuts[k]);
      }
      if (part.tensors.empty()) continue;
      if (!first_part) {
        part.name += kind == 1 ? ".kv" : ".replicated";
        whole_part.name = part.name;
      }
      first_part = false;
      L.groups.push_back(std::move(part));
      L.whole.push_back(std::move(whole_part));
      L.slices.push_back(std::move(part_cuts));
      L.replicated.push_back(kind == 2);
      L.copies.push_back(kind == 2 ? size : kind == 1 ? kv_replicas(c, size) : 1);
    }
    L.where[g] = std::move(ordered);
  }
  return L;
}

SplitGroupProvider::SplitGroupProvider(ParamProvider& inner, const TensorParallelLayout& layout)
    : inner_(inner), layout_(layout) {
  STRATA_CHECK(inner.groups().size() == layout.groups.size(), "the provider holds {} groups, the layout {}",
               inner.groups().size(), layout.groups.size());
}

std::vector<std::size_t> SplitGroupProvider::parts(std::size_t logical) const {
  std::vector<std::size_t> p;
  for (const TensorLocation& at : layout_.where.at(logical)) {
    if (std::find(p.begin(), p.end(), at.group) == p.end()) p.push_back(at.group);
  }
  std::sort(p.begin(), p.end());
  return p;
}

GroupViews SplitGroupProvider::merge(std::size_t logical, const std::vector<GroupViews>& views) const {
  const std::vector<std::size_t> p = parts(logical);
  GroupViews out;
  for (const TensorLocation& at : layout_.where[logical]) {
    const auto i = static_cast<std::size_t>(std::find(p.begin(), p.end(), at.group) - p.begin());
    out.tensors.push_back(views[i][at.tensor]);
  }
  return out;
}

GroupViews SplitGroupProvider::acquire_params(std::size_t group, ParamPhase phase, Stream* stream) {
  std::vector<GroupViews> views;
  for (std::size_t g : parts(group)) views.push_back(inner_.acquire_params(g, phase, stream));
  return merge(group, views);
}

void SplitGroupProvider::release_params(std::size_t group, Stream* stream) {
  for (std::size_t g : parts(group)) inner_.release_params(g, stream);
}

GroupViews SplitGroupProvider::acquire_grads(std::size_t group, Stream* stream) {
  std::vector<GroupViews> views;
  for (std::size_t g : parts(group)) views.push_back(inner_.acquire_grads(g, stream));
  return merge(group, views);
}

void SplitGroupProvider::grads_ready(std::size_t group, Stream* stream) {
  for (std::size_t g : parts(group)) inner_.grads_ready(g, stream);
}

TensorParallelTraffic tensor_parallel_traffic(const ModelConfig& c, const TensorParallel& tp, std::int64_t rows,
                                              bool training, bool checkpointing, const PipelineStage* stage) {
  TensorParallelTraffic t;
  if (tp.size == 1) return t;
  const bool staged = stage != nullptr && stage->split();
  const std::int64_t end = staged && stage->end_layer >= 0 ? stage->end_layer : c.n_layers;
  const auto L = static_cast<std::uint64_t>(end - (staged ? stage->first_layer : 0));  // the stage's blocks
  const std::uint64_t E = !staged || stage->first() ? 1 : 0;                           // the embedding
  const std::uint64_t H = !staged || stage->last() ? 1 : 0;                            // the head
  const std::uint64_t losses = H + (staged && training && stage->first() && c.tied_embeddings ? 1 : 0);
  const std::uint64_t forwards = staged && training && stage->activation_sets == 0 && !stage->last() ? 2 : 1;
  const std::uint64_t T = training ? 1 : 0, K = training && checkpointing ? 1 : 0;
  const std::uint64_t activation = static_cast<std::uint64_t>(rows * c.d_model) * dtype_bytes(c.dtype);
  // The embedding's sum and the row-parallel outputs per forward; the column-parallel input
  // gradients and the head's; the recomputed forward of each block under checkpointing.
  const std::uint64_t activations = forwards * (E + 2 * L) + T * (2 * L + H) + K * 2 * L;
  t.all_reduce_calls = 2 * losses;  // the loss's row maxima and target logits
  t.all_reduce_bytes = 2 * losses * static_cast<std::uint64_t>(rows) * 4;
  t.all_gather_calls = losses;  // the loss's slice sums
  t.all_gather_bytes = losses * static_cast<std::uint64_t>(rows * tp.local_slices()) * 8;
  if (!tp.split_rows()) {
    t.all_reduce_calls += activations;
    t.all_reduce_bytes += activations * activation;
  } else {  // Note [Sequence parallelism] in models/tensor_parallel.h
    t.reduce_scatter_calls = activations;
    t.reduce_scatter_bytes = activations * activation;
    // The norms' outputs (the final norm's on the head's stage), per forward and again for the
    // column-parallel backward; the residual gradient for the row-parallel backward and the embedding's.
    const std::uint64_t gathers = forwards * 2 * L + H + K * 2 * L + T * (2 * L + E) + T * 2 * L;
    t.all_gather_calls += gathers;
    t.all_gather_bytes += gathers * (activation / static_cast<std::uint64_t>(tp.size));
    if (training) {  // the norms' weight gradients: the rank-order chain, or all-reduces
      const std::uint64_t vectors = (2 * L + H) * (c.arch == Architecture::Gpt2 ? 2 : 1);
      const std::uint64_t bytes = static_cast<std::uint64_t>(c.d_model) * dtype_bytes(c.dtype);
      if (!tp.ordered_norm_grads) {
        t.all_reduce_calls += vectors;
        t.all_reduce_bytes += vectors * bytes;
      } else {
        t.broadcast_calls = vectors;
        t.broadcast_bytes = vectors * bytes;
        if (tp.rank > 0) {
          t.recv_calls = vectors;
          t.recv_bytes = vectors * bytes;
        }
        if (tp.rank + 1 < tp.size) {
          t.send_calls = vectors;
          t.send_bytes = vectors * bytes;
        }
      }
    }
  }
  if (training && kv_replicas(c, tp.size) > 1) {
    t.all_gather_calls += L;
    t.all_gather_bytes += L * static_cast<std::uint64_t>(rows * 2 * c.head_dim()) * dtype_bytes(c.dtype);
  }
  return t;
}

void cut_slice(const ParamTensorSpec& whole_spec, const TensorSlice& slice, std::span<const float> whole,
               std::span<float> out) {
  STRATA_CHECK(whole.size() == whole_spec.elems(), "{}: {} values for {} elements", whole_spec.name, whole.size(),
               whole_spec.elems());
  std::size_t total = 0;
  for_each_run(whole_spec, slice, [&](std::size_t from, std::size_t to, std::size_t n) {
    STRATA_CHECK(to + n <= out.size(), "{}: slice of {} elements overruns", whole_spec.name, out.size());
    std::copy_n(whole.begin() + static_cast<std::ptrdiff_t>(from), n, out.begin() + static_cast<std::ptrdiff_t>(to));
    total += n;
  });
  STRATA_CHECK(total == out.size(), "{}: slice holds {} elements, {} given", whole_spec.name, total, out.size());
}

void place_slice(const ParamTensorSpec& whole_spec, const TensorSlice& slice, std::span<const float> part,
                 std::span<float> whole) {
  STRATA_CHECK(whole.size() == whole_spec.elems(), "{}: {} values for {} elements", whole_spec.name, whole.size(),
               whole_spec.elems());
  std::size_t total = 0;
  for_each_run(whole_spec, slice, [&](std::size_t to, std::size_t from, std::size_t n) {
    STRATA_CHECK(from + n <= part.size(), "{}: slice of {} elements overruns", whole_spec.name, part.size());
    std::copy_n(part.begin() + static_cast<std::ptrdiff_t>(from), n, whole.begin() + static_cast<std::ptrdiff_t>(to));
    total += n;
  });
  STRATA_CHECK(total == part.size(), "{}: slice holds {} elements, {} given", whole_spec.name, total, part.size());
}

}  // namespace strata::models
