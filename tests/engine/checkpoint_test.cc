// Checkpoints of the ZeRO engine (engine/checkpoint.h): a run saved after k steps and loaded into a
// fresh engine — in memory, or with the optimizer and parameters on host memory or NVMe, whatever
// tier wrote it — continues with weights bit-identical to the run that never stopped; saves are
// atomic (an injected ENOSPC/EIO at any file leaves the previous checkpoint and `latest` loadable),
// keep the newest K; flipped bytes, truncated or missing files and manifests of another model or
// config are refused with the file named.
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "core/error.h"
#include "engine/checkpoint.h"
#include "engine/zero_engine.h"
#include "tests/engine/toy_model.h"
#include "tests/offload/offload_test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing_toy::ToyRun;
using testing_toy::ToyShape;

constexpr const char* kModel = "toy";

// Wide enough that a block's weight spans several offload chunks.
ToyShape shape() {
  ToyShape s;
  s.dim = 192;
  s.vocab = 48;
  s.layers = 2;
  s.tokens = 4;
  return s;
}

TrainConfig config(int stage, int accumulation = 2) {
  TrainConfig c = testing_toy::toy_train_config(stage, accumulation);
  c.zero.param_persistence_threshold_elems = 0;
  c.optimizer.lr = 2e-3;
  return c;
}

// One engine on its own sim device, trained step by step.
struct ToyTrainer {
  ToyTrainer(const TrainConfig& c, const ToyShape& s = shape())
      : config(c),
        toy(s),
        device(make_device()),
        comm(make_local_communicator()),
        engine(std::make_unique<ZeroEngine>(config, *device, *comm, testing_toy::toy_groups(s, DType::F32, true),
                                            testing_toy::toy_init)),
        stream(device->create_stream("compute")) {}
  static std::unique_ptr<Device> make_device() {
    SimDeviceOptions o;
    o.capacity_bytes = 64 << 20;
    return make_sim_device(o);
  }
  void train(int from, int to) {
    for (int s = from; s < to; ++s) {
      if (overlap) engine->prepare_step(config.optimizer.lr);
      for (int a = 0; a < config.gradient_accumulation_steps; ++a) {
        engine->begin_micro_batch();
        testing_toy::toy_forward_backward(*engine, *stream, toy, s, a);
        engine->end_micro_batch();
      }
      engine->step(config.optimizer.lr);
    }
    stream->synchronize();
  }
  ToyRun weights() {
    ToyRun r;
    const auto groups = engine->groups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (std::size_t t = 0; t < groups[g].tensors.size(); ++t) r.weights.push_back(engine->gather_master(g, t));
    }
    return r;
  }
  static CheckpointSaveOptions options(const std::string& parent, int keep = 2,
                                       std::function<int(const std::string&)> hook = {},
                                       CheckpointRetention* retention = nullptr) {
    CheckpointSaveOptions o;
    o.parent = parent;
    o.keep = keep;
    o.fault_hook = std::move(hook);
    o.retention = retention;
    return o;
  }
  // Saves as the trainer does: old checkpoints are deleted in the background by `retention`.
  CheckpointSaveResult save(const std::string& parent, std::int64_t step, int keep = 2,
                            std::function<int(const std::string&)> hook = {}, PendingCheckpoint* pending = nullptr) {
    return save_checkpoint(*engine, *comm, config, kModel, step, options(parent, keep, std::move(hook), &retention),
                           pending);
  }
  // Trains up to `step` with the last step captured into a checkpoint begun before it.
  CheckpointSaveResult train_and_capture(const std::string& parent, int from, int step,
                                         std::function<int(const std::string&)> hook = {}) {
    train(from, step - 1);
    auto pending = begin_checkpoint(*engine, *comm, config, step, options(parent, 2, hook, &retention));
    train(step - 1, step);
    captured = engine->captured_pieces();
    return save(parent, step, 2, hook, pending.get());
  }
  CheckpointManifest load(const std::string& dir, const std::string& model = kModel) {
    return load_checkpoint(*engine, *comm, config, model, dir);
  }

  TrainConfig config;
  ToyShape toy;
  std::unique_ptr<Device> device;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<ZeroEngine> engine;
  std::unique_ptr<Stream> stream;
  bool overlap = false;       // announce each step's lr: offloaded updates overlap backward
  std::size_t captured = 0;   // pieces the last train_and_capture step handed out
  CheckpointRetention retention;
};

