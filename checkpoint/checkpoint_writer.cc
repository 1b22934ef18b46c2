// Writing checkpoints (Note [Atomic checkpoints] in checkpoint/checkpoint.h): the temporary step
// directory, each rank's data file (copied after the step or captured during it, hashed while the
// disk writes it), the agreement of all ranks that their files are durable, and rank 0's
// publication (manifest, rename, `latest`, retirement of old checkpoints through the save's
// CheckpointRetention). Every write of a checkpoint file goes through the test fault hook first.
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string_view>

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "core/error.h"
#include "core/file_io.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_format.h"
#include "offload/file.h"
#include "offload/io_engine.h"

namespace strata {

namespace fs = std::filesystem;
using namespace checkpoint_internal;

namespace {

// CheckpointSaveOptions::fault_hook: fails the write of `bytes` at `offset` of `path` with the
// hook's errno, as the kernel would.
void check_fault_hook(const CheckpointSaveOptions& options, const std::string& path, std::size_t bytes,
                      std::uint64_t offset) {
  if (!options.fault_hook) return;
  if (const int err = options.fault_hook(path); err != 0) throw write_error(path, bytes, offset, err);
}

void write_checkpoint_bytes(int fd, const std::string& path, std::string_view bytes, std::uint64_t offset,
                            const CheckpointSaveOptions& options) {
  check_fault_hook(options, path, bytes.size(), offset);
  write_exact(fd, bytes.data(), bytes.size(), offset, path);
}

// Writes `text` as `name` in the (private, canonical) directory `dir` and fsyncs it.
void write_whole_file(const std::string& dir, const std::string& name, std::string_view text,
                      const CheckpointSaveOptions& options) {
  const UniqueFd fd = offload::open_inside(dir, name, offload::Direct::Off, offload::Truncate::Truncate);
  const std::string path = dir + "/" + name;
  write_checkpoint_bytes(fd.get(), path, text, 0, options);
  fsync_file(fd.get(), path);
}

// All ranks learn whether any failed; a failing rank rethrows its own error, the others say so.
void agree(Communicator& world, const std::exception_ptr& error, const std::string& what) {
  if (another_rank_failed(world, error)) {
    throw IoError(fmt::format("{} failed on another rank (its message says why)", what), 0);
  }
}

// This rank's data file of a checkpoint: one range per piece the engine hands out (Note
// [Checkpoint copy] in engine/zero_engine_state.cc), each at a 4 KiB boundary, written with
// O_DIRECT (buffered where the file system refuses it) through an I/O engine of its own, either
// copied after the step (copy()) or captured during it (capture_sink(), Note [Checkpoint capture] in
// engine/state_home_tiered_state.cc in engine/state_home_tiered_state.cc).
class RankFileWriter : public std::enable_shared_from_this<RankFileWriter> {
 public:
  RankFileWriter(const EngineCheckpoint& state, const TrainConfig& config, const std::string& parent, const std::string& tmp_dir,
                 int rank, const CheckpointSaveOptions& options, const CheckpointRetention& retention)
      : rank_(rank),
        name_(fmt::format("rank-{:05}.bin", rank)),
        path_(tmp_dir + "/" + name_),
        arrays_(static_cast<std::size_t>(state.state_arrays())),
        chunks_(state.state_chunks()),
        options_(options) {
    std::uint64_t cursor = 0;
    for (const auto& c : chunks_) {
      offsets_.push_back(cursor);
      cursor += align_to_range(arrays_ * c.elems * sizeof(float));
      range_offsets_.push_back(state.state_range(c.group).offset_elems + c.begin_elems);
    }
    bytes_ = cursor;
    digests_.assign(chunks_.size() * arrays_, 0);
    open_file(tmp_dir, parent, retention);
    offload::IoEngineOptions io;
    io.kind = offload::parse_engine_kind(config.aio.engine == "io_uring" ? "uring" : config.aio.engine, "aio.engine");
    io.queue_depth = static_cast<unsigned>(config.aio.queue_depth);
    io_ = offload::make_io_engine(io);
    file_ = io_->register_file(fd_.get(), path_);
  }
  ~RankFileWriter() {
    if (file_ >= 0) io_->unregister_file(file_);
  }
  RankFileWriter(const RankFileWriter&) = delete;
  RankFileWriter& operator=(const RankFileWriter&) = delete;

