// Fuzzes the checkpoint readers on a real checkpoint saved by a tiny engine run: the manifest
// (read_checkpoint_manifest, then verify_checkpoint and CheckpointReader over the result), the
// `latest` pointer, and the rank data file, where any change must be reported by verify_checkpoint.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "checkpoint/checkpoint.h"
#include "tests/engine/checkpoint_test_util.h"
#include "tests/fuzz/fuzz_util.h"

namespace strata::fuzz {
namespace {

namespace fs = std::filesystem;
namespace tc = testing_checkpoint;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void put(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A checkpoint of a small toy run (two steps, stage 2) under dir/ckpt; returns its directory.
std::string save_seed_checkpoint(const offload::testing::TempDir& dir) {
  testing_toy::ToyShape shape;
  shape.vocab = 8;
  shape.dim = 16;
  shape.layers = 1;
  shape.tokens = 4;
  tc::ToyTrainer t(tc::config(2), shape);
  t.train(0, 2);
  return t.save(dir.sub("ckpt"), 2).dir;
}

// Reads every group's every array through CheckpointReader when verify_checkpoint found nothing wrong.
void read_all(const std::string& ckpt) {
  const std::vector<std::string> problems = verify_checkpoint(ckpt);
  for (const std::string& p : problems) {
    if (p.empty()) throw InsaneResult("verify_checkpoint reported an empty problem");
  }
  if (!problems.empty()) return;
  CheckpointReader reader(read_checkpoint_manifest(ckpt));
  std::uint64_t file_bytes = 0;
  for (const CheckpointFile& f : reader.manifest().files) file_bytes += f.bytes;
  for (std::size_t g = 0; g < reader.manifest().groups.size(); ++g) {
    const std::size_t elems = reader.manifest().groups[g].total_elems;
    if (elems > file_bytes / sizeof(float)) throw InsaneResult("a verified group has more elements than the files");
    std::vector<float> out(elems);
    for (int a = 0; a < reader.manifest().state_arrays; ++a) reader.read(g, a, 0, out);
    (void)reader.files_covering(g, 0, elems);
  }
}

TEST(FuzzCheckpoint, Manifests) {
  offload::testing::TempDir dir;
  const std::string ckpt = save_seed_checkpoint(dir);
  const std::string manifest = ckpt + "/" + kCheckpointManifest;
  const std::vector<std::string> seeds = {slurp(manifest)};
  const FuzzStats s = fuzz_loop("manifest", seeds, mutate_json, [&](const std::string& input) {
    put(manifest, input);
    (void)read_checkpoint_manifest(ckpt);
    read_all(ckpt);
  });
  put(manifest, seeds[0]);
  EXPECT_TRUE(verify_checkpoint(ckpt).empty());
  EXPECT_GT(s.refused, 0u);
}

TEST(FuzzCheckpoint, LatestPointer) {
  offload::testing::TempDir dir;
  const std::string ckpt = save_seed_checkpoint(dir);
  const std::string parent = fs::path(ckpt).parent_path().string();
  const std::vector<std::string> seeds = {slurp(parent + "/" + kCheckpointLatest), "step-2\n", "step-00000002"};
  const FuzzStats s = fuzz_loop(
      "latest", seeds, mutate_bytes,
      [&](const std::string& input) {
        put(parent + "/" + kCheckpointLatest, input);
        (void)read_checkpoint_manifest(parent);
        (void)verify_checkpoint(parent);
        (void)checkpoint_steps_in(parent);
      },
      0.25);
  EXPECT_GT(s.refused, 0u);
}

// Any change to a rank file must be reported by verify_checkpoint; an unchanged one must verify.
TEST(FuzzCheckpoint, RankFiles) {
  offload::testing::TempDir dir;
  const std::string ckpt = save_seed_checkpoint(dir);
  const CheckpointManifest m = read_checkpoint_manifest(ckpt);
  ASSERT_FALSE(m.files.empty());
  const std::string data = ckpt + "/" + m.files[0].name;
  const std::vector<std::string> seeds = {slurp(data)};
  const FuzzStats s = fuzz_loop(
      "rank-file", seeds, mutate_bytes,
      [&](const std::string& input) {
        put(data, input);
        const std::vector<std::string> problems = verify_checkpoint(ckpt);
        if (input != seeds[0] && problems.empty()) throw InsaneResult("a changed rank file passed verification");
        if (input == seeds[0] && !problems.empty()) throw InsaneResult("an intact rank file failed: " + problems[0]);
        if (!problems.empty()) throw FormatError(problems[0]);
        read_all(ckpt);
      },
      0.5);
  put(data, seeds[0]);
  EXPECT_GT(s.refused, 0u);
}

// The manifest and a rank file mutated together (issue 39): since the manifest is sealed (Note
// [Sealed manifest] in checkpoint/checkpoint_format.cc), any edit of any byte of either must be reported
// by verify_checkpoint (`strata ckpt verify`), and the pair as written must verify. The two files
// travel as one input split at a marker; a mutant that destroys the marker is all manifest.
TEST(FuzzCheckpoint, ManifestAndRankFilePair) {
  offload::testing::TempDir dir;
  const std::string ckpt = save_seed_checkpoint(dir);
  const CheckpointManifest m = read_checkpoint_manifest(ckpt);
  ASSERT_FALSE(m.files.empty());
  const std::string manifest = ckpt + "/" + kCheckpointManifest;
  const std::string data = ckpt + "/" + m.files[0].name;
  const std::string marker = "\n--strata-fuzz-split--\n";
  const std::string manifest_seed = slurp(manifest), data_seed = slurp(data);
  const std::vector<std::string> seeds = {manifest_seed + marker + data_seed};
  const FuzzStats s = fuzz_loop(
      "manifest-and-rank-file", seeds, mutate_bytes,
      [&](const std::string& input) {
        const std::size_t at = input.find(marker);
        const std::string manifest_in = at == std::string::npos ? input : input.substr(0, at);
        const std::string data_in = at == std::string::npos ? data_seed : input.substr(at + marker.size());
        put(manifest, manifest_in);
        put(data, data_in);
        const std::vector<std::string> problems = verify_checkpoint(ckpt);
        const bool intact = manifest_in == manifest_seed && data_in == data_seed;
        if (!intact && problems.empty()) throw InsaneResult("an edited manifest or rank file passed verification");
        if (intact && !problems.empty()) throw InsaneResult("an intact checkpoint failed: " + problems[0]);
        if (!problems.empty()) throw FormatError(problems[0]);
      },
      0.5);
  put(manifest, manifest_seed);
  put(data, data_seed);
  EXPECT_TRUE(verify_checkpoint(ckpt).empty());
  EXPECT_GT(s.refused, 0u);
}

// Each single-byte edit of the manifest, at every offset, is caught: the seal covers every byte
// (before it, "optimizer_steps": 4 -> 1 verified and resumed with other weights).
TEST(FuzzCheckpoint, EveryByteOfTheManifestIsSealed) {
  offload::testing::TempDir dir;
  const std::string ckpt = save_seed_checkpoint(dir);
  const std::string manifest = ckpt + "/" + kCheckpointManifest;
  const std::string seed = slurp(manifest);
  ASSERT_TRUE(verify_checkpoint(ckpt).empty());
  std::size_t missed = 0;
  for (std::size_t i = 0; i < seed.size(); ++i) {
    std::string edited = seed;
    edited[i] = static_cast<char>(edited[i] == '1' ? '2' : (edited[i] == ' ' ? '\t' : edited[i] ^ 0x01));
    put(manifest, edited);
    if (verify_checkpoint(ckpt).empty()) {
      ++missed;
      ADD_FAILURE() << "an edit at byte " << i << " ('" << seed[i] << "' -> '" << edited[i] << "') passed";
      if (missed > 5) break;
    }
  }
  put(manifest, seed);
  EXPECT_TRUE(verify_checkpoint(ckpt).empty());
}

}  // namespace
}  // namespace strata::fuzz