constexpr int kSteps = 5;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
constexpr int kSaveAt = 2;

ToyRun uninterrupted(const TrainConfig& c) {
  ToyTrainer t(c);
  t.train(0, kSteps);
  return t.weights();
}

const char* tier(OffloadDevice d) {
  return d == OffloadDevice::Nvme ? "nvme" : d == OffloadDevice::Cpu ? "cpu" : "device";
}

struct TierSetup {
  int stage;
  OffloadDevice optimizer;
  OffloadDevice params;
  std::string name() const {
    return "stage " + std::to_string(stage) + " optimizer on " + tier(optimizer) + " params on " + tier(params);
  }
};

class Checkpoint : public ::testing::Test {
 protected:
  TrainConfig with(const TierSetup& s) {
    TrainConfig c = config(s.stage);
    if (s.optimizer != OffloadDevice::None) testing_toy::toy_offload(c, s.optimizer, s.params, dir_.sub("swap"));
    return c;
  }
  bool nvme_ok() { return offload::testing::direct_io_problem(dir_.path()).empty(); }
  offload::testing::TempDir dir_;
};

TEST_F(Checkpoint, ResumeIsBitIdenticalAcrossEveryTier) {
  // Exact mode gives the same bits on every tier, so a checkpoint written from one tier must
  // continue identically when loaded into another.
  const ToyRun reference = uninterrupted(config(0));
  const std::vector<TierSetup> setups = {
      {0, OffloadDevice::None, OffloadDevice::None}, {1, OffloadDevice::None, OffloadDevice::None},
      {2, OffloadDevice::None, OffloadDevice::None}, {3, OffloadDevice::None, OffloadDevice::None},
      {2, OffloadDevice::Cpu, OffloadDevice::None},  {3, OffloadDevice::Cpu, OffloadDevice::Cpu},
      {2, OffloadDevice::Nvme, OffloadDevice::None}, {3, OffloadDevice::Nvme, OffloadDevice::Nvme},
      {3, OffloadDevice::Cpu, OffloadDevice::Nvme},
  };
  const bool nvme = nvme_ok();
  if (!nvme) std::fprintf(stderr, "note: O_DIRECT unavailable here; the NVMe setups are left out\n");
  int pair = 0;
  for (std::size_t i = 0; i < setups.size(); ++i) {
    // Each setup saves once and is loaded into itself and into the next setup of the list.
    for (std::size_t j : {i, (i + 1) % setups.size()}) {
      const TierSetup& from = setups[i];
      const TierSetup& into = setups[j];
      const bool uses_nvme = from.optimizer == OffloadDevice::Nvme || from.params == OffloadDevice::Nvme ||
                             into.optimizer == OffloadDevice::Nvme || into.params == OffloadDevice::Nvme;
      if (uses_nvme && !nvme) continue;
      const std::string what = "saved from " + from.name() + ", loaded into " + into.name();
      const std::string parent = dir_.sub("ckpt" + std::to_string(pair++));
      {
        ToyTrainer first(with(from));
        first.train(0, kSaveAt);
        const CheckpointSaveResult saved = first.save(parent, kSaveAt);
        EXPECT_GT(saved.bytes, 0u) << what;
      }
      ToyTrainer second(with(into));
      const CheckpointManifest m = second.load(parent);
      EXPECT_EQ(m.step, kSaveAt) << what;
      EXPECT_EQ(m.counters.optimizer_steps, kSaveAt) << what;
      second.train(kSaveAt, kSteps);
      EXPECT_EQ(testing_toy::count_weight_differences(second.weights(), reference), 0u) << what;
    }
  }
}

