// Checkpoints of a ZeRO training run: every rank's optimizer state (fp32 master weights and moments,
// from whichever tier holds them) and the counters a step depends on, written atomically into one
// directory per step, verified by checksums, and loadable under another world size or sharding
// factor. `strata train --resume`, periodic checkpoints and `strata ckpt` are built on this file.
//
// Note [Checkpoint format]: PARENT/step-00000120/ holds
//   manifest.json   format version, model name, param groups (tensor names, shapes, offsets in the
//                   flat buffer, total elements), world size, sharding factor, stage, precision,
//                   optimizer, step, optimizer step count, loss-scaler state, seed, the run's config,
//                   and per data file its size, ranges and checksums;
//   rank-RRRRR.bin  the state of rank R (engine/zero_engine.h, StateRange) as ranges: pieces of
//                   a group's state range (the engine's offload chunks, or pieces of 1 Mi elements),
//                   group after group in ascending order; inside a range, array after array (master,
//                   moment1, moment2), fp32 little-endian — the layout the offload tiers keep, so a
//                   chunk is copied with one O_DIRECT write. Since format version 2 every range
//                   starts at a multiple of 4 KiB and the file's size is one too (zeros between;
//                   version 1, still read, had ranges back to back). Only ranks holding the first
//                   copy of their shard write (EngineCheckpoint::holds_primary_state), so the files of
//                   one checkpoint cover each group's flat buffer exactly once.
// Since format version 3 the manifest is sealed: its last member "manifest_xxh64" covers its bytes
// (Note [Sealed manifest] in checkpoint/checkpoint_format.cc).
// Each (range, array) segment carries an XXH64 (seed 0) of its bytes; a file's checksum is the
// XXH64 of its segments' checksums as 8-byte little-endian words in file order. A loader needing elements
// [a, b) of a group's flat buffer reads them from the files whose ranges cover them; elements past
// the saved flat size are padding and zero (Note [Checkpoint state] in engine/zero_engine_state.cc).
//
// Note [Atomic checkpoints]: the ranks write into PARENT/.tmp-step-00000120/ (created 0700 by rank
// 0; leftovers of a crashed save are removed first), fsync their files and agree that all
// succeeded; rank 0 then writes and fsyncs the manifest, fsyncs the directory, renames it to
// step-00000120, fsyncs PARENT, replaces PARENT/latest (a one-line file naming the directory)
// through latest.tmp + fsync + rename + fsync, and finally retires all but the newest `keep`
// checkpoints (deleted in the background: Note [Pruning in the background] in
// checkpoint/checkpoint_retention.cc). A crash or an I/O error (ENOSPC, EIO) at any point leaves the
// previous checkpoint and `latest` as they were: a failed save removes its temporary directory and
// reports an IoError.
//
// The implementation: checkpoint/checkpoint_format.cc (manifest, checksums, CheckpointReader),
// checkpoint/checkpoint_writer.cc (begin and save), checkpoint/checkpoint_retention.cc (old checkpoints
// and spare data files), checkpoint/checkpoint_load.cc (loading into an engine).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "checkpoint/checkpoint_retention.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "plan/param_provider.h"
#include "engine/zero_engine.h"

namespace strata {

inline constexpr int kCheckpointFormatVersion = 3;
inline constexpr const char* kCheckpointManifest = "manifest.json";
inline constexpr const char* kCheckpointLatest = "latest";

// "step-00000120".
std::string checkpoint_dir_name(std::int64_t step);

// Tensor parallelism (models/tensor_parallel.h): a checkpoint of a run with `size` tensor ranks
// holds every tensor rank's param groups, rank t's group g at index t * (groups per rank) + g,
// named "tensor<t>/<name>", each sharded over the data ranks as usual; the manifest records
// "tensor_parallel": {"size", "slices"}. Such a checkpoint resumes with the same tensor ranks (any
// number of data ranks) through load_checkpoint, or with other tensor ranks (none included)
// through load_checkpoint_resliced.
//
// Pipeline parallelism (models/pipeline.h): a stage's engine holds some of its tensor rank's
// groups; `stage_groups[g]` is the index of its group g among that tensor rank's `groups` groups
// of the whole model. The checkpoint holds every stage's groups at those indices, so it is the
// checkpoint an unpipelined run with the same tensor ranks writes: it resumes at any number of
// stages (and data ranks) by the same indices, and across tensor ranks through the reslicer.
struct CheckpointTensorParallel {
  int size = 1;
  int rank = 0;
  int slices = 1;
  std::vector<std::size_t> stage_groups;  // empty: this rank holds all of its tensor rank's groups
  std::size_t groups = 0;                 // with stage_groups: the tensor rank's groups in all

