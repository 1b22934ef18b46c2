// Checkpoints: atomic per-step directories of every rank's optimizer state with a checksummed
// manifest, their verification, and resharding loads (engine/checkpoint.h, Note [Checkpoint format]
// and Note [Atomic checkpoints]).
#include "engine/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "core/error.h"
#include "engine/partition.h"
#include "offload/file.h"
#include "offload/io_engine.h"
#include "offload/swap_store.h"

namespace strata {

static_assert(std::endian::native == std::endian::little, "checkpoint files are little-endian fp32");

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kIoPieceBytes = std::size_t{4} << 20;
// Format version 2 starts every range, and ends every file, at a multiple of this (zeros between).
constexpr std::uint64_t kRangeAlignBytes = 4096;
const char* const kArrayNames[] = {"master", "moment1", "moment2"};

std::string hex64(std::uint64_t v) { return fmt::format("{:016x}", v); }

struct XxhDeleter {
  void operator()(XXH64_state_t* s) const { XXH64_freeState(s); }
};
using XxhState = std::unique_ptr<XXH64_state_t, XxhDeleter>;

XxhState new_xxh64() {
  XxhState s(XXH64_createState());
  STRATA_CHECK(s != nullptr, "XXH64_createState failed");
  XXH64_reset(s.get(), 0);
  return s;
}

// A file's checksum: XXH64 of its segments' checksums (Note [Checkpoint format]).
std::uint64_t file_checksum(const std::vector<std::uint64_t>& segment_sums) {
  return XXH64(segment_sums.data(), segment_sums.size() * sizeof(std::uint64_t), 0);
}

void pwrite_all(int fd, const std::string& path, const void* data, std::size_t bytes, std::uint64_t offset,
                const CheckpointSaveOptions& options) {
  if (options.fault_hook) {
    if (const int err = options.fault_hook(path); err != 0) {
      throw IoError(
          fmt::format("writing checkpoint file {} ({} bytes at offset {}): {}", path, bytes, offset, errno_text(err)),
          err);
    }
  }
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      throw IoError(
          fmt::format("writing checkpoint file {} ({} bytes at offset {}): {}", path, bytes, offset, errno_text(err)),
          err);
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
}

// Reads exactly `bytes`; a short file is a FormatError naming it.
void pread_all(int fd, const std::string& path, void* data, std::size_t bytes, std::uint64_t offset) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw IoError(
          fmt::format("reading checkpoint file {} ({} bytes at offset {}): {}", path, bytes, offset, errno_text(errno)),
          errno);
    }
    if (n == 0) {
      throw FormatError(fmt::format("checkpoint file {} is truncated: no data at offset {} ({} more bytes expected)",
                                    path, offset, bytes));
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
}

void fsync_fd(int fd, const std::string& path) {
  if (::fsync(fd) != 0) throw IoError(fmt::format("fsync of {} failed: {}", path, errno_text(errno)), errno);
}

void fsync_dir(const std::string& dir) {
  offload::UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) throw IoError(fmt::format("cannot open directory {}: {}", dir, errno_text(errno)), errno);
  fsync_fd(fd.get(), dir);
}