TEST_F(Checkpoint, TheComparisonCanFail) {
  // Loading the checkpoint of step 2 and training as if it were step 1 sees other data.
  const ToyRun reference = uninterrupted(config(3));
  const std::string parent = dir_.sub("ckpt");
  ToyTrainer first(config(3));
  first.train(0, kSaveAt);
  first.save(parent, kSaveAt);
  ToyTrainer second(config(3));
  second.load(parent);
  second.train(kSaveAt - 1, kSteps - 1);
  EXPECT_GT(testing_toy::count_weight_differences(second.weights(), reference), 0u);
  // And a fresh engine that never loaded differs too.
  ToyTrainer fresh(config(3));
  fresh.train(kSaveAt, kSteps);
  EXPECT_GT(testing_toy::count_weight_differences(fresh.weights(), reference), 0u);
}

TEST_F(Checkpoint, LayoutIsAtomicWithLatestAndKeepsTheNewestK) {
  const std::string parent = dir_.sub("ckpt");
  ToyTrainer t(config(2));
  for (int s = 1; s <= 4; ++s) {
    t.train(s - 1, s);
    const CheckpointSaveResult r = t.save(parent, s, /*keep=*/2);
    EXPECT_EQ(fs::path(r.dir).filename().string(), checkpoint_dir_name(s));
  }
  t.retention.wait();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(parent)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  // The retired checkpoints' data file is kept to be overwritten by the next one (Note [Recycled
  // data files]).
  EXPECT_EQ(names, (std::vector<std::string>{".spare-rank-00000.bin", "latest", checkpoint_dir_name(3),
                                             checkpoint_dir_name(4)}));
  EXPECT_EQ(resolve_checkpoint_dir(parent), parent + "/" + checkpoint_dir_name(4));
  EXPECT_TRUE(verify_checkpoint(parent).empty());
  const CheckpointManifest m = read_checkpoint_manifest(parent);
  EXPECT_EQ(m.model, kModel);
  EXPECT_EQ(m.world_size, 1);
  EXPECT_EQ(m.stage, 2);
  EXPECT_EQ(m.state_arrays, 3);
  ASSERT_EQ(m.files.size(), 1u);
  EXPECT_EQ(m.files[0].name, "rank-00000.bin");
  EXPECT_EQ(fs::file_size(m.dir + "/" + m.files[0].name), m.files[0].bytes);
  EXPECT_EQ(fs::status(m.dir + "/" + m.files[0].name).permissions() & fs::perms::others_all, fs::perms::none);
  // Saving the same step again keeps what is there.
  EXPECT_NO_THROW(t.save(parent, 4));
}

TEST_F(Checkpoint, ASaveWithoutARetentionDeletesWhatItRetiresBeforeReturning) {
  const std::string parent = dir_.sub("ckpt");
  ToyTrainer t(config(2));
  for (int s = 1; s <= 3; ++s) {
    t.train(s - 1, s);
    save_checkpoint(*t.engine, *t.comm, t.config, kModel, s, ToyTrainer::options(parent, /*keep=*/1));
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(parent)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    const std::vector<std::string> expected =
        s == 1 ? std::vector<std::string>{"latest", checkpoint_dir_name(1)}
               : std::vector<std::string>{".spare-rank-00000.bin", "latest", checkpoint_dir_name(s)};
    EXPECT_EQ(names, expected) << "after the save of step " << s;
  }
  EXPECT_TRUE(verify_checkpoint(parent).empty());
}

TEST_F(Checkpoint, AFailedSaveLeavesThePreviousCheckpointLoadable) {
  const ToyRun reference = uninterrupted(config(3));
  const std::string parent = dir_.sub("ckpt");
  ToyTrainer t(config(3));
  t.train(0, kSaveAt);
  t.save(parent, kSaveAt);
  t.train(kSaveAt, kSaveAt + 1);
  // Each file a save writes fails once, with ENOSPC or EIO, at its first write.
  for (const char* victim : {"rank-00000.bin", "manifest.json", "latest.tmp"}) {
    for (int err : {ENOSPC, EIO}) {
      const std::string what = std::string(victim) + " failing with " + errno_text(err);
      const auto hook = [&](const std::string& path) { return fs::path(path).filename() == victim ? err : 0; };
      try {
        t.save(parent, kSaveAt + 1, 2, hook);
        ADD_FAILURE() << what << ": the save did not fail";
      } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find(victim), std::string::npos) << what << ": " << e.what();
        EXPECT_EQ(e.errno_value(), err) << what;
      }
      EXPECT_EQ(resolve_checkpoint_dir(parent), parent + "/" + checkpoint_dir_name(kSaveAt)) << what;
      EXPECT_TRUE(verify_checkpoint(parent).empty()) << what;
      for (const auto& e : fs::directory_iterator(parent)) {
        const std::string n = e.path().filename().string();
        EXPECT_EQ(n.find(".tmp"), std::string::npos) << what << ": left " << n << " behind";
      }
      // A complete step directory whose `latest` update failed is a valid checkpoint too; drop it
      // so the next victim's save runs again.
      fs::remove_all(parent + "/" + checkpoint_dir_name(kSaveAt + 1));
    }
  }
  ToyTrainer resumed(config(3));
  resumed.load(parent);
  resumed.train(kSaveAt, kSteps);
  EXPECT_EQ(testing_toy::count_weight_differences(resumed.weights(), reference), 0u);
}