  std::size_t pieces() const { return chunks_.size(); }

  // Starts piece i's write and hashes the piece while the disk writes it; throws for an injected
  // fault. The caller keeps `padded` unchanged until the returned handle completes (the write reads
  // it) and at least until this returns (the hash reads it): an export piece is retired only after
  // this returns, a captured chunk's slot is held by the optimizer pipeline across this call.
  // Hashing before the write held the disk up (docs/MEASUREMENTS.md, "Checkpoints").
  offload::IoHandle write(std::size_t i, std::span<const std::byte> padded, offload::IoCallback done) {
    check_fault_hook(options_, path_, padded.size(), offsets_[i]);
    const offload::IoRequest request{offload::IoOp::Write, file_, offsets_[i], const_cast<std::byte*>(padded.data()),
                                     padded.size()};
    offload::IoHandle handle = io_->submit(std::span<const offload::IoRequest>(&request, 1), std::move(done));
    const auto& c = chunks_[i];
    for (std::size_t a = 0; a < arrays_; ++a) {
      digests_[i * arrays_ + a] = XXH64(padded.data() + a * c.elems * sizeof(float), c.elems * sizeof(float), 0);
    }
    return handle;
  }

  // Every piece, copied from the engine's tiers after the step.
  void copy(EngineCheckpoint& state) {
    state.export_state([&](std::size_t i, std::span<const std::byte> padded) { return write(i, padded, {}); });
  }

  // For EngineCheckpoint::capture_next_step: never throws; an error is kept for finish() and the step
  // goes on. The sink keeps the writer alive for as long as the engine holds it.
  StateCaptureSink capture_sink() {
    return [self = shared_from_this()](std::size_t i, std::span<const std::byte> padded,
                                       offload::IoCallback done) -> offload::IoHandle {
      try {
        return self->write(i, padded, [self, done = std::move(done)](std::exception_ptr& error) mutable {
          if (error) self->keep_error(error);
          error = nullptr;
          done(error);
        });
      } catch (...) {
        self->keep_error(std::current_exception());
        return offload::IoHandle::ready();
      }
    };
  }

  // After every write completed: rethrows a kept error, fsyncs, returns the file's manifest entry.
  CheckpointFile finish() {
    {
      std::lock_guard lock(mutex_);
      if (error_) std::rethrow_exception(error_);
    }
    fsync_file(fd_.get(), path_);
    CheckpointFile file{name_, rank_, bytes_, file_checksum(digests_), {}};
    for (std::size_t i = 0; i < chunks_.size(); ++i) {
      const auto first = digests_.begin() + static_cast<std::ptrdiff_t>(i * arrays_);
      file.ranges.push_back({chunks_[i].group, range_offsets_[i], chunks_[i].elems, offsets_[i],
                             std::vector<std::uint64_t>(first, first + static_cast<std::ptrdiff_t>(arrays_))});
    }
    return file;
  }

 private:
  // Opens the file at its full size: the rank's spare when there is one (Note [Recycled data
  // files] in checkpoint/checkpoint_retention.cc), else a new file.
  void open_file(const std::string& tmp_dir, const std::string& parent, const CheckpointRetention& retention) {
    const offload::Direct direct =
        offload::probe_direct_io(tmp_dir).empty() ? offload::Direct::On : offload::Direct::Off;
    const bool recycled = retention.take_spare(parent, name_, path_);
    if (recycled) {
      try {
        fd_ = offload::open_inside(tmp_dir, name_, direct, offload::Truncate::Keep);
      } catch (const Error& e) {  // not a regular file after all: start afresh
        spdlog::warn("checkpoint: not reusing {}: {}", path_, e.what());
        std::error_code ec;
        fs::remove(path_, ec);
      }
    }
    if (!fd_.valid()) fd_ = offload::open_inside(tmp_dir, name_, direct, offload::Truncate::Truncate);
    if (recycled) resize_file(fd_.get(), path_, bytes_);
    offload::preallocate(fd_.get(), path_, bytes_);
  }