  bool staged() const { return !stage_groups.empty(); }
  // The checkpoint's index of this rank's group g, of `engine_groups` groups.
  std::size_t index(std::size_t g, std::size_t engine_groups) const {
    const std::size_t per_rank = staged() ? groups : engine_groups;
    return static_cast<std::size_t>(rank) * per_rank + (staged() ? stage_groups[g] : g);
  }
  std::size_t groups_per_rank(std::size_t engine_groups) const { return staged() ? groups : engine_groups; }
};

struct CheckpointSaveOptions {
  std::string parent;  // the directory holding step-* checkpoints (strata.checkpoint.dir)
  CheckpointTensorParallel tensor;  // this rank's place with tensor parallelism
  int keep = 2;        // checkpoints kept after a successful save (>= 1)
  // Tests: called before every write to a checkpoint file (data files, manifest, latest) with the
  // file's path; a non-zero errno makes that write fail with it, as ENOSPC or EIO from the kernel.
  std::function<int(const std::string& path)> fault_hook;
  // Deletes the checkpoints a save retires in the background and must outlive the begin/save calls
  // it is passed to (the trainer owns one for the run); none: the save deletes them before it returns.
  CheckpointRetention* retention = nullptr;
  // What the run trains on, recorded as the manifest's "data" (null: not recorded). The engine does
  // not read it; the trainer compares it on resume (Note [Token cache identity], train/token_cache.h).
  nlohmann::json data;
};

struct CheckpointSaveResult {
  std::string dir;          // PARENT/step-...
  std::uint64_t bytes = 0;  // data files of all ranks
  double seconds = 0;       // wall time of the save on rank 0
};

// A checkpoint begun before the step it saves (begin_checkpoint); save_checkpoint finishes it.
class PendingCheckpoint {
 public:
  ~PendingCheckpoint();
  PendingCheckpoint(const PendingCheckpoint&) = delete;
  PendingCheckpoint& operator=(const PendingCheckpoint&) = delete;
  std::int64_t step() const;  // the step count the checkpoint is of

  struct State;

 private:
  explicit PendingCheckpoint(std::unique_ptr<State> state);
  friend std::unique_ptr<PendingCheckpoint> begin_checkpoint(ZeroEngine&, Communicator&, const TrainConfig&,
                                                             std::int64_t, const CheckpointSaveOptions&);
  friend CheckpointSaveResult save_checkpoint(ZeroEngine&, Communicator&, const TrainConfig&, const std::string&,
                                              std::int64_t, const CheckpointSaveOptions&, PendingCheckpoint*);
  std::unique_ptr<State> state_;
};

// Starts the checkpoint that will follow the next step, which brings the count to `step`
// (collective, between steps): makes the temporary directory and, where the optimizer state is
// offloaded, this rank's data file, and arms the engine to write each chunk's new state into it as
// the optimizer produces it (engine/state_home_tiered_state.cc, Note [Checkpoint capture] in
// engine/state_home_tiered_state.cc), so the save after the step reads nothing back. Pass the result to save_checkpoint
// after that step.
std::unique_ptr<PendingCheckpoint> begin_checkpoint(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                                                    std::int64_t step, const CheckpointSaveOptions& options);

// Writes a checkpoint of `engine` after `step` steps (collective over `world`). `config` gives the
// precision, optimizer, seed and the raw config recorded in the manifest; `model_name` the model.
// With `pending` (begun for this step) the data the step captured is used; whatever it did not
// capture (a skipped step, state on the device) is copied now. Throws IoError (on every rank) when
// any rank failed; the previous checkpoint is then intact.
CheckpointSaveResult save_checkpoint(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                                     const std::string& model_name, std::int64_t step,
                                     const CheckpointSaveOptions& options, PendingCheckpoint* pending = nullptr);

// One (range, array) segment layout of a data file.
struct CheckpointRange {
  std::size_t group = 0;
  std::size_t offset_elems = 0;  // in the group's flat buffer
  std::size_t elems = 0;
  std::uint64_t file_offset_bytes = 0;  // where the range's first array starts in the file
  std::vector<std::uint64_t> xxh64;     // one per state array
};

struct CheckpointFile {
  std::string name;
  int rank = 0;
  std::uint64_t bytes = 0;
  std::uint64_t xxh64 = 0;
  std::vector<CheckpointRange> ranges;
};

struct CheckpointTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t offset_elems = 0;
};