void write_whole_file(const std::string& dir, const std::string& name, const std::string& text,
                      const CheckpointSaveOptions& options) {
  offload::UniqueFd fd = offload::open_inside(dir, name, offload::Direct::Off, offload::Truncate::Truncate);
  const std::string path = dir + "/" + name;
  pwrite_all(fd.get(), path, text.data(), text.size(), 0, options);
  fsync_fd(fd.get(), path);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(fmt::format("cannot open {}: {}", path, errno_text(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// All ranks learn whether any failed; a failing rank rethrows its own error, the others say so.
void agree(Communicator& world, const std::exception_ptr& error, const std::string& what) {
  const double failed = world.all_reduce_host(error ? 1.0 : 0.0, ReduceOp::Max);
  if (error) std::rethrow_exception(error);
  if (failed > 0) {
    throw IoError(fmt::format("{} failed on another rank (its message says why)", what), 0);
  }
}

bool parse_step_dir(const std::string& name, std::int64_t* step) {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5) return false;
  const std::string digits = name.substr(5);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  *step = std::stoll(digits);
  return true;
}

std::string latest_name(const std::string& parent) {
  const std::string path = parent + "/" + kCheckpointLatest;
  std::string text = read_text_file(path);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::int64_t step = 0;
  if (!parse_step_dir(text, &step)) {
    throw FormatError(fmt::format("{} should name a checkpoint directory like step-00000120 but holds '{}'", path,
                                  text.substr(0, 64)));
  }
  return text;
}

// Note [Pruning in the background]: removing an old checkpoint (unlinking hundreds of MiB of
// extents: ~0.1 s per 300 MiB here) does not hold up training. Once `latest` names the new
// checkpoint, rank 0 renames the checkpoints beyond `keep` to .old-step-* (one rename each, so
// they stop being checkpoints at once) and a background task deletes them while training goes
// on. A later prune's task first waits for the earlier one; a save leaves .old-* directories to a
// running task and removes them only when none runs (a crash's leftovers); the trainer waits for
// the task at the end of the run (wait_for_checkpoint_cleanup), process exit does too (std::async).
std::mutex g_pruning_mutex;
std::future<void> g_pruning;

void wait_for_pruning() {
  std::lock_guard lock(g_pruning_mutex);
  if (g_pruning.valid()) g_pruning.get();
}

// Whether a deletion task still runs (reaps a finished one).
bool pruning_running() {
  std::lock_guard lock(g_pruning_mutex);
  if (!g_pruning.valid()) return false;
  if (g_pruning.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return true;
  g_pruning.get();
  return false;
}

// Note [Recycled data files]: a new file's blocks are fresh (fallocated, unwritten extents), and
// this disk writes those ~30 % slower than blocks written before (`strata bench ckpt` shows both).
// So a retired checkpoint's data files are not deleted but kept as PARENT/.spare-rank-RRRRR.bin
// (one per rank), and the next checkpoint of that rank renames its spare into its temporary
// directory and overwrites it in place, truncated or extended to the new size; every byte of it is
// written again (ranges and the zeros between them cover the file). A spare costs the disk space
// of one rank file, which the next checkpoint needs anyway.
constexpr const char* kSparePrefix = ".spare-";

// Retires all but the newest `keep` checkpoints (never `keep_name`, nor what `latest` names).
void prune(const std::string& parent, int keep, const std::string& keep_name) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  for (const auto& e : fs::directory_iterator(parent)) {
    std::int64_t step = 0;
    if (e.is_directory() && parse_step_dir(e.path().filename().string(), &step)) {
      found.emplace_back(step, e.path().filename().string());
    }
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<fs::path> doomed;
  for (std::size_t i = static_cast<std::size_t>(std::max(keep, 1)); i < found.size(); ++i) {
    if (found[i].second == keep_name) continue;
    const fs::path old = fs::path(parent) / ("." + std::string("old-") + found[i].second);
    std::error_code ec;
    fs::rename(fs::path(parent) / found[i].second, old, ec);
    if (ec) {
      spdlog::warn("checkpoint: could not retire old {}/{}: {}", parent, found[i].second, ec.message());
      continue;
    }
    doomed.push_back(old);
    // Note [Recycled data files]: each rank's file becomes that rank's spare (unless it has one).
    std::vector<std::string> files;
    for (const auto& f : fs::directory_iterator(old, ec)) files.push_back(f.path().filename().string());
    for (const auto& n : files) {
      const fs::path spare = fs::path(parent) / (kSparePrefix + n);
      if (n.rfind("rank-", 0) != 0 || fs::exists(spare, ec)) continue;
      fs::rename(old / n, spare, ec);
    }
  }
  if (doomed.empty()) return;
  std::lock_guard lock(g_pruning_mutex);
  g_pruning = std::async(std::launch::async, [earlier = std::move(g_pruning), doomed = std::move(doomed)]() mutable {
    if (earlier.valid()) earlier.get();
    for (const auto& d : doomed) {
      std::error_code ec;
      fs::remove_all(d, ec);
      if (ec) spdlog::warn("checkpoint: could not remove {}: {}", d.string(), ec.message());
    }
  });
}

// This rank's data file of a checkpoint: one range per piece the engine hands out (Note
// [Checkpoint copy] in engine/zero_engine_state.cc), each at a 4 KiB boundary, written with
// O_DIRECT (buffered where the file system refuses it) through an I/O engine of its own, either
// copied after the step (copy()) or captured during it (capture_sink(), Note [Checkpoint capture]
// in engine/zero_engine_offload.cc).
class RankFileWriter : public std::enable_shared_from_this<RankFileWriter> {
 public:
  RankFileWriter(ZeroEngine& engine, const TrainConfig& config, const std::string& parent, const std::string& tmp_dir,
                 std::string name, const CheckpointSaveOptions& options)
      : name_(std::move(name)),
        path_(tmp_dir + "/" + name_),
        arrays_(static_cast<std::size_t>(engine.state_arrays())),
        chunks_(engine.state_chunks()),
        fault_hook_(options.fault_hook) {
    std::uint64_t cursor = 0;
    for (const auto& c : chunks_) {
      offsets_.push_back(cursor);
      cursor += (arrays_ * c.elems * sizeof(float) + kRangeAlignBytes - 1) / kRangeAlignBytes * kRangeAlignBytes;
      range_offsets_.push_back(engine.state_range(c.group).offset_elems + c.begin_elems);
    }
    bytes_ = cursor;
    digests_.assign(chunks_.size() * arrays_, 0);
    const offload::Direct direct =
        offload::probe_direct_io(tmp_dir).empty() ? offload::Direct::On : offload::Direct::Off;
    // Note [Recycled data files].
    std::error_code ec;
    fs::rename(fs::path(parent) / (kSparePrefix + name_), path_, ec);
    const bool recycled = !ec;
    if (recycled) {
      try {
        fd_ = offload::open_inside(tmp_dir, name_, direct, offload::Truncate::Keep);
      } catch (const Error& e) {  // not a regular file after all: start afresh
        spdlog::warn("checkpoint: not reusing {}: {}", path_, e.what());
        fs::remove(path_, ec);
      }
    }
    if (!fd_.valid()) fd_ = offload::open_inside(tmp_dir, name_, direct, offload::Truncate::Truncate);
    if (recycled && ::ftruncate(fd_.get(), static_cast<off_t>(bytes_)) != 0) {
      throw IoError(fmt::format("cannot resize {} to {} bytes: {}", path_, bytes_, errno_text(errno)), errno);
    }
    offload::preallocate(fd_.get(), path_, bytes_);
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
  // Hashing before the write held the disk up: `strata bench ckpt` copied its 291 MiB in 0.26 s
  // hashing first, 0.20 s not hashing at all (a probe), 0.22-0.24 s hashing during the write (the
  // data arrives by DMA, cold in the caches).
  offload::IoHandle write(std::size_t i, std::span<const std::byte> padded, offload::IoCallback done) {
    if (fault_hook_) {
      if (const int err = fault_hook_(path_); err != 0) {
        throw IoError(fmt::format("writing checkpoint file {} ({} bytes at offset {}): {}", path_, padded.size(),
                                  offsets_[i], errno_text(err)),
                      err);
      }
    }
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
  void copy(ZeroEngine& engine) {
    engine.export_state([&](std::size_t i, std::span<const std::byte> padded) { return write(i, padded, {}); });
  }

  // For ZeroEngine::capture_next_step: never throws; an error is kept for finish() and the step
  // goes on. The sink keeps the writer alive for as long as the engine holds it.
  ZeroEngine::StateCaptureSink capture_sink() {
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

  // After every write completed: rethrows a kept error, fsyncs, returns the manifest record.
  nlohmann::json finish() {
    {
      std::lock_guard lock(mutex_);
      if (error_) std::rethrow_exception(error_);
    }
    fsync_fd(fd_.get(), path_);
    nlohmann::json jranges = nlohmann::json::array();
    for (std::size_t i = 0; i < chunks_.size(); ++i) {
      nlohmann::json hashes = nlohmann::json::array();
      for (std::size_t a = 0; a < arrays_; ++a) hashes.push_back(hex64(digests_[i * arrays_ + a]));
      jranges.push_back({{"group", chunks_[i].group},
                         {"offset_elems", range_offsets_[i]},
                         {"elems", chunks_[i].elems},
                         {"file_offset_bytes", offsets_[i]},
                         {"xxh64", hashes}});
    }
    return {{"name", name_}, {"bytes", bytes_}, {"xxh64", hex64(file_checksum(digests_))}, {"ranges", jranges}};
  }

 private:
  void keep_error(std::exception_ptr e) {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = std::move(e);
  }

  std::string name_, path_;
  std::size_t arrays_;
  std::vector<ZeroEngine::StateChunkInfo> chunks_;
  std::vector<std::uint64_t> offsets_, range_offsets_, digests_;
  std::uint64_t bytes_ = 0;
  std::function<int(const std::string&)> fault_hook_;
  offload::UniqueFd fd_;
  std::unique_ptr<offload::IoEngine> io_;
  offload::FileId file_ = -1;
  std::mutex mutex_;
  std::exception_ptr error_;
};

// Step 1 of a save (Note [Atomic checkpoints]), collective: rank 0 removes leftovers of crashed
// saves and makes PARENT/.tmp-step-N. Returns false when step-N exists complete already.
struct SaveDirs {
  std::string parent, dir, tmp_dir;
};
bool make_tmp_dir(Communicator& world, const CheckpointSaveOptions& options, std::int64_t step, SaveDirs* dirs) {
  const std::string name = checkpoint_dir_name(step);
  const std::string tmp_name = ".tmp-" + name;
  const std::string what = fmt::format("checkpoint of step {} into {}", step, options.parent);
  std::exception_ptr error;
  double exists = 0;
  if (world.rank() == 0) {
    try {
      std::error_code ec;
      fs::create_directories(options.parent, ec);
      const std::string parent = offload::check_directory(options.parent, "strata.checkpoint.dir");
      const bool pruning = pruning_running();
      for (const auto& e : fs::directory_iterator(parent)) {
        const std::string n = e.path().filename().string();
        if (n.rfind(".tmp-step-", 0) == 0 || (!pruning && n.rfind(".old-step-", 0) == 0) ||
            n == std::string(kCheckpointLatest) + ".tmp") {
          fs::remove_all(e.path());
        }
      }
      if (fs::exists(fs::path(parent) / name / kCheckpointManifest)) {
        exists = 1;
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
  return world.all_reduce_host(exists, ReduceOp::Max) == 0;
}

nlohmann::json manifest_json(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                             const std::string& model_name, std::int64_t step, const nlohmann::json& files) {
  nlohmann::json groups = nlohmann::json::array();
  const auto specs = engine.groups();
  for (std::size_t g = 0; g < specs.size(); ++g) {
    const GroupLayout layout(specs[g], 1);  // tensor offsets do not depend on the shard count
    nlohmann::json tensors = nlohmann::json::array();
    for (std::size_t t = 0; t < specs[g].tensors.size(); ++t) {
      tensors.push_back({{"name", specs[g].tensors[t].name},
                         {"shape", specs[g].tensors[t].shape},
                         {"offset_elems", layout.slots()[t].offset_elems}});
    }
    groups.push_back(
        {{"name", specs[g].name}, {"total_elems", engine.state_range(g).total_elems}, {"tensors", tensors}});
  }
  const EngineCounters counters = engine.counters();
  nlohmann::json scaler = nullptr;
  if (counters.loss_scaler) {
    scaler = {{"scale", counters.loss_scaler->scale},
              {"cur_hysteresis", counters.loss_scaler->cur_hysteresis},
              {"cur_iter", counters.loss_scaler->cur_iter},
              {"last_overflow_iter", counters.loss_scaler->last_overflow_iter}};
  }
  nlohmann::json arrays = nlohmann::json::array();
  for (int a = 0; a < engine.state_arrays(); ++a) arrays.push_back(kArrayNames[a]);
  return {{"format", "strata-checkpoint"},
          {"format_version", kCheckpointFormatVersion},
          {"model", model_name},
          {"step", step},
          {"optimizer_steps", counters.optimizer_steps},
          {"loss_scaler", scaler},
          {"seed", config.strata.seed},
          {"world_size", world.world_size()},
          {"sharding_factor", engine.topology().sharding_factor},
          {"stage", config.zero.stage},
          {"precision", std::string(precision_name(config.precision))},
          {"optimizer", config.optimizer.type},
          {"state_arrays", arrays},
          {"groups", groups},
          {"files", files},
          {"config", config.raw}};
}

}  // namespace

void wait_for_checkpoint_cleanup() { wait_for_pruning(); }

std::string checkpoint_dir_name(std::int64_t step) { return fmt::format("step-{:08}", step); }

struct PendingCheckpoint::State {
  ZeroEngine* engine = nullptr;
  std::int64_t step = 0;
  bool exists = false;
  SaveDirs dirs;
  std::shared_ptr<RankFileWriter> writer;
};

PendingCheckpoint::PendingCheckpoint(std::unique_ptr<State> state) : state_(std::move(state)) {}

PendingCheckpoint::~PendingCheckpoint() = default;

std::int64_t PendingCheckpoint::step() const { return state_->step; }

std::unique_ptr<PendingCheckpoint> begin_checkpoint(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                                                    std::int64_t step, const CheckpointSaveOptions& options) {
  auto state = std::make_unique<PendingCheckpoint::State>();
  state->engine = &engine;
  state->step = step;
  state->exists = !make_tmp_dir(world, options, step, &state->dirs);
  if (!state->exists && engine.holds_primary_state() && engine.optimizer_offloaded()) {
    state->writer = std::make_shared<RankFileWriter>(engine, config, state->dirs.parent, state->dirs.tmp_dir,
                                                     fmt::format("rank-{:05}.bin", world.rank()), options);
    engine.capture_next_step(state->writer->capture_sink());
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

  // 1. Rank 0 makes the temporary directory (after removing leftovers of crashed saves).
  SaveDirs dirs;
  bool fresh = true;
  if (pending != nullptr) {
    dirs = pending->state_->dirs;
    fresh = !pending->state_->exists;
  } else {
    fresh = make_tmp_dir(world, options, step, &dirs);
  }
  result.dir = dirs.dir;
  if (!fresh) {
    if (rank == 0) spdlog::info("checkpoint {} already exists; not written again", result.dir);
    return result;
  }
  const std::string parent = dirs.parent;
  const std::string tmp_dir = dirs.tmp_dir;
  const auto remove_tmp = [&] {
    if (rank != 0) return;
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
  };

  // 2. Ranks with the first copy of a shard write their file: finished when the step captured it
  //    (Note [Checkpoint capture]), else copied now.
  std::exception_ptr error;
  std::string record;
  try {
    if (engine.holds_primary_state()) {
      std::shared_ptr<RankFileWriter> writer;
      if (pending != nullptr) writer = std::move(pending->state_->writer);
      const bool captured = writer != nullptr && engine.captured_pieces() == writer->pieces();
      engine.capture_next_step(nullptr);  // disarmed by the step already, unless none ran
      if (writer == nullptr) {
        writer = std::make_shared<RankFileWriter>(engine, config, parent, tmp_dir, fmt::format("rank-{:05}.bin", rank),
                                                  options);
      }
      if (!captured) writer->copy(engine);
      nlohmann::json r = writer->finish();
      r["rank"] = rank;
      record = r.dump();
    }
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  try {
    agree(world, error, what);
  } catch (...) {
    remove_tmp();
    throw;
  }

  // 3. Rank 0 collects the records, writes the manifest and publishes the checkpoint.
  nlohmann::json files = nlohmann::json::array();
  for (int r = 0; r < world.world_size(); ++r) {
    std::uint64_t len = r == rank ? record.size() : 0;
    world.broadcast_host_bytes(&len, sizeof(len), r);
    if (len == 0) continue;
    std::string buf = r == rank ? record : std::string(len, '\0');
    world.broadcast_host_bytes(buf.data(), len, r);
    if (rank == 0) files.push_back(nlohmann::json::parse(buf));
  }
  if (rank == 0) {
    try {
      for (const auto& f : files) result.bytes += f["bytes"].get<std::uint64_t>();
      const nlohmann::json manifest = manifest_json(engine, world, config, model_name, step, files);
      write_whole_file(tmp_dir, kCheckpointManifest, manifest.dump(1) + "\n", options);
      fsync_dir(tmp_dir);
      if (::rename(tmp_dir.c_str(), result.dir.c_str()) != 0) {
        throw IoError(fmt::format("cannot rename {} to {}: {}", tmp_dir, result.dir, errno_text(errno)), errno);
      }
      fsync_dir(parent);
    } catch (const std::exception&) {
      error = std::current_exception();
      remove_tmp();
    }
    if (!error) {
      try {
        // The new checkpoint is complete; `latest` moves to it atomically.
        const std::string latest_tmp = std::string(kCheckpointLatest) + ".tmp";
        write_whole_file(parent, latest_tmp, name + "\n", options);
        if (::rename((parent + "/" + latest_tmp).c_str(), (parent + "/" + kCheckpointLatest).c_str()) != 0) {
          throw IoError(
              fmt::format("cannot rename {}/{} to {}: {}", parent, latest_tmp, kCheckpointLatest, errno_text(errno)),
              errno);
        }
        fsync_dir(parent);
        prune(parent, options.keep, name);
      } catch (const std::exception&) {
        error = std::current_exception();
        std::error_code ec;
        fs::remove(fs::path(parent) / (std::string(kCheckpointLatest) + ".tmp"), ec);
      }
    }
  }
  agree(world, error, what);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

// ---- Reading ----------------------------------------------------------------------------------

std::string resolve_checkpoint_dir(const std::string& dir) {
  if (fs::exists(fs::path(dir) / kCheckpointManifest)) return dir;
  if (fs::exists(fs::path(dir) / kCheckpointLatest)) {
    const std::string target = (fs::path(dir) / latest_name(dir)).string();
    if (!fs::exists(fs::path(target) / kCheckpointManifest)) {
      throw FormatError(
          fmt::format("{}/{} names {}, which has no {}", dir, kCheckpointLatest, target, kCheckpointManifest));
    }
    return target;
  }
  if (!fs::is_directory(dir)) throw FormatError(fmt::format("checkpoint directory {} does not exist", dir));
  throw FormatError(fmt::format("{} is not a checkpoint: it has neither {} nor a {} file naming one", dir,
                                kCheckpointManifest, kCheckpointLatest));
}

namespace {

// Typed access to manifest fields with errors naming the file and the field.
class ManifestFields {
 public:
  explicit ManifestFields(std::string path) : path_(std::move(path)) {}
  template <typename T>
  T get(const nlohmann::json& j, const std::string& key, const std::string& where) const {
    const std::string field = where.empty() ? key : where + "." + key;
    if (!j.is_object() || !j.contains(key)) throw error(field, "is missing");
    try {
      return j.at(key).get<T>();
    } catch (const nlohmann::json::exception&) {
      throw error(field, fmt::format("has the wrong type ({})", j.at(key).dump().substr(0, 60)));
    }
  }
  FormatError error(const std::string& field, const std::string& text) const {
    return FormatError(fmt::format("checkpoint manifest {}: field '{}' {}", path_, field, text));
  }

 private:
  std::string path_;
};

std::uint64_t parse_hex(const ManifestFields& f, const std::string& text, const std::string& field) {
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos) {
    throw f.error(field, fmt::format("is not a 16-digit hex checksum ('{}')", text.substr(0, 40)));
  }
  return std::stoull(text, nullptr, 16);
}

}  // namespace

CheckpointManifest read_checkpoint_manifest(const std::string& dir_in) {
  CheckpointManifest m;
  m.dir = resolve_checkpoint_dir(dir_in);
  m.path = (fs::path(m.dir) / kCheckpointManifest).string();
  const ManifestFields f(m.path);
  try {
    m.json = nlohmann::json::parse(read_text_file(m.path));
  } catch (const nlohmann::json::parse_error& e) {
    throw FormatError(
        fmt::format("checkpoint manifest {} is not valid JSON ({}); the checkpoint is damaged", m.path, e.what()));
  }
  const nlohmann::json& j = m.json;
  if (f.get<std::string>(j, "format", "") != "strata-checkpoint")
    throw f.error("format", "is not \"strata-checkpoint\"");
  m.format_version = f.get<int>(j, "format_version", "");
  if (m.format_version < 1 || m.format_version > kCheckpointFormatVersion) {
    throw f.error("format_version", fmt::format("is {}; this Strata reads versions 1 to {}", m.format_version,
                                                kCheckpointFormatVersion));
  }
  m.model = f.get<std::string>(j, "model", "");
  m.step = f.get<std::int64_t>(j, "step", "");
  m.counters.optimizer_steps = f.get<std::int64_t>(j, "optimizer_steps", "");
  if (m.step < 0 || m.counters.optimizer_steps < 0 || m.counters.optimizer_steps > m.step) {
    throw f.error("optimizer_steps", fmt::format("{} does not fit step {}", m.counters.optimizer_steps, m.step));
  }
  if (!j.contains("loss_scaler")) throw f.error("loss_scaler", "is missing");
  if (!j["loss_scaler"].is_null()) {
    const auto& s = j["loss_scaler"];
    m.counters.loss_scaler = optim::LossScaler::State{
        f.get<double>(s, "scale", "loss_scaler"), f.get<int>(s, "cur_hysteresis", "loss_scaler"),
        f.get<std::int64_t>(s, "cur_iter", "loss_scaler"), f.get<std::int64_t>(s, "last_overflow_iter", "loss_scaler")};
  }
  m.seed = f.get<std::uint64_t>(j, "seed", "");
  m.world_size = f.get<int>(j, "world_size", "");
  m.sharding_factor = f.get<int>(j, "sharding_factor", "");
  m.stage = f.get<int>(j, "stage", "");
  m.precision = f.get<std::string>(j, "precision", "");
  m.optimizer = f.get<std::string>(j, "optimizer", "");
  m.state_arrays = static_cast<int>(f.get<std::vector<std::string>>(j, "state_arrays", "").size());
  if (m.state_arrays < 1 || m.state_arrays > 3) throw f.error("state_arrays", "must list 1 to 3 arrays");
  if (!j.contains("config")) throw f.error("config", "is missing");
  m.config = j["config"];
  const auto groups = f.get<std::vector<nlohmann::json>>(j, "groups", "");
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string where = fmt::format("groups[{}]", g);
    CheckpointGroup G;
    G.name = f.get<std::string>(groups[g], "name", where);
    G.total_elems = f.get<std::size_t>(groups[g], "total_elems", where);
    const auto tensors = f.get<std::vector<nlohmann::json>>(groups[g], "tensors", where);
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const std::string tw = fmt::format("{}.tensors[{}]", where, t);
      CheckpointTensor T;
      T.name = f.get<std::string>(tensors[t], "name", tw);
      T.shape = f.get<std::vector<std::int64_t>>(tensors[t], "shape", tw);
      T.offset_elems = f.get<std::size_t>(tensors[t], "offset_elems", tw);
      std::size_t n = 1;
      for (auto d : T.shape) n *= static_cast<std::size_t>(std::max<std::int64_t>(d, 0));
      if (T.offset_elems + n > G.total_elems) throw f.error(tw, "lies outside its group's flat buffer");
      G.tensors.push_back(std::move(T));
    }
    m.groups.push_back(std::move(G));
  }
  // Files: each range inside its group, ranges laid out back to back, and the files of the
  // checkpoint covering every group's flat buffer exactly once.
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> cover(m.groups.size());
  const auto files = f.get<std::vector<nlohmann::json>>(j, "files", "");
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string where = fmt::format("files[{}]", i);
    CheckpointFile F;
    F.name = f.get<std::string>(files[i], "name", where);
    if (F.name.empty() || F.name.find('/') != std::string::npos || F.name[0] == '.') {
      throw f.error(where + ".name", fmt::format("'{}' is not a plain file name", F.name));
    }
    F.rank = f.get<int>(files[i], "rank", where);
    F.bytes = f.get<std::uint64_t>(files[i], "bytes", where);
    F.xxh64 = parse_hex(f, f.get<std::string>(files[i], "xxh64", where), where + ".xxh64");
    std::uint64_t cursor = 0;
    const auto ranges = f.get<std::vector<nlohmann::json>>(files[i], "ranges", where);
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      const std::string rw = fmt::format("{}.ranges[{}]", where, r);
      CheckpointRange R;
      R.group = f.get<std::size_t>(ranges[r], "group", rw);
      R.offset_elems = f.get<std::size_t>(ranges[r], "offset_elems", rw);
      R.elems = f.get<std::size_t>(ranges[r], "elems", rw);
      R.file_offset_bytes = f.get<std::uint64_t>(ranges[r], "file_offset_bytes", rw);
      for (const auto& h : f.get<std::vector<std::string>>(ranges[r], "xxh64", rw)) {
        R.xxh64.push_back(parse_hex(f, h, rw + ".xxh64"));
      }
      if (R.group >= m.groups.size() || R.offset_elems + R.elems > m.groups[R.group].total_elems) {
        throw f.error(rw, "lies outside the param groups");
      }
      if (m.format_version >= 2) cursor = (cursor + kRangeAlignBytes - 1) / kRangeAlignBytes * kRangeAlignBytes;
      if (R.file_offset_bytes != cursor || R.xxh64.size() != static_cast<std::size_t>(m.state_arrays)) {
        throw f.error(rw, "does not follow the previous range or lacks a checksum per state array");
      }
      cursor += static_cast<std::uint64_t>(m.state_arrays) * R.elems * sizeof(float);
      cover[R.group].emplace_back(R.offset_elems, R.elems);
      F.ranges.push_back(std::move(R));
    }
    if (m.format_version >= 2) cursor = (cursor + kRangeAlignBytes - 1) / kRangeAlignBytes * kRangeAlignBytes;
    if (cursor != F.bytes) throw f.error(where + ".bytes", fmt::format("is {}, its ranges hold {}", F.bytes, cursor));
    m.files.push_back(std::move(F));
  }
  for (std::size_t g = 0; g < cover.size(); ++g) {
    std::sort(cover[g].begin(), cover[g].end());
    std::size_t at = 0;
    for (const auto& [off, n] : cover[g]) {
      if (off != at) {
        throw f.error("files", fmt::format("do not cover group {} ({}) exactly once: elements from {} are {}; a rank "
                                           "file is missing from the manifest",
                                           g, m.groups[g].name, at, off < at ? "saved twice" : "missing"));
      }
      at += n;
    }
    if (at != m.groups[g].total_elems) {
      throw f.error("files", fmt::format("cover {} of the {} elements of group {} ({})", at, m.groups[g].total_elems, g,
                                         m.groups[g].name));
    }
  }
  return m;
}

CheckpointReader::CheckpointReader(CheckpointManifest manifest) : manifest_(std::move(manifest)) {}

CheckpointReader::~CheckpointReader() {
  for (auto& [name, fd] : fds_) ::close(fd);
}

int CheckpointReader::fd_of(const CheckpointFile& file) {
  if (auto it = fds_.find(file.name); it != fds_.end()) return it->second;
  const std::string path = manifest_.dir + "/" + file.name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) {
      throw FormatError(fmt::format("checkpoint file {} is missing (the manifest lists it with the state of rank {})",
                                    path, file.rank));
    }
    throw IoError(fmt::format("cannot open checkpoint file {}: {}", path, errno_text(e)), e);
  }
  fds_[file.name] = fd;
  return fd;
}

void CheckpointReader::verify_file(const CheckpointFile& file) {
  const std::string path = manifest_.dir + "/" + file.name;
  const int fd = fd_of(file);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw IoError(fmt::format("cannot stat {}: {}", path, errno_text(errno)), errno);
  if (static_cast<std::uint64_t>(st.st_size) != file.bytes) {
    throw FormatError(
        fmt::format("checkpoint file {} has {} bytes, the manifest says {}: it is truncated or was "
                    "overwritten",
                    path, st.st_size, file.bytes));
  }
  std::vector<char> buf(kIoPieceBytes);
  std::vector<std::uint64_t> digests;
  for (const CheckpointRange& r : file.ranges) {
    for (std::size_t a = 0; a < r.xxh64.size(); ++a) {
      XxhState s = new_xxh64();
      const std::uint64_t begin = r.file_offset_bytes + a * r.elems * sizeof(float);
      for (std::uint64_t done = 0; done < r.elems * sizeof(float);) {
        const std::size_t n =
            static_cast<std::size_t>(std::min<std::uint64_t>(kIoPieceBytes, r.elems * sizeof(float) - done));
        pread_all(fd, path, buf.data(), n, begin + done);
        XXH64_update(s.get(), buf.data(), n);
        done += n;
      }
      const std::uint64_t got = XXH64_digest(s.get());
      if (got != r.xxh64[a]) {
        throw FormatError(
            fmt::format("checkpoint file {}: checksum mismatch in group {} ({}) {} (bytes {}..{}): "
                        "xxh64 {} , the manifest says {}; the file is corrupt",
                        path, r.group, manifest_.groups[r.group].name, kArrayNames[a], begin,
                        begin + r.elems * sizeof(float), hex64(got), hex64(r.xxh64[a])));
      }
      digests.push_back(got);
    }
  }
  if (file_checksum(digests) != file.xxh64) {
    throw FormatError(fmt::format("checkpoint file {}: file checksum {} differs from the manifest's {}", path,
                                  hex64(file_checksum(digests)), hex64(file.xxh64)));
  }
}

std::vector<const CheckpointFile*> CheckpointReader::files_covering(std::size_t group, std::size_t offset_elems,
                                                                    std::size_t elems) const {
  std::vector<const CheckpointFile*> out;
  for (const CheckpointFile& f : manifest_.files) {
    for (const CheckpointRange& r : f.ranges) {
      if (r.group == group && r.offset_elems < offset_elems + elems && offset_elems < r.offset_elems + r.elems) {
        out.push_back(&f);
        break;
      }
    }
  }
  return out;
}

void CheckpointReader::read(std::size_t group, int array, std::size_t offset_elems, std::span<float> out) {
  STRATA_CHECK(array >= 0 && array < manifest_.state_arrays, "state array {} of {}", array, manifest_.state_arrays);
  std::fill(out.begin(), out.end(), 0.0f);
  const std::size_t end = offset_elems + out.size();
  for (const CheckpointFile& f : manifest_.files) {
    for (const CheckpointRange& r : f.ranges) {
      if (r.group != group) continue;
      const std::size_t x0 = std::max(offset_elems, r.offset_elems);
      const std::size_t x1 = std::min(end, r.offset_elems + r.elems);
      if (x0 >= x1) continue;
      const std::uint64_t at =
          r.file_offset_bytes + (static_cast<std::uint64_t>(array) * r.elems + (x0 - r.offset_elems)) * sizeof(float);
      pread_all(fd_of(f), manifest_.dir + "/" + f.name, out.data() + (x0 - offset_elems), (x1 - x0) * sizeof(float),
                at);
    }
  }
}

std::vector<std::string> verify_checkpoint(const std::string& dir) {
  std::vector<std::string> problems;
  CheckpointManifest m;
  try {
    m = read_checkpoint_manifest(dir);
  } catch (const Error& e) {
    problems.emplace_back(e.what());
    return problems;
  }
  CheckpointReader reader(m);
  for (const CheckpointFile& f : reader.manifest().files) {
    try {
      reader.verify_file(f);
    } catch (const Error& e) {
      problems.emplace_back(e.what());
    }
  }
  return problems;
}

// ---- Loading into an engine -------------------------------------------------------------------

namespace {

void check_compatible(const CheckpointManifest& m, ZeroEngine& engine, const TrainConfig& config,
                      const std::string& model_name) {
  const ManifestFields f(m.path);
  const auto mismatch = [&](const std::string& field, const std::string& saved, const std::string& ours) {
    return f.error(field, fmt::format("is {}, but this run has {}; resume with the config the checkpoint was written "
                                      "with, or start the run afresh",
                                      saved, ours));
  };
  if (m.model != model_name) throw mismatch("model", m.model, model_name);
  const auto specs = engine.groups();
  if (m.groups.size() != specs.size()) {
    throw mismatch("groups", fmt::format("{} param groups", m.groups.size()), fmt::format("{}", specs.size()));
  }
  for (std::size_t g = 0; g < specs.size(); ++g) {
    const CheckpointGroup& G = m.groups[g];
    const std::string where = fmt::format("groups[{}]", g);
    if (G.name != specs[g].name) throw mismatch(where + ".name", G.name, specs[g].name);
    if (G.tensors.size() != specs[g].tensors.size()) {
      throw mismatch(where + ".tensors", fmt::format("{} tensors", G.tensors.size()),
                     fmt::format("{}", specs[g].tensors.size()));
    }
    const GroupLayout layout(specs[g], 1);
    for (std::size_t t = 0; t < G.tensors.size(); ++t) {
      const std::string tw = fmt::format("{}.tensors[{}]", where, t);
      const ParamTensorSpec& s = specs[g].tensors[t];
      if (G.tensors[t].name != s.name) throw mismatch(tw + ".name", G.tensors[t].name, s.name);
      if (G.tensors[t].shape != s.shape) {
        throw mismatch(tw + ".shape", nlohmann::json(G.tensors[t].shape).dump(), nlohmann::json(s.shape).dump());
      }
      if (G.tensors[t].offset_elems != layout.slots()[t].offset_elems) {
        throw mismatch(tw + ".offset_elems", std::to_string(G.tensors[t].offset_elems),
                       std::to_string(layout.slots()[t].offset_elems));
      }
    }
  }
  if (m.state_arrays != engine.state_arrays() || m.optimizer != config.optimizer.type) {
    throw mismatch("optimizer", m.optimizer, config.optimizer.type);
  }
  if (m.precision != precision_name(config.precision)) {
    throw mismatch("precision", m.precision, std::string(precision_name(config.precision)));
  }
  if (m.counters.loss_scaler.has_value() != engine.counters().loss_scaler.has_value()) {
    throw mismatch("loss_scaler", m.counters.loss_scaler ? "set" : "null",
                   engine.counters().loss_scaler ? "a loss scaler" : "none");
  }
  if (m.seed != config.strata.seed) throw mismatch("seed", std::to_string(m.seed), std::to_string(config.strata.seed));
  // The data must be the same to continue the same run; other settings may change (with a note).
  const nlohmann::json saved_data =
      m.config.is_object() && m.config.contains("strata") && m.config["strata"].is_object()
          ? m.config["strata"].value("data", nlohmann::json())
          : nlohmann::json();
  const nlohmann::json our_data =
      config.raw.is_object() && config.raw.contains("strata") && config.raw["strata"].is_object()
          ? config.raw["strata"].value("data", nlohmann::json())
          : nlohmann::json();
  if (saved_data != our_data) throw mismatch("config.strata.data", saved_data.dump(), our_data.dump());
  std::vector<std::string> changed;
  for (const auto& op : nlohmann::json::diff(m.config, config.raw)) {
    const std::string path = op.value("path", "");
    const auto allowed = {"/strata/steps", "/strata/checkpoint", "/strata/metrics", "/strata/trace"};
    if (std::none_of(allowed.begin(), allowed.end(), [&](const char* p) { return path.rfind(p, 0) == 0; })) {
      changed.push_back(path);
    }
  }
  if (!changed.empty()) {
    spdlog::warn(
        "resuming {} with config changes ({}); the run matches the original only where they leave the "
        "math alone (same units per step: engine/zero_engine.h, Note [Exact gradient sums])",
        m.dir, fmt::join(changed, ", "));
  }
}

}  // namespace

CheckpointManifest load_checkpoint(ZeroEngine& engine, Communicator& world, const TrainConfig& config,
                                   const std::string& model_name, const std::string& dir) {
  std::exception_ptr error;
  CheckpointManifest m;
  std::unique_ptr<CheckpointReader> reader;
  try {
    m = read_checkpoint_manifest(dir);
    check_compatible(m, engine, config, model_name);
    reader = std::make_unique<CheckpointReader>(m);
    std::set<std::string> verified;
    for (std::size_t g = 0; g < engine.groups().size(); ++g) {
      const StateRange r = engine.state_range(g);
      for (const CheckpointFile* f : reader->files_covering(g, r.offset_elems, r.elems)) {
        if (verified.insert(f->name).second) reader->verify_file(*f);
      }
    }
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  const double failed = world.all_reduce_host(error ? 1.0 : 0.0, ReduceOp::Max);
  if (error) std::rethrow_exception(error);
  if (failed > 0) {
    throw FormatError(fmt::format("loading checkpoint {} failed on another rank (its message says why)", dir));
  }
  std::vector<StateRange> ranges;
  for (std::size_t g = 0; g < engine.groups().size(); ++g) ranges.push_back(engine.state_range(g));
  engine.import_state([&](std::size_t g, int a, std::size_t begin, std::span<float> out) {
    reader->read(g, a, ranges[g].offset_elems + begin, out);
  });
  engine.restore_counters(m.counters);
  return m;
}

}  // namespace strata