  void keep_error(std::exception_ptr e) {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = std::move(e);
  }

  int rank_;
  std::string name_, path_;
  std::size_t arrays_;
  std::vector<StateChunkInfo> chunks_;
  std::vector<std::uint64_t> offsets_, range_offsets_, digests_;
  std::uint64_t bytes_ = 0;
  CheckpointSaveOptions options_;
  UniqueFd fd_;
  std::unique_ptr<offload::IoEngine> io_;
  offload::FileId file_ = -1;
  std::mutex mutex_;
  std::exception_ptr error_;
};

struct SaveDirs {
  std::string parent, dir, tmp_dir;
};

// Step 1 of a save (Note [Atomic checkpoints] in checkpoint/checkpoint.h), collective: rank 0 removes leftovers of
// crashed saves and makes PARENT/.tmp-step-N. A step-N that exists already is an error, never skipped: the
// run's checkpoints would silently stop being written (another run writes into this directory, or
// a run resumed from an older checkpoint of a series that went further).
void make_tmp_dir(Communicator& world, const CheckpointSaveOptions& options, CheckpointRetention& retention,
                  std::int64_t step, SaveDirs* dirs) {
  const std::string name = checkpoint_dir_name(step);
  const std::string tmp_name = ".tmp-" + name;
  const std::string what = fmt::format("checkpoint of step {} into {}", step, options.parent);
  std::exception_ptr error;
  if (world.rank() == 0) {
    try {
      ensure_directory(options.parent, "strata.checkpoint.dir");
      const std::string parent = offload::check_directory(options.parent, "strata.checkpoint.dir");
      retention.remove_leftovers(parent);
      if (fs::exists(fs::path(parent) / name / kCheckpointManifest)) {
        throw ConfigError(fmt::format("checkpoint {}/{} exists already, and this run will not skip or overwrite it: "
                                      "another run writes into {}, or this run resumed from an older checkpoint of "
                                      "a series that went further. Give this run its own strata.checkpoint.dir, or "
                                      "remove the later checkpoints",
                                      parent, name, parent));
      } else if (fs::exists(fs::path(parent) / name)) {
        throw IoError(fmt::format("{}/{} exists but is not a complete checkpoint (no {}); remove it", parent, name,
                                  kCheckpointManifest),
                      EEXIST);
      } else if (::mkdir((fs::path(parent) / tmp_name).c_str(), 0700) != 0) {
        throw IoError(fmt::format("cannot create {}/{}: {}", parent, tmp_name, errno_text(errno)), errno);
      }
    } catch (const std::exception&) {
      error = std::current_exception();
    }
  }
  agree(world, error, what);
  dirs->parent = fs::canonical(options.parent).string();
  dirs->dir = dirs->parent + "/" + name;
  dirs->tmp_dir = dirs->parent + "/" + tmp_name;
}

// Rank 0 collects every rank's file record (an empty record: that rank wrote no file).
nlohmann::json gather_records(Communicator& world, const std::string& record) {
  nlohmann::json files = nlohmann::json::array();
  const int rank = world.rank();
  for (int r = 0; r < world.world_size(); ++r) {
    std::uint64_t len = r == rank ? record.size() : 0;
    world.broadcast_host_bytes(&len, sizeof(len), r);
    if (len == 0) continue;
    std::string buf = r == rank ? record : std::string(len, '\0');
    world.broadcast_host_bytes(buf.data(), len, r);
    if (rank == 0) files.push_back(nlohmann::json::parse(buf));
  }
  return files;
}

// The final steps on rank 0 once every data file is durable: the manifest, the rename of the
// temporary directory into place, `latest`, then the retirement of old checkpoints. Returns the
// error instead of throwing (the ranks agree on it next); the previous checkpoint then stands.
std::exception_ptr publish(const nlohmann::json& manifest, const SaveDirs& dirs, const std::string& name,
                           const CheckpointSaveOptions& options, CheckpointRetention& retention) {
  try {
    write_whole_file(dirs.tmp_dir, kCheckpointManifest, checkpoint_manifest_text(manifest), options);
    fsync_directory(dirs.tmp_dir);
    rename_path(dirs.tmp_dir, dirs.dir);
    fsync_directory(dirs.parent);
  } catch (const std::exception&) {
    std::error_code ec;
    fs::remove_all(dirs.tmp_dir, ec);
    return std::current_exception();
  }
  try {
    // The new checkpoint is complete; `latest` moves to it atomically (a failure removes
    // latest.tmp and leaves `latest` naming the previous one).
    AtomicFileWriter latest(dirs.parent + "/" + kCheckpointLatest, 0600);
    write_checkpoint_bytes(latest.fd(), latest.temp_path(), name + "\n", 0, options);
    latest.commit();
    retention.retire_old(dirs.parent, options.keep, name);
  } catch (const std::exception&) {
    return std::current_exception();
  }
  return nullptr;
}

// Whether this run's ranks hold different groups (tensor ranks, pipeline stages): rank 0 then
// gathers their groups for the manifest.
bool split_groups(const CheckpointTensorParallel& tensor) { return tensor.size > 1 || tensor.staged(); }

// With tensor or pipeline parallelism, rank 0 collects every rank's record of its param groups and
// their checkpoint indices (collective); split_groups_json then makes the manifest's groups of them
// on rank 0.
nlohmann::json gather_split_groups(Communicator& world, ZeroEngine& engine, const CheckpointTensorParallel& tensor) {
  const std::size_t n = engine.groups().size();
  nlohmann::json index = nlohmann::json::array();
  for (std::size_t g = 0; g < n; ++g) index.push_back(tensor.index(g, n));
  const std::string prefix = tensor.size > 1 ? fmt::format("tensor{}/", tensor.rank) : std::string();
  const std::string record =
      nlohmann::json{{"index", index}, {"count", tensor.groups_per_rank(n) * static_cast<std::size_t>(tensor.size)},
                     {"groups", groups_json(engine, prefix)}}
          .dump();
  return gather_records(world, record);
}

// Every group at its index (checkpoint/checkpoint.h), each from the first rank to report it.
nlohmann::json split_groups_json(const nlohmann::json& records) {
  STRATA_CHECK(!records.empty(), "no rank reported param groups");
  std::vector<nlohmann::json> slots(records[0]["count"].get<std::size_t>());
  for (const auto& r : records) {
    for (std::size_t i = 0; i < r["index"].size(); ++i) {
      auto& slot = slots.at(r["index"][i].get<std::size_t>());
      if (slot.is_null()) slot = r["groups"][i];
    }
  }
  nlohmann::json groups = nlohmann::json::array();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    STRATA_CHECK(!slots[i].is_null(), "no rank reported param group {} of {}", i, slots.size());
    groups.push_back(slots[i]);
  }
  return groups;
}

}  // namespace