struct CheckpointGroup {
  std::string name;
  std::size_t total_elems = 0;
  std::vector<CheckpointTensor> tensors;
};

struct CheckpointManifest {
  std::string dir;   // the checkpoint directory
  std::string path;  // its manifest.json
  int format_version = 0;
  std::string model;
  std::int64_t step = 0;
  EngineCounters counters;
  std::uint64_t seed = 0;
  int world_size = 0;
  int sharding_factor = 0;
  int stage = 0;
  std::string precision;
  std::string optimizer;
  int state_arrays = 0;
  int tensor_size = 1;    // tensor ranks of the run that wrote it (CheckpointTensorParallel)
  int tensor_slices = 1;
  std::vector<CheckpointGroup> groups;
  std::vector<CheckpointFile> files;
  nlohmann::json config;
  nlohmann::json json;  // as read
};

// The steps of the checkpoint directories (step-N, complete or not) in `parent`, ascending; empty
// when there are none or `parent` does not exist.
std::vector<std::int64_t> checkpoint_steps_in(const std::string& parent);

// The step `parent`/latest names; nullopt without a latest file. FormatError when it is malformed.
std::optional<std::int64_t> latest_checkpoint_step(const std::string& parent);

// DIR itself when it holds a manifest, else the checkpoint DIR/latest names. Throws FormatError
// naming what is missing.
std::string resolve_checkpoint_dir(const std::string& dir);
// The text of a manifest as written: `manifest` (any "manifest_xxh64" dropped) dumped with indent 1
// and sealed with its checksum (Note [Sealed manifest] in checkpoint/checkpoint_format.cc).
std::string checkpoint_manifest_text(nlohmann::json manifest);
// Reads and checks the structure of DIR's manifest (DIR resolved as above). FormatError names the
// file and the field.
CheckpointManifest read_checkpoint_manifest(const std::string& dir);

// Reads ranges of the state out of a checkpoint's data files.
class CheckpointReader {
 public:
  explicit CheckpointReader(CheckpointManifest manifest);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const CheckpointManifest& manifest() const { return manifest_; }
  // Checks a data file's presence, size and every checksum; FormatError names the file (and the
  // group and array of a bad segment).
  void verify_file(const CheckpointFile& file);
  // The data files holding any of [offset_elems, offset_elems + elems) of group `group`.
  std::vector<const CheckpointFile*> files_covering(std::size_t group, std::size_t offset_elems,
                                                    std::size_t elems) const;
  // Elements [offset_elems, offset_elems + out.size()) of array `array` of group `group`'s flat
  // buffer; elements past the saved flat size are padding (zero).
  void read(std::size_t group, int array, std::size_t offset_elems, std::span<float> out);

 private:
  int fd_of(const CheckpointFile& file);
  CheckpointManifest manifest_;
  std::map<std::string, UniqueFd> fds_;
};

// Every problem found in a checkpoint (manifest, completeness, sizes, checksums, the `latest`
// pointer when DIR is a parent); empty when it is good.
std::vector<std::string> verify_checkpoint(const std::string& dir);

// Loads the checkpoint at DIR (resolved as above) into a freshly built engine of this run
// (collective): checks it belongs to this model and config (FormatError naming the manifest and
// the field), verifies the files this rank reads, agrees with the other ranks that all can load,
// then imports the state and counters. Another world size or sharding factor is resharded.
// Returns the manifest (its `step` is where training continues).
// With tensor parallelism, `world` is every rank and `tensor` this rank's place: it loads its
// tensor rank's groups.
CheckpointManifest load_checkpoint(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                                   const std::string& model_name, const std::string& dir,
                                   const CheckpointTensorParallel& tensor = {});

// Elements [offset_elems, offset_elems + out.size()) of state array `array` of this run's group
// `group`'s flat buffer, made from a checkpoint whose groups are cut otherwise (another number of
// tensor ranks): the model knows how (train/checkpoint_tensors.h), the engine does not.
using CheckpointReslicer = std::function<void(CheckpointReader& reader, std::size_t group, int array,
                                              std::size_t offset_elems, std::span<float> out)>;
// load_checkpoint with the state from `reslice`: the run-level checks (model, optimizer, precision,
// seed, data), every data file verified, the state imported through `reslice`, the counters restored.
CheckpointManifest load_checkpoint_resliced(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                                            const std::string& model_name, const std::string& dir,
                                            const CheckpointReslicer& reslice);

}  // namespace strata
