// Loading a checkpoint into a freshly built engine (load_checkpoint in checkpoint/checkpoint.h): the
// manifest must belong to this model and run (FormatError naming the manifest and the field; the
// config may differ only where the math is left alone), the files this rank reads are verified,
// the ranks agree that all can load, and the state is imported range by range, resharded to this
// run's world size and sharding factor through CheckpointReader (checkpoint/checkpoint_format.cc).
#include <algorithm>
#include <exception>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_format.h"
#include "plan/partition.h"

namespace strata {

using checkpoint_internal::ManifestFields;

namespace {

// The checkpoint's field differs from this run's: a FormatError naming it.
FormatError mismatch(const ManifestFields& f, const std::string& field, const std::string& saved,
                     const std::string& ours) {
  return f.error(field, fmt::format("is {}, but this run has {}; resume with the config the checkpoint was written "
                                    "with, or start the run afresh",
                                    saved, ours));
}

// The saved groups are this rank's groups: names, tensors, shapes and offsets.
void check_groups(const CheckpointManifest& m, const ManifestFields& f, std::span<const ParamGroupSpec> specs,
                  const CheckpointTensorParallel& tensor) {
  if (m.tensor_size != tensor.size) {
    throw f.error("tensor_parallel.size",
                  fmt::format("is {}, but this run has strata.parallel.tensor = {}; resume with {} tensor ranks (any "
                              "number of data ranks): resharding across tensor ranks is not built yet",
                              m.tensor_size, tensor.size, m.tensor_size));
  }
  const std::size_t all = tensor.groups_per_rank(specs.size()) * static_cast<std::size_t>(tensor.size);
  if (m.groups.size() != all) {
    throw mismatch(f, "groups", fmt::format("{} param groups", m.groups.size()), fmt::format("{}", all));
  }
  const std::string prefix = tensor.size > 1 ? fmt::format("tensor{}/", tensor.rank) : std::string();
  for (std::size_t g = 0; g < specs.size(); ++g) {
    const std::size_t i = tensor.index(g, specs.size());  // checkpoint/checkpoint.h
    const CheckpointGroup& G = m.groups[i];
    const std::string where = fmt::format("groups[{}]", i);
    if (G.name != prefix + specs[g].name) throw mismatch(f, where + ".name", G.name, prefix + specs[g].name);
    if (G.tensors.size() != specs[g].tensors.size()) {
      throw mismatch(f, where + ".tensors", fmt::format("{} tensors", G.tensors.size()),
                     fmt::format("{}", specs[g].tensors.size()));
    }
    const GroupLayout layout(specs[g], 1);
    for (std::size_t t = 0; t < G.tensors.size(); ++t) {
      const std::string tw = fmt::format("{}.tensors[{}]", where, t);
      const ParamTensorSpec& s = specs[g].tensors[t];
      if (G.tensors[t].name != s.name) throw mismatch(f, tw + ".name", G.tensors[t].name, s.name);
      if (G.tensors[t].shape != s.shape) {
        throw mismatch(f, tw + ".shape", nlohmann::json(G.tensors[t].shape).dump(), nlohmann::json(s.shape).dump());
      }
      if (G.tensors[t].offset_elems != layout.slots()[t].offset_elems) {
        throw mismatch(f, tw + ".offset_elems", std::to_string(G.tensors[t].offset_elems),
                       std::to_string(layout.slots()[t].offset_elems));
      }
    }
  }
}

// The data must be the same to continue the same run; other settings may change (with a note,
// logged where `report`).
void check_config_changes(const CheckpointManifest& m, const ManifestFields& f, const TrainConfig& config,
                          bool report) {
  const nlohmann::json saved_data =
      m.config.is_object() && m.config.contains("strata") && m.config["strata"].is_object()
          ? m.config["strata"].value("data", nlohmann::json())
          : nlohmann::json();
  const nlohmann::json our_data =
      config.raw.is_object() && config.raw.contains("strata") && config.raw["strata"].is_object()
          ? config.raw["strata"].value("data", nlohmann::json())
          : nlohmann::json();
  if (saved_data != our_data) throw mismatch(f, "config.strata.data", saved_data.dump(), our_data.dump());
  std::vector<std::string> changed;
  for (const auto& op : nlohmann::json::diff(m.config, config.raw)) {
    const std::string path = op.value("path", "");
    // The pipeline's schedule leaves the math alone (models/pipeline.h); its stages may not (at a
    // fixed world they change the data ranks, so the units per step).
    const auto allowed = {"/strata/steps", "/strata/checkpoint", "/strata/metrics", "/strata/trace",
                          "/strata/parallel/schedule"};
    if (std::none_of(allowed.begin(), allowed.end(), [&](const char* p) { return path.rfind(p, 0) == 0; })) {
      changed.push_back(path);
    }
  }
  if (!changed.empty() && report) {
    spdlog::warn(
        "resuming {} with config changes ({}); the run matches the original only where they leave the "
        "math alone (same units per step: engine/zero_engine.h, Note [Exact gradient sums] in engine/zero_engine.h)",
        m.dir, fmt::join(changed, ", "));
  }
}

// groups == false: the saved groups are cut otherwise and the reslicer checks them.
// `report`: this rank logs the note about config changes (rank 0 of the world).
void check_compatible(const CheckpointManifest& m, ZeroEngine& engine, const TrainConfig& config,
                      const std::string& model_name, const CheckpointTensorParallel& tensor, bool report,
                      bool groups = true) {
  const ManifestFields f(m.path);
  if (m.model != model_name) throw mismatch(f, "model", m.model, model_name);
  if (groups) check_groups(m, f, engine.groups(), tensor);
  const EngineCheckpoint& state = engine.checkpoint();
  if (m.state_arrays != state.state_arrays() || m.optimizer != config.optimizer.type) {
    throw mismatch(f, "optimizer", m.optimizer, config.optimizer.type);
  }
  if (m.precision != precision_name(config.precision)) {
    throw mismatch(f, "precision", m.precision, std::string(precision_name(config.precision)));
  }
  if (m.counters.loss_scaler.has_value() != state.counters().loss_scaler.has_value()) {
    throw mismatch(f, "loss_scaler", m.counters.loss_scaler ? "set" : "null",
                   state.counters().loss_scaler ? "a loss scaler" : "none");
  }
  if (m.seed != config.strata.seed) {
    throw mismatch(f, "seed", std::to_string(m.seed), std::to_string(config.strata.seed));
  }
  check_config_changes(m, f, config, report);
}

}  // namespace

namespace {

// Both loads: the checks and the verification of the files this rank reads, agreed by every rank,
// then the state imported range by range (from this tensor rank's groups, or through `reslice`)
// and the counters restored.
CheckpointManifest load(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                        const std::string& model_name, const std::string& dir, const CheckpointTensorParallel& tensor,
                        const CheckpointReslicer* reslice) {
  const std::size_t n = engine.groups().size();
  const auto index = [&](std::size_t g) { return reslice != nullptr ? g : tensor.index(g, n); };
  std::exception_ptr error;
  CheckpointManifest m;
  std::unique_ptr<CheckpointReader> reader;
  try {
    m = read_checkpoint_manifest(dir);
    check_compatible(m, engine, config, model_name, tensor, world.rank() == 0, /*groups=*/reslice == nullptr);
    reader = std::make_unique<CheckpointReader>(m);
    if (reslice != nullptr) {
      // Any file may be read; the ranks share the verification.
      for (std::size_t i = static_cast<std::size_t>(world.rank()); i < m.files.size();
           i += static_cast<std::size_t>(world.world_size())) {
        reader->verify_file(m.files[i]);
      }
    } else {
      std::set<std::string> verified;
      for (std::size_t g = 0; g < engine.groups().size(); ++g) {
        const StateRange r = engine.checkpoint().state_range(g);
        for (const CheckpointFile* f : reader->files_covering(index(g), r.offset_elems, r.elems)) {
          if (verified.insert(f->name).second) reader->verify_file(*f);
        }
      }
    }
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  if (another_rank_failed(world, error)) {
    throw AnotherRankFailed(fmt::format("loading checkpoint {} failed on another rank (its message says why)", dir));
  }
  std::vector<StateRange> ranges;
  for (std::size_t g = 0; g < engine.groups().size(); ++g) ranges.push_back(engine.checkpoint().state_range(g));
  // A reslicer checked the manifest when it was made, on every rank alike, before these collectives.
  engine.checkpoint().import_state([&](std::size_t g, int a, std::size_t begin, std::span<float> out) {
    if (reslice != nullptr) {
      (*reslice)(*reader, g, a, ranges[g].offset_elems + begin, out);
    } else {
      reader->read(index(g), a, ranges[g].offset_elems + begin, out);
    }
  });
  engine.checkpoint().restore_counters(m.counters);
  return m;
}

}  // namespace

CheckpointManifest load_checkpoint(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                                   const std::string& model_name, const std::string& dir,
                                   const CheckpointTensorParallel& tensor) {
  return load(engine, world, config, model_name, dir, tensor, nullptr);
}

CheckpointManifest load_checkpoint_resliced(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                                            const std::string& model_name, const std::string& dir,
                                            const CheckpointReslicer& reslice) {
  return load(engine, world, config, model_name, dir, {}, &reslice);
}

}  // namespace strata