struct PendingCheckpoint::State {
  ZeroEngine* engine = nullptr;
  std::int64_t step = 0;
  SaveDirs dirs;
  std::shared_ptr<RankFileWriter> writer;
};

PendingCheckpoint::PendingCheckpoint(std::unique_ptr<State> state) : state_(std::move(state)) {}

PendingCheckpoint::~PendingCheckpoint() = default;

std::int64_t PendingCheckpoint::step() const { return state_->step; }

std::unique_ptr<PendingCheckpoint> begin_checkpoint(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                                                    std::int64_t step, const CheckpointSaveOptions& options) {
  std::optional<CheckpointRetention> own;  // without the caller's: removes leftovers, starts no deletion
  CheckpointRetention& retention = options.retention != nullptr ? *options.retention : own.emplace();
  auto state = std::make_unique<PendingCheckpoint::State>();
  state->engine = &engine;
  state->step = step;
  make_tmp_dir(world, options, retention, step, &state->dirs);
  EngineCheckpoint& engine_state = engine.checkpoint();
  if (engine_state.holds_primary_state() && engine.optimizer_offloaded()) {
    state->writer = std::make_shared<RankFileWriter>(engine_state, config, state->dirs.parent, state->dirs.tmp_dir,
                                                     world.rank(), options, retention);
    engine_state.capture_next_step(state->writer->capture_sink());
  }
  return std::unique_ptr<PendingCheckpoint>(new PendingCheckpoint(std::move(state)));
}