TEST_F(Checkpoint, NvmeStateIsCopiedChunkByChunkIntoAlignedRanges) {
  // Note [Checkpoint copy]: one 4 KiB-aligned range per offload chunk, read ahead through the
  // pinned pool (more chunks than slots, so slots are reused while writes are in flight).
  if (!nvme_ok()) GTEST_SKIP() << "O_DIRECT unavailable in " << dir_.path();
  const TierSetup setup{3, OffloadDevice::Nvme, OffloadDevice::Nvme};
  ToyTrainer t(with(setup));
  t.train(0, kSaveAt);
  const auto chunks = t.engine->state_chunks();
  ASSERT_GT(chunks.size(), 4u) << "the toy should have more chunks than the pool has slots";
  const std::uint64_t read_before = t.engine->tier_stats().nvme_bytes_read;
  const CheckpointSaveResult saved = t.save(dir_.sub("ckpt"), kSaveAt);
  std::uint64_t state_bytes = 0;
  for (const auto& c : chunks) state_bytes += 3 * 4 * c.elems;
  EXPECT_EQ(t.engine->tier_stats().nvme_bytes_read - read_before, state_bytes);
  const CheckpointManifest m = read_checkpoint_manifest(saved.dir);
  EXPECT_EQ(m.format_version, kCheckpointFormatVersion);
  ASSERT_EQ(m.files.size(), 1u);
  ASSERT_EQ(m.files[0].ranges.size(), chunks.size());
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    const CheckpointRange& r = m.files[0].ranges[i];
    EXPECT_EQ(r.file_offset_bytes % 4096, 0u) << "range " << i;
    EXPECT_EQ(r.group, chunks[i].group) << "range " << i;
    EXPECT_EQ(r.elems, chunks[i].elems) << "range " << i;
  }
  EXPECT_EQ(m.files[0].bytes % 4096, 0u);
  EXPECT_TRUE(verify_checkpoint(saved.dir).empty());
}

TEST_F(Checkpoint, ACapturedCheckpointEqualsTheCopiedOne) {
  // Note [Checkpoint capture]: the step writes each chunk's new state into the checkpoint as the
  // optimizer produces it (waiting and overlapped updates, host and NVMe tiers); the files are the
  // bytes a copy after the step writes.
  const bool nvme = nvme_ok();
  for (const OffloadDevice tier : {OffloadDevice::Cpu, OffloadDevice::Nvme}) {
    if (tier == OffloadDevice::Nvme && !nvme) continue;
    for (const bool overlap : {false, true}) {
      const TierSetup setup{3, tier, tier};
      const std::string what = setup.name() + (overlap ? ", overlapped updates" : ", waiting updates");
      const std::string tag = std::to_string(static_cast<int>(tier)) + (overlap ? "o" : "w");
      TrainConfig c = with(setup);
      if (overlap) c.gradient_clipping = 0;  // the update no longer waits for the whole step's norm
      ToyTrainer captured(c);
      captured.overlap = overlap;
      const CheckpointSaveResult a = captured.train_and_capture(dir_.sub("captured" + tag), 0, kSaveAt);
      const std::size_t pieces = captured.engine->state_chunks().size();
      EXPECT_GT(pieces, 4u) << what;
      EXPECT_EQ(captured.captured, pieces) << what;
      EXPECT_EQ(captured.engine->overlapped_chunk_updates() > 0, overlap) << what;
      ToyTrainer copied(c);
      copied.overlap = overlap;
      copied.train(0, kSaveAt);
      const CheckpointSaveResult b = copied.save(dir_.sub("copied" + tag), kSaveAt);
      const CheckpointManifest ma = read_checkpoint_manifest(a.dir), mb = read_checkpoint_manifest(b.dir);
      ASSERT_EQ(ma.files.size(), 1u) << what;
      ASSERT_EQ(mb.files.size(), 1u) << what;
      EXPECT_EQ(ma.json["files"], mb.json["files"]) << what;
      EXPECT_EQ(read_file(a.dir + "/rank-00000.bin"), read_file(b.dir + "/rank-00000.bin")) << what;
      EXPECT_TRUE(verify_checkpoint(a.dir).empty()) << what;
    }
  }
}

