// Inputs are what they claim to be (Note [Token cache identity], train/token_cache.h): a token cache
// is used only while it matches its source and itself as recorded (a text file named `train` does
// not become the fortunes' train.tok; a replaced cache is made again); runs that start at once make
// one cache without racing; a checkpoint records the data it was trained on, and a resume on other
// data is refused unless --allow-new-data. Beside each refusal, the case that must still work.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/token_data.h"
#include "train/token_cache.h"
#include "train/trainer.h"

namespace strata::train {
namespace {

namespace fs = std::filesystem;

class TokenCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-token-cache-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }
  void write(const std::string& name, const std::string& text) const { std::ofstream(file(name)) << text; }
  // The bytes a token file holds as byte tokens, decoded.
  static std::string tokens_text(const std::string& path) {
    const models::TokenFile f = models::TokenFile::open(path);
    std::string s;
    for (std::size_t i = 0; i < f.size(); ++i) s.push_back(static_cast<char>(f[i]));
    return s;
  }

  std::string dir_;
};

TEST_F(TokenCacheTest, ACacheIsUsedOnlyWhileItMatchesItsSourceAndItself) {
  write("a.txt", "first text, long enough to train on");
  const std::string cache = file("data/a.txt.tok");
  text_token_cache(file("a.txt"), "strata.data.train", cache);
  EXPECT_EQ(tokens_text(cache), "first text, long enough to train on");
  EXPECT_TRUE(fs::exists(cache + ".source"));
  const auto made = fs::last_write_time(cache);
  text_token_cache(file("a.txt"), "strata.data.train", cache);
  EXPECT_EQ(fs::last_write_time(cache), made) << "a matching cache is used as it is";

  // The source changed: made again.
  write("a.txt", "other text");
  fs::last_write_time(file("a.txt"), made + std::chrono::seconds(5));
  text_token_cache(file("a.txt"), "strata.data.train", cache);
  EXPECT_EQ(tokens_text(cache), "other text");
  // The cache was replaced: made again from its source.
  models::write_token_file(cache, models::ByteTokenizer::encode("planted data"), 256);
  text_token_cache(file("a.txt"), "strata.data.train", cache);
  EXPECT_EQ(tokens_text(cache), "other text");

  // A text file named `train` makes data/train.tok; the fortunes cache of that name is then made
  // from the corpus again, not served from the text.
  fs::create_directories(file("fortunes"));
  std::string corpus;
  for (int i = 0; i < 20; ++i) corpus += "fortune number " + std::to_string(i) + "\n%\n";
  write("fortunes/f", corpus);
  write("train", "poison");
  text_token_cache(file("train"), "strata.data.train", file("data/train.tok"));
  ASSERT_EQ(tokens_text(file("data/train.tok")), "poison");
  EXPECT_EQ(fortunes_token_cache(file("data"), file("fortunes")), file("data/train.tok"));
  const models::TextCorpus expected = models::load_fortunes(file("fortunes"));
  EXPECT_EQ(tokens_text(file("data/train.tok")), expected.train);
  EXPECT_EQ(tokens_text(file("data/val.tok")), expected.validation);
}

// Ten runs that start at once in one directory: each gets the cache, none fails on another's
// temporary file (before: 7 of 10 failed).
TEST_F(TokenCacheTest, RunsStartingAtOnceMakeOneCache) {
  write("big.txt", std::string(2 << 20, 'x'));
  const std::string cache = file("data/big.txt.tok");
  std::vector<pid_t> children;
  for (int i = 0; i < 10; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        text_token_cache(file("big.txt"), "strata.data.train", cache);
        ::_exit(models::TokenFile::open(cache).size() == (2u << 20) ? 0 : 3);
      } catch (...) {
        ::_exit(2);
      }
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a run failed: status " << status;
  }
  for (const auto& e : fs::directory_iterator(file("data"))) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << "left behind: " << e.path();
  }
}

TEST_F(TokenCacheTest, AResumeOnOtherDataIsRefusedUnlessAllowed) {
  std::vector<std::uint32_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back(static_cast<std::uint32_t>((i * 7) % 256));
  models::write_token_file(file("train.tok"), tokens, 256);
  const nlohmann::json config = {
      {"train_micro_batch_size_per_gpu", 2},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
      {"strata",
       {{"model", "tiny"},
        {"data", {{"train", file("train.tok")}, {"seq_len", 16}}},
        {"device", {{"kind", "sim"}, {"memory", "64MiB"}}},
        {"checkpoint", {{"dir", file("ck")}}}}}};
  std::ofstream(file("config.json")) << config.dump();
  TrainOptions o;
  o.config_path = file("config.json");
  o.quiet = true;
  o.steps = 2;
  ASSERT_EQ(run_training(o).steps, 2);
  std::ifstream in(file("ck/step-00000002/manifest.json"));
  const nlohmann::json manifest = nlohmann::json::parse(in);
  ASSERT_TRUE(manifest.contains("data")) << "the checkpoint records its data";

  o.resume = file("ck");
  o.steps = 3;
  ASSERT_EQ(run_training(o).steps, 3) << "the same data resumes";

  for (auto& t : tokens) t = (t + 1) % 256;  // other data of the same size, at the same path
  models::write_token_file(file("train.tok"), tokens, 256);
  o.steps = 4;
  try {
    run_training(o);
    ADD_FAILURE() << "resumed on other data";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the checkpoint was trained on '" + fs::canonical(file("train.tok")).string()), std::string::npos)
        << m;
    EXPECT_NE(m.find("other data"), std::string::npos) << m;
    EXPECT_NE(m.find("--allow-new-data"), std::string::npos) << m;
  }
  o.allow_new_data = true;
  EXPECT_EQ(run_training(o).steps, 4) << "asked for";

  // A checkpoint of an older Strata records no data: resumed (with a warning).
  EXPECT_NO_THROW(check_resumed_data(nlohmann::json::object(), {{"xxh64", "0"}}, false, "old"));
}

}  // namespace
}  // namespace strata::train
