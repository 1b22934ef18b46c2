// A run owns every path it touches (Note [Run paths], train/run_paths.h): each output the user names
// is refused on another path of the run (a swap file or its lock, the checkpoint directory, a step
// directory, `latest`, a token cache, an input, another output), and no output is written through
// a planted symbolic link (Note [No writing through links], core/file_io.h): strata.trace,
// strata.metrics, --summary-json, --save-weights and lock files. Beside each refusal, the case that
// must still work. The checks run as run_training runs them, before any work, without training.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/device/traced_device.h"
#include "core/error.h"
#include "core/run_lock.h"
#include "config/config.h"
#include "train/output_file.h"
#include "train/run_paths.h"
#include "train/trainer.h"

namespace strata::train {
namespace {

namespace fs = std::filesystem;

class RunPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-run-paths-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    old_cwd_ = fs::current_path();
    fs::current_path(dir_);  // strata-run/data, the default token cache, lands here
    fs::create_directories("nv");
    // A checkpoint series as a run leaves it: ck/step-00000002/{manifest.json,rank-00000.bin}, ck/latest.
    fs::create_directories("ck/step-00000002");
    std::ofstream("ck/step-00000002/manifest.json") << "{}";
    std::ofstream("ck/step-00000002/rank-00000.bin") << "state";
    std::ofstream("ck/latest") << "step-00000002\n";
    std::ofstream("corpus.txt") << "some text";
    std::ofstream("init.safetensors") << "weights";
  }
  void TearDown() override {
    fs::current_path(old_cwd_);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // The tiny config with NVMe swap files in nv/ and `extra` merged into its strata section.
  TrainConfig config(const nlohmann::json& extra = nlohmann::json::object()) const {
    nlohmann::json j = {{"train_micro_batch_size_per_gpu", 2},
                        {"zero_optimization",
                         {{"stage", 3}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", dir_ + "/nv"}}}}},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
                        {"strata", {{"model", "tiny"}, {"data", {{"train", "fortunes"}, {"seq_len", 16}}}}}};
    j["strata"].merge_patch(extra);
    std::ofstream(dir_ + "/config.json") << j.dump();
    return load_train_config(dir_ + "/config.json", {});
  }
  TrainOptions options() const {
    TrainOptions o;
    o.config_path = dir_ + "/config.json";
    return o;
  }

  std::string dir_;
  fs::path old_cwd_;
};

// The ConfigError message check_run_outputs gives; "" when it accepts the paths.
std::string refusal(const TrainOptions& o, const TrainConfig& cfg, int world = 1, int rank = 0) {
  try {
    check_run_outputs(o, cfg, rank, world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_REFUSED(message, ...)                                   \
  do {                                                                 \
    const std::string m_ = (message);                                  \
    EXPECT_FALSE(m_.empty()) << "accepted";                            \
    for (const char* part : {__VA_ARGS__}) {                           \
      EXPECT_NE(m_.find(part), std::string::npos) << part << " in: " << m_; \
    }                                                                  \
  } while (0)

TEST_F(RunPathsTest, AnOutputOnAnotherPathOfTheRunIsRefusedNamingBoth) {
  const TrainConfig cfg = config();
  TrainOptions o = options();
  o.save_weights = "nv/strata-swap-rank0.bin";  // was: "wrote 28 tensors", then deleted with the swap files
  EXPECT_REFUSED(refusal(o, cfg), "--save-weights 'nv/strata-swap-rank0.bin' is the swap file of rank 0",
                 "choose another output path");
  o.save_weights = "nv/strata-swap-rank1.bin";  // another rank's
  EXPECT_EQ(refusal(o, cfg, 1), "") << "one rank: there is no rank 1";
  EXPECT_REFUSED(refusal(o, cfg, 2), "the swap file of rank 1");
  o.save_weights = "nv/./strata-swap-rank0.bin.lock";
  EXPECT_REFUSED(refusal(o, cfg), "the lock file of rank 0's swap file");
  o.save_weights = "nv/weights.safetensors";  // beside the swap file: fine
  EXPECT_EQ(refusal(o, cfg), "");

  // strata.metrics on a swap file: was "in use by another run: pid N" with this run's pid.
  EXPECT_REFUSED(refusal(options(), config({{"metrics", "nv/strata-swap-rank0.bin"}})), "strata.metrics",
                 "the swap file of rank 0");

  // The token cache the run reads (the fortunes cache in strata-run/data without a checkpoint dir).
  o.save_weights = "strata-run/data/train.tok";
  fs::create_directories("strata-run/data");
  EXPECT_REFUSED(refusal(o, cfg), "is the token cache");
  // ... and a text file's cache in the checkpoint directory's data/.
  const TrainConfig text = config({{"data", {{"train", dir_ + "/corpus.txt"}}}, {"checkpoint", {{"dir", "ck2"}}}});
  fs::create_directories("ck2/data");
  o.save_weights.clear();
  o.summary_json = "ck2/data/corpus.txt.tok";
  EXPECT_REFUSED(refusal(o, text), "--summary-json 'ck2/data/corpus.txt.tok' is the token cache");
  o.summary_json = "corpus.txt";  // the data itself
  EXPECT_REFUSED(refusal(o, text), "strata.data.train", "a file this command reads");
  o.summary_json = "summary.json";
  EXPECT_EQ(refusal(o, text), "");

  // Two outputs, one file (also through `..`).
  o.summary_json = "out.json";
  TrainConfig traced = config({{"trace", "nv/../out.json"}});
  EXPECT_REFUSED(refusal(o, traced), "are the same file");
  // A stream may take several outputs.
  o.summary_json = "/dev/stdout";
  EXPECT_EQ(refusal(o, config({{"metrics", "/dev/stdout"}})), "");
}

TEST_F(RunPathsTest, AnOutputInsideACheckpointSeriesIsRefused) {
  TrainOptions o = options();
  o.resume = "ck";
  const TrainConfig cfg = config({{"checkpoint", {{"dir", "ck"}}}});
  o.summary_json = "ck/latest";  // was: the pointer overwritten with the summary
  EXPECT_REFUSED(refusal(o, cfg), "--summary-json 'ck/latest' is the `latest` pointer");
  o.summary_json.clear();
  o.save_weights = "ck/step-00000002/rank-00000.bin";  // was: a checkpoint overwritten
  EXPECT_REFUSED(refusal(o, cfg), "inside the checkpoint");
  o.save_weights = "ck/weights.safetensors";
  EXPECT_REFUSED(refusal(o, cfg), "lies inside strata.checkpoint.dir 'ck', which this run owns");
  // Another run's series, not this run's: its `latest` and checkpoints are refused alike.
  const TrainConfig other = config();
  o.resume.clear();
  o.save_weights = "ck/latest";
  EXPECT_REFUSED(refusal(o, other), "the `latest` pointer");
  o.save_weights = "weights.safetensors";
  EXPECT_EQ(refusal(o, other), "");
  // Another run's token cache (it has a record beside it): refused; a .tok file without one is not.
  fs::create_directories("elsewhere");
  std::ofstream("elsewhere/train.tok") << "tokens";
  std::ofstream("elsewhere/plain.tok") << "tokens";
  std::ofstream("elsewhere/train.tok.source") << "{}";
  o.save_weights = "elsewhere/train.tok";
  EXPECT_REFUSED(refusal(o, other), "is a token cache of a run");
  o.save_weights = "elsewhere/plain.tok";
  EXPECT_EQ(refusal(o, other), "");
  // A file the run writes itself must not be one it reads: init weights where the swap file goes.
  fs::rename("init.safetensors", "nv/strata-swap-rank0.bin");
  EXPECT_REFUSED(refusal(options(), config({{"init_weights", "nv/strata-swap-rank0.bin"}})),
                 "would be strata.init_weights 'nv/strata-swap-rank0.bin', which this run reads");
}

// The whole run refuses before any work: no metrics line, the swap file untouched.
TEST_F(RunPathsTest, TrainingRefusesBeforeAnyWork) {
  std::ofstream("nv/strata-swap-rank0.bin") << "another run's swap";
  TrainOptions o = options();
  config({{"metrics", "metrics.jsonl"}, {"device", {{"kind", "sim"}, {"memory", "64MiB"}}}, {"steps", 1}});
  o.save_weights = "nv/strata-swap-rank0.bin";
  o.quiet = true;
  EXPECT_THROW(run_training(o), ConfigError);
  EXPECT_FALSE(fs::exists("metrics.jsonl"));
}

TEST_F(RunPathsTest, NoOutputIsWrittenThroughASymbolicLink) {
  fs::create_symlink("ck/latest", "planted");
  for (const char* key : {"trace", "metrics"}) {
    EXPECT_REFUSED(refusal(options(), config({{key, "planted"}})), "is a symbolic link (to 'ck/latest')",
                   "remove the link");
  }
  TrainOptions o = options();
  o.summary_json = "planted";
  EXPECT_REFUSED(refusal(o, config()), "--summary-json 'planted' is a symbolic link");
  o.summary_json.clear();
  fs::create_symlink(dir_ + "/nowhere", "dangling");  // would create the file it names
  o.save_weights = "dangling";
  EXPECT_REFUSED(refusal(o, config()), "--save-weights 'dangling' is a symbolic link");

  // The writers themselves never follow one (a link planted after the check).
  EXPECT_THROW(OutputFile("planted", "strata.metrics", OutputFile::Mode::Append), IoError);
  EXPECT_THROW(TraceRecorder().write_chrome_trace("planted"), IoError);
  std::ifstream latest("ck/latest");
  std::string line;
  std::getline(latest, line);
  EXPECT_EQ(line, "step-00000002") << "the link's target was written";
  EXPECT_NO_THROW(OutputFile("/dev/stdout", "strata.metrics", OutputFile::Mode::Append)) << "the system's links";
  EXPECT_NO_THROW(TraceRecorder().write_chrome_trace("trace.json"));

  // A lock file that is a link: named as such, not "Too many levels of symbolic links".
  fs::create_symlink("ck/latest", "nv/strata-swap-rank0.bin.lock");
  try {
    RunLock::acquire("nv/strata-swap-rank0.bin", "swap file");
    ADD_FAILURE() << "locked through a link";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("lock file nv/strata-swap-rank0.bin.lock of swap file "
                                         "nv/strata-swap-rank0.bin is a symbolic link"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(RunLock::acquire("nv/other.bin", "swap file"));
}

}  // namespace
}  // namespace strata::train