TEST_F(Checkpoint, AnArmedCheckpointWithoutItsStepIsCopied) {
  // Begun but no step ran (nothing captured): the save copies the state, as without begin.
  const TierSetup setup{2, OffloadDevice::Cpu, OffloadDevice::None};
  ToyTrainer t(with(setup));
  t.train(0, kSaveAt);
  auto pending = begin_checkpoint(*t.engine, *t.comm, t.config, kSaveAt, ToyTrainer::options(dir_.sub("armed")));
  const CheckpointSaveResult a = t.save(dir_.sub("armed"), kSaveAt, 2, {}, pending.get());
  EXPECT_EQ(t.engine->captured_pieces(), 0u);
  const CheckpointSaveResult b = t.save(dir_.sub("plain"), kSaveAt);
  EXPECT_EQ(read_file(a.dir + "/rank-00000.bin"), read_file(b.dir + "/rank-00000.bin"));
  // And the next step is not captured into the finished checkpoint.
  t.train(kSaveAt, kSaveAt + 1);
  EXPECT_TRUE(verify_checkpoint(a.dir).empty());
}

TEST_F(Checkpoint, AFailedCaptureLetsTheStepFinishAndFailsOnlyTheSave) {
  const ToyRun reference = uninterrupted(config(3));
  const TierSetup setup{3, OffloadDevice::Cpu, OffloadDevice::Cpu};
  const std::string parent = dir_.sub("ckpt");
  ToyTrainer t(with(setup));
  t.train(0, kSaveAt);
  t.save(parent, kSaveAt);
  const auto hook = [](const std::string& path) { return fs::path(path).filename() == "rank-00000.bin" ? EIO : 0; };
  try {
    t.train_and_capture(parent, kSaveAt, kSaveAt + 1, hook);
    ADD_FAILURE() << "the save did not fail";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("rank-00000.bin"), std::string::npos) << e.what();
    EXPECT_EQ(e.errno_value(), EIO);
  }
  EXPECT_EQ(resolve_checkpoint_dir(parent), parent + "/" + checkpoint_dir_name(kSaveAt));
  EXPECT_TRUE(verify_checkpoint(parent).empty());
  // The captured step itself ran to the end: training goes on with the right weights.
  t.train(kSaveAt + 1, kSteps);
  EXPECT_EQ(testing_toy::count_weight_differences(t.weights(), reference), 0u);
}

TEST_F(Checkpoint, ASpareDataFileIsOverwrittenWhateverItHolds) {
  // Note [Recycled data files]: the next checkpoint renames the spare in and rewrites every byte;
  // a spare larger or smaller than needed and full of garbage gives the same checkpoint, and a
  // spare that is a symlink is not followed.
  const ToyRun reference = uninterrupted(config(2));
  const std::string parent = dir_.sub("ckpt");
  const std::string spare = parent + "/.spare-rank-00000.bin";
  const std::string outside = dir_.sub("outside") + "/target.bin";
  std::ofstream(outside) << "keep me";
  ToyTrainer t(config(2));
  t.train(0, 1);
  const std::uint64_t bytes = read_checkpoint_manifest(t.save(parent, 1).dir).files.at(0).bytes;
  for (int step = 2; step <= kSaveAt + 2; ++step) {
    fs::remove(spare);
    if (step == kSaveAt + 2) {
      fs::create_symlink(outside, spare);
    } else {
      std::string garbage(step == 2 ? bytes * 2 + 123457 : bytes / 3, '\0');
      for (std::size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>(i * 131 + 7);
      std::ofstream(spare, std::ios::binary) << garbage;
    }
    t.train(step - 1, step);
    const CheckpointSaveResult r = t.save(parent, step);
    const CheckpointManifest m = read_checkpoint_manifest(r.dir);
    EXPECT_EQ(fs::file_size(r.dir + "/rank-00000.bin"), m.files.at(0).bytes) << "step " << step;
    EXPECT_TRUE(verify_checkpoint(r.dir).empty()) << "step " << step;
    if (step == kSaveAt) {
      ToyTrainer resumed(config(2));
      resumed.load(r.dir);
      resumed.train(kSaveAt, kSteps);
      EXPECT_EQ(testing_toy::count_weight_differences(resumed.weights(), reference), 0u);
    }
  }
  std::ifstream in(outside);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "keep me");
}