CheckpointSaveResult save_checkpoint(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                                     const std::string& model_name, std::int64_t step,
                                     const CheckpointSaveOptions& options, PendingCheckpoint* pending) {
  const auto start = std::chrono::steady_clock::now();
  const int rank = world.rank();
  const std::string name = checkpoint_dir_name(step);
  const std::string what = fmt::format("checkpoint of step {} into {}", step, options.parent);
  CheckpointSaveResult result;
  STRATA_CHECK(pending == nullptr || pending->step() == step, "checkpoint of step {} begun for step {}", step,
               pending ? pending->step() : 0);
  // Without the caller's retention, the save's own deletes what it retires before returning.
  std::optional<CheckpointRetention> own;
  CheckpointRetention& retention = options.retention != nullptr ? *options.retention : own.emplace();

  // 1. Rank 0 makes the temporary directory (after removing leftovers of crashed saves).
  SaveDirs dirs;
  if (pending != nullptr) {
    dirs = pending->state_->dirs;
  } else {
    make_tmp_dir(world, options, retention, step, &dirs);
  }
  result.dir = dirs.dir;

  // 2. Ranks with the first copy of a shard write their file: finished when the step captured it
  //    (Note [Checkpoint capture] in engine/state_home_tiered_state.cc), else copied now.
  std::exception_ptr error;
  std::string record;
  try {
    EngineCheckpoint& state = engine.checkpoint();
    if (state.holds_primary_state()) {
      std::shared_ptr<RankFileWriter> writer;
      if (pending != nullptr) writer = std::move(pending->state_->writer);
      const bool captured = writer != nullptr && state.captured_pieces() == writer->pieces();
      state.capture_next_step(nullptr);  // disarmed by the step already, unless none ran
      if (writer == nullptr) {
        writer = std::make_shared<RankFileWriter>(state, config, dirs.parent, dirs.tmp_dir, rank, options, retention);
      }
      if (!captured) writer->copy(state);
      CheckpointFile file = writer->finish();
      // With tensor or pipeline parallelism, the checkpoint's index of each group (checkpoint/checkpoint.h).
      for (CheckpointRange& r : file.ranges) r.group = options.tensor.index(r.group, engine.groups().size());
      record = file_record_json(file).dump();
    }
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  try {
    agree(world, error, what);
  } catch (...) {
    std::error_code ec;
    if (rank == 0) fs::remove_all(dirs.tmp_dir, ec);
    throw;
  }

  // 3. Rank 0 collects the records, writes the manifest and publishes the checkpoint.
  const nlohmann::json files = gather_records(world, record);
  const nlohmann::json split_records =
      split_groups(options.tensor) ? gather_split_groups(world, engine, options.tensor) : nullptr;
  if (rank == 0) {
    try {
      const nlohmann::json groups = split_groups(options.tensor) ? split_groups_json(split_records) : nullptr;
      for (const auto& f : files) result.bytes += f["bytes"].get<std::uint64_t>();
      nlohmann::json manifest = manifest_json(engine, world, config, model_name, step, files, groups, options.tensor);
      if (!options.data.is_null()) manifest["data"] = options.data;
      error = publish(manifest, dirs, name, options, retention);
    } catch (const std::exception&) {  // the manifest could not be built: nothing was published
      error = std::current_exception();
      std::error_code ec;
      fs::remove_all(dirs.tmp_dir, ec);
    }
  }
  agree(world, error, what);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace strata
