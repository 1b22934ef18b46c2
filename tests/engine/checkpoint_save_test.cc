// Saving checkpoints of the ZeRO engine (checkpoint/checkpoint.h): the on-disk layout (step
// directories, `latest`, the newest K kept, retired data files recycled as spares), atomic saves
// (an injected ENOSPC/EIO at any file, or a corrupt swap file, leaves the previous checkpoint and
// `latest` loadable), NVMe state copied chunk by chunk into aligned ranges, and a checkpoint
// captured during the step equal to one copied after it. Loading, resuming and refusing damaged
// checkpoints: checkpoint_load_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "checkpoint/checkpoint.h"
#include "tests/engine/checkpoint_test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing_checkpoint::Checkpoint;
using testing_checkpoint::config;
using testing_checkpoint::kModel;
using testing_checkpoint::kSaveAt;
using testing_checkpoint::kSteps;
using testing_checkpoint::read_file;
using testing_checkpoint::TierSetup;
using testing_checkpoint::ToyRun;
using testing_checkpoint::ToyTrainer;
using testing_checkpoint::uninterrupted;

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
  // Saving the same step again is refused (never silently skipped), and what is there stays.
  try {
    t.save(parent, 4);
    ADD_FAILURE() << "a second save of step 4 passed";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(checkpoint_dir_name(4) + " exists already"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(verify_checkpoint(parent).empty());
  EXPECT_EQ(resolve_checkpoint_dir(parent), parent + "/" + checkpoint_dir_name(4));
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
  // See Note [Checkpoint copy] in engine/zero_engine_state.cc.
  // One 4 KiB-aligned range per offload chunk, read ahead through the
  // pinned pool (more chunks than slots, so slots are reused while writes are in flight).
  if (!nvme_ok()) GTEST_SKIP() << "O_DIRECT unavailable in " << dir_.path();
  const TierSetup setup{3, OffloadDevice::Nvme, OffloadDevice::Nvme};
  ToyTrainer t(with(setup));
  t.train(0, kSaveAt);
  const auto chunks = t.engine->checkpoint().state_chunks();
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
  // See Note [Checkpoint capture] in engine/state_home_tiered_state.cc.
  // The step writes each chunk's new state into the checkpoint as the
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
      const std::size_t pieces = captured.engine->checkpoint().state_chunks().size();
      EXPECT_GT(pieces, 4u) << what;
      EXPECT_EQ(captured.captured, pieces) << what;
      EXPECT_EQ(captured.engine->overlapped_chunk_updates() > 0, overlap) << what;
      // Alive beside `captured`, so on its own swap files (Note [Run locks] in core/run_lock.h).
      TrainConfig c2 = c;
      testing_toy::toy_offload(c2, tier, tier, dir_.sub("swap-copied" + tag));
      ToyTrainer copied(c2);
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
  EXPECT_EQ(t.engine->checkpoint().captured_pieces(), 0u);
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
  // See Note [Recycled data files] in checkpoint/checkpoint_retention.cc.
  // The next checkpoint renames the spare in and rewrites every byte;
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

}  // namespace
}  // namespace strata