TEST_F(Checkpoint, ACorruptSwapFileFailsTheSaveAndKeepsThePrevious) {
  // The swap store's checksums catch a bad chunk on its way into the checkpoint: the save fails
  // naming the swap file, with every read and write in flight drained, and `latest` stays.
  if (!nvme_ok()) GTEST_SKIP() << "O_DIRECT unavailable in " << dir_.path();
  const TierSetup setup{2, OffloadDevice::Nvme, OffloadDevice::None};
  const std::string parent = dir_.sub("ckpt");
  ToyTrainer t(with(setup));
  t.train(0, kSaveAt);
  t.save(parent, kSaveAt);
  t.train(kSaveAt, kSaveAt + 1);
  const std::string swap = dir_.path() + "/swap/strata-swap-rank0.bin";
  ASSERT_TRUE(fs::exists(swap)) << swap;
  {
    std::fstream f(swap, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<std::streamoff>(fs::file_size(swap));
    for (std::streamoff at = 100; at < size; at += 4096) {
      f.seekg(at);
      char c = 0;
      f.get(c);
      f.seekp(at);
      f.put(static_cast<char>(c ^ 0x01));
    }
  }
  try {
    t.save(parent, kSaveAt + 1);
    ADD_FAILURE() << "a save from a corrupt swap file succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(swap), std::string::npos) << e.what();
  }
  EXPECT_EQ(resolve_checkpoint_dir(parent), parent + "/" + checkpoint_dir_name(kSaveAt));
  EXPECT_TRUE(verify_checkpoint(parent).empty());
  for (const auto& e : fs::directory_iterator(parent)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "left " << e.path() << " behind";
  }
}

TEST_F(Checkpoint, FormatVersionOneIsStillRead) {
  // Version 1 kept ranges back to back; rewrite a checkpoint that way and resume from it.
  const ToyRun reference = uninterrupted(config(2));
  const std::string parent = dir_.sub("ckpt");
  std::string dir;
  {
    ToyTrainer first(config(2));
    first.train(0, kSaveAt);
    dir = first.save(parent, kSaveAt).dir;
  }
  const std::string manifest = dir + "/manifest.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(manifest));
  for (auto& f : j["files"]) {
    const std::string path = dir + "/" + f["name"].get<std::string>();
    std::ifstream in(path, std::ios::binary);
    std::string packed;
    for (auto& r : f["ranges"]) {
      std::string bytes(3 * 4 * r["elems"].get<std::size_t>(), '\0');
      in.seekg(static_cast<std::streamoff>(r["file_offset_bytes"].get<std::uint64_t>()));
      in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      r["file_offset_bytes"] = packed.size();
      packed += bytes;
    }
    in.close();
    std::ofstream(path, std::ios::binary | std::ios::trunc) << packed;
    f["bytes"] = packed.size();
  }
  j["format_version"] = 1;
  std::ofstream(manifest, std::ios::trunc) << j.dump(1);
  EXPECT_TRUE(verify_checkpoint(parent).empty());
  ToyTrainer second(config(2));
  second.load(parent);
  second.train(kSaveAt, kSteps);
  EXPECT_EQ(testing_toy::count_weight_differences(second.weights(), reference), 0u);
}

class CheckpointDamage : public Checkpoint {
 protected:
  void SetUp() override {
    parent_ = dir_.sub("ckpt");
    ToyTrainer t(config(2));
    t.train(0, kSaveAt);
    ckpt_ = t.save(parent_, kSaveAt).dir;
    data_ = ckpt_ + "/rank-00000.bin";
    manifest_ = ckpt_ + "/manifest.json";
  }
  // Loading fails with a FormatError whose message names `file`; verify says the same.
  void expect_refused(const std::string& file, const std::string& also = "") {
    ToyTrainer t(config(2));
    try {
      t.load(parent_);
      ADD_FAILURE() << "the damaged checkpoint was loaded";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
      if (!also.empty()) {
        EXPECT_NE(std::string(e.what()).find(also), std::string::npos) << e.what();
      }
    }
    const auto problems = verify_checkpoint(parent_);
    ASSERT_FALSE(problems.empty());
    EXPECT_NE(problems[0].find(file), std::string::npos) << problems[0];
  }
  void edit_manifest(const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(manifest_);
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    std::ofstream(manifest_, std::ios::trunc) << j.dump(1);
  }
  std::string parent_, ckpt_, data_, manifest_;
};

TEST_F(CheckpointDamage, AFlippedByteIsACorruptFile) {
  const auto size = fs::file_size(data_);
  for (std::uintmax_t at : {std::uintmax_t{0}, size / 2, size - 1}) {
    std::fstream f(data_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x10));
    f.close();
    expect_refused(data_, "checksum mismatch");
    std::fstream g(data_, std::ios::in | std::ios::out | std::ios::binary);
    g.seekp(static_cast<std::streamoff>(at));
    g.put(c);
  }
  EXPECT_TRUE(verify_checkpoint(parent_).empty());
}

TEST_F(CheckpointDamage, ATruncatedFileIsRefused) {
  fs::resize_file(data_, fs::file_size(data_) - 4);
  expect_refused(data_, "truncated");
}

TEST_F(CheckpointDamage, AMissingFileIsRefused) {
  fs::remove(data_);
  expect_refused(data_, "missing");
}

TEST_F(CheckpointDamage, ABrokenManifestIsRefused) {
  std::ofstream(manifest_, std::ios::trunc) << "{\"format\": \"strata-checkpoint\", ";
  expect_refused(manifest_, "not valid JSON");
}

TEST_F(CheckpointDamage, AManifestWithoutAFileEntryIsIncomplete) {
  edit_manifest([](nlohmann::json& j) { j["files"] = nlohmann::json::array(); });
  expect_refused(manifest_, "files");
}

TEST_F(CheckpointDamage, AManifestOfAnotherModelOrConfigIsRefusedNamingTheField) {
  {
    ToyTrainer t(config(2));
    try {
      t.load(parent_, "another-model");
      ADD_FAILURE() << "loaded into another model";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(manifest_), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'model'"), std::string::npos) << e.what();
    }
  }
  {
    ToyShape wider = shape();
    wider.dim += 8;
    ToyTrainer t(config(2), wider);
    try {
      t.load(parent_);
      ADD_FAILURE() << "loaded into another shape";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(manifest_), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
    }
  }
  for (const auto& [field, change] : std::vector<std::pair<std::string, std::function<void(TrainConfig&)>>>{
           {"'optimizer'", [](TrainConfig& c) { c.optimizer.type = "SGD"; }},
           {"'seed'", [](TrainConfig& c) { c.strata.seed += 1; }},
       }) {
    TrainConfig c = config(2);
    change(c);
    ToyTrainer t(c);
    try {
      t.load(parent_);
      ADD_FAILURE() << "loaded with another " << field;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
  edit_manifest([](nlohmann::json& j) { j["format_version"] = 99; });
  expect_refused(manifest_, "format_version");
}

TEST_F(Checkpoint, ResolveNamesWhatIsMissing) {
  try {
    resolve_checkpoint_dir(dir_.path());
    ADD_FAILURE() << "an empty directory resolved";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(dir_.path()), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_checkpoint_dir(dir_.path() + "/nowhere"), FormatError);
  std::ofstream(dir_.path() + "/latest") << "../../etc\n";
  EXPECT_THROW(resolve_checkpoint_dir(dir_.path()), FormatError);
}

}  // namespace
}  // namespace strata
