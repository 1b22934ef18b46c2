// `strata train` and `strata ckpt export` under hostile use, in-process: a run that trains nothing
// fails (non-finite init weights, too many skipped steps in a row); every write of the run's text
// outputs is checked (a full disk, /dev/full, fails the run naming the path) and every output path
// is checked before any work; no output may be an input (the config, a checkpoint's files). A token
// file's loss mask is applied: the step's loss is the mean over its counted targets, and a file
// whose every target is masked leaves the weights as they were.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/decoder.h"
#include "models/model_config.h"
#include "models/resident_provider.h"
#include "models/safetensors.h"
#include "models/token_data.h"
#include "models/weights_io.h"
#include "cli/commands.h"
#include "train/trainer.h"

namespace strata::train {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/strata-train-trust-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The tiny model for a few steps, its data cached in the temporary directory; each run gets its own
// checkpoint directory (where the data cache lives too), so no run meets another's checkpoints.
nlohmann::json tiny_config(const TempDir& dir, int steps) {
  static int runs = 0;
  const std::string ck = dir.file("ck" + std::to_string(runs++));
  return {{"train_micro_batch_size_per_gpu", 2},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}}}}},
          {"strata",
           {{"model", "tiny"},
            {"data", {{"train", "fortunes"}, {"seq_len", 16}}},
            {"device", {{"kind", "sim"}, {"memory", "64MiB"}}},
            {"steps", steps},
            {"checkpoint", {{"dir", ck}}}}}};
}

TrainOptions options_for(const TempDir& dir, const nlohmann::json& config) {
  std::ofstream(dir.file("config.json")) << config.dump(2);
  TrainOptions o;
  o.config_path = dir.file("config.json");
  o.quiet = true;
  return o;
}

// The message of the strata::Error subclass E that `f` throws; fails the test when it throws none.
template <typename E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

int run_strata(std::vector<std::string> args) {
  args.insert(args.begin(), "strata");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  CLI::App app;
  app.require_subcommand(1);
  bench::CommandTable table;
  cli::register_commands(app, table);
  app.parse(static_cast<int>(argv.size()), argv.data());
  return cli::run_selected(app, table, "off");
}

TEST(TrainTrust, NonFiniteInitWeightsAreRefusedNamingTensorAndElement) {
  TempDir dir;
  TrainOptions o = options_for(dir, tiny_config(dir, 0));
  o.save_weights = dir.file("init.safetensors");
  run_training(o);
  // The saved initial weights with element 5 of the second tensor made NaN.
  const models::SafetensorsFile good = models::SafetensorsFile::open(dir.file("init.safetensors"));
  std::vector<std::vector<float>> values;
  std::vector<models::SafetensorsTensorOut> out;
  for (const auto& e : good.tensors()) {
    values.emplace_back(static_cast<std::size_t>(e.elems()));
    good.read(e, DType::F32, values.back().data());
  }
  ASSERT_GE(values.size(), 2u);
  values[1][5] = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t i = 0; i < values.size(); ++i) {
    out.push_back({good.tensors()[i].name, DType::F32, good.tensors()[i].shape, values[i].data()});
  }
  models::write_safetensors(dir.file("nan.safetensors"), out);

  nlohmann::json config = tiny_config(dir, 2);
  config["strata"]["init_weights"] = dir.file("nan.safetensors");
  const TrainOptions bad = options_for(dir, config);
  const std::string what = error_of<FormatError>([&] { run_training(bad); });
  EXPECT_NE(what.find(dir.file("nan.safetensors")), std::string::npos) << what;
  EXPECT_NE(what.find("tensor '" + good.tensors()[1].name + "' element 5 "), std::string::npos) << what;
  EXPECT_NE(what.find("nan"), std::string::npos) << what;
}

// A prompt/completion token file as `strata data prepare` writes it (byte tokens, vocabulary 256):
// documents of a prompt (masked) and a completion, every 7th prompt longer than a 16-token window,
// so some windows have no counted target; `all_masked` masks every token.
void write_masked_tokens(const std::string& path, bool all_masked) {
  std::vector<std::uint32_t> tokens;
  std::vector<std::uint8_t> mask;
  std::uint64_t x = 12345;
  const auto next = [&x] { return x = x * 6364136223846793005ull + 1442695040888963407ull, x >> 33; };
  for (int d = 0; d < 200; ++d) {
    const std::uint64_t prompt = d % 7 == 3 ? 40 : 2 + next() % 12, completion = 2 + next() % 10;
    for (std::uint64_t i = 0; i < prompt + completion; ++i) {
      tokens.push_back(static_cast<std::uint32_t>(next() % 256));
      mask.push_back(!all_masked && i >= prompt ? 1 : 0);
    }
  }
  models::TokenFileMeta meta;
  meta.vocab_size = 256;
  meta.loss_mask = mask;
  models::write_token_file(path, tokens, meta);
}

// A masked step's loss is the mean over the targets counted in the whole step,
// here 4 micro-batches of one window each, as the decoder computes it over the same 4 windows from
// the same weights (transformers' loss with labels -100 over one batch; sft_reference checks that
// against transformers itself). The mean of the micro-batches' own means is another figure.
TEST(TrainTrust, AMaskedStepsLossIsTheMeanOverItsCountedTargets) {
  TempDir dir;
  write_masked_tokens(dir.file("sft.tok"), false);
  nlohmann::json config = tiny_config(dir, 0);
  config["strata"]["seed"] = 77;
  TrainOptions init = options_for(dir, config);
  init.save_weights = dir.file("init.safetensors");
  run_training(init);

  config = tiny_config(dir, 1);
  config["strata"]["exact"] = true;
  config["strata"]["seed"] = 77;
  config["strata"]["data"]["train"] = dir.file("sft.tok");
  config["strata"]["init_weights"] = dir.file("init.safetensors");
  config["train_micro_batch_size_per_gpu"] = 1;
  config["gradient_accumulation_steps"] = 4;
  const TrainSummary summary = run_training(options_for(dir, config));

  const models::ModelConfig model = models::model_config_by_name("tiny");
  models::Decoder decoder(model, {});
  models::ResidentParamProvider params(decoder.param_groups(), nullptr);
  models::load_weights(dir.file("init.safetensors"), model, params, nullptr);
  const models::TokenFile data = models::TokenFile::open(dir.file("sft.tok"));
  const std::int64_t seq = 16;
  models::BatchSampler sampler(data, 1, seq, 77);
  models::LossSum step;
  double mean_of_means = 0;
  for (int unit = 0; unit < 4; ++unit) {
    std::vector<std::int32_t> in(seq), tg(seq);
    sampler.next(in.data(), tg.data());
    const models::LossSum l = decoder.forward_loss({}, params, in.data(), tg.data(), 1, seq);
    step.sum += l.sum;
    step.tokens += l.tokens;
    mean_of_means += l.mean() / 4;
  }
  ASSERT_GT(step.tokens, 0);
  ASSERT_LT(step.tokens, 4 * seq) << "the windows must have masked targets";
  EXPECT_NEAR(summary.first_loss, step.mean(), 1e-6 * step.mean());
  EXPECT_GT(std::abs(mean_of_means - step.mean()), 20e-6 * step.mean())
      << "the mean of the micro-batches' means is within 20x the tolerance: the check cannot tell them apart";
}

// A file whose every target is masked trains nothing: each step's loss is 0 (not NaN: no target
// counted), no gradient reaches the weights, and without weight decay they stay bit for bit the
// initial ones.
TEST(TrainTrust, AFileWithEveryTargetMaskedLeavesTheWeightsAsTheyWere) {
  TempDir dir;
  write_masked_tokens(dir.file("masked.tok"), true);
  TrainOptions init = options_for(dir, tiny_config(dir, 0));
  init.save_weights = dir.file("init.safetensors");
  run_training(init);

  nlohmann::json config = tiny_config(dir, 3);
  config["strata"]["data"]["train"] = dir.file("masked.tok");
  config["strata"]["init_weights"] = dir.file("init.safetensors");
  config["optimizer"]["params"]["weight_decay"] = 0;
  TrainOptions o = options_for(dir, config);
  o.save_weights = dir.file("trained.safetensors");
  const TrainSummary summary = run_training(o);
  EXPECT_EQ(summary.first_loss, 0.0);
  EXPECT_EQ(summary.last_loss, 0.0);
  EXPECT_EQ(summary.steps, 3);
  const models::SafetensorsFile before = models::SafetensorsFile::open(dir.file("init.safetensors"));
  const models::SafetensorsFile after = models::SafetensorsFile::open(dir.file("trained.safetensors"));
  ASSERT_EQ(before.tensors().size(), after.tensors().size());
  for (std::size_t i = 0; i < before.tensors().size(); ++i) {
    const auto& e = before.tensors()[i];
    ASSERT_EQ(e.name, after.tensors()[i].name);
    std::vector<float> a(static_cast<std::size_t>(e.elems())), b(a.size());
    before.read(e, DType::F32, a.data());
    after.read(after.tensors()[i], DType::F32, b.data());
    EXPECT_EQ(a, b) << e.name << " changed although every target is masked";
  }
}

// strata.init_weights of another shape: a file of a 4-layer model into the 2-layer tiny model (its
// blocks 2 and 3 were dropped) and the reverse (blocks 2 and 3 missing) are refused naming the
// tensors; the tiny model's own file still initializes it.
TEST(TrainTrust, InitWeightsOfAnotherModelAreRefusedNamingTheTensors) {
  TempDir dir;
  nlohmann::json deep = tiny_config(dir, 0);
  deep["strata"]["model"] = {{"name", "tiny4"}, {"arch", "gpt2"}, {"vocab_size", 256}, {"max_seq_len", 64},
                             {"n_layers", 4}, {"d_model", 32}, {"n_heads", 4}, {"ffn_hidden", 128}};
  TrainOptions save_deep = options_for(dir, deep);
  save_deep.save_weights = dir.file("deep.safetensors");
  run_training(save_deep);
  TrainOptions save_tiny = options_for(dir, tiny_config(dir, 0));
  save_tiny.save_weights = dir.file("tiny.safetensors");
  run_training(save_tiny);

  nlohmann::json into_tiny = tiny_config(dir, 1);
  into_tiny["strata"]["init_weights"] = dir.file("deep.safetensors");
  const TrainOptions o = options_for(dir, into_tiny);
  const std::string extra = error_of<FormatError>([&] { run_training(o); });
  EXPECT_NE(extra.find("model 'tiny' does not have ('blocks.2."), std::string::npos) << extra;
  EXPECT_NE(extra.find("would be dropped"), std::string::npos) << extra;

  deep["strata"]["steps"] = 1;
  deep["strata"]["init_weights"] = dir.file("tiny.safetensors");
  const TrainOptions d = options_for(dir, deep);
  const std::string missing = error_of<FormatError>([&] { run_training(d); });
  EXPECT_NE(missing.find("lacks"), std::string::npos) << missing;
  EXPECT_NE(missing.find("'blocks.2."), std::string::npos) << missing;

  into_tiny["strata"]["init_weights"] = dir.file("tiny.safetensors");
  EXPECT_EQ(run_training(options_for(dir, into_tiny)).steps, 1) << "the model's own weights";
}

// strata.metrics holds one run's lines: a fresh run finding an earlier run's lines keeps them as
// PATH.1 and starts anew (steps 1,2,1,2 in one file told nothing apart); a resume appends after a
// marker line naming the step and the checkpoint.
TEST(TrainTrust, MetricsOfEachRunAreToldApart) {
  TempDir dir;
  nlohmann::json config = tiny_config(dir, 2);
  config["strata"]["metrics"] = dir.file("m.jsonl");
  config["strata"]["checkpoint"]["dir"] = dir.file("ck-metrics");
  run_training(options_for(dir, config));
  const std::string first = file_text(dir.file("m.jsonl"));
  ASSERT_EQ(std::count(first.begin(), first.end(), '\n'), 2);
  config["strata"]["checkpoint"]["dir"] = dir.file("ck-metrics2");
  run_training(options_for(dir, config));
  EXPECT_EQ(file_text(dir.file("m.jsonl.1")), first) << "the earlier run's lines are kept";
  const std::string second = file_text(dir.file("m.jsonl"));
  EXPECT_EQ(std::count(second.begin(), second.end(), '\n'), 2) << second;

  config["strata"]["steps"] = 3;
  TrainOptions resume = options_for(dir, config);
  resume.resume = dir.file("ck-metrics2");
  run_training(resume);
  const std::string resumed = file_text(dir.file("m.jsonl"));
  EXPECT_EQ(resumed.substr(0, second.size()), second);
  EXPECT_NE(resumed.find("{\"resumed\":{\"checkpoint\":\"" + dir.file("ck-metrics2") + "\",\"step\":2}}\n{\"applied\""),
            std::string::npos)
      << resumed;
  EXPECT_FALSE(fs::exists(dir.file("m.jsonl.2"))) << "a resume appends";
}

// A static fp16 loss scale of 2^100 overflows every gradient: every step is skipped. The run fails
// after strata.max_skipped_steps in a row (3 by default without a dynamic scaler), saying why.
TEST(TrainTrust, TooManySkippedStepsInARowFailTheRun) {
  TempDir dir;
  nlohmann::json config = tiny_config(dir, 8);
  config["fp16"] = {{"enabled", true}, {"loss_scale", std::ldexp(1.0, 100)}};
  config["strata"]["metrics"] = dir.file("metrics.jsonl");
  const std::string what = error_of<SkippedStepsError>([&] { run_training(options_for(dir, config)); });
  EXPECT_NE(what.find("step 3: 3 steps in a row were skipped"), std::string::npos) << what;
  EXPECT_NE(what.find("not finite"), std::string::npos) << what;
  EXPECT_NE(what.find("strata.max_skipped_steps (now 3)"), std::string::npos) << what;
  std::ifstream metrics(dir.file("metrics.jsonl"));
  int lines = 0;
  for (std::string line; std::getline(metrics, line);) ++lines;
  EXPECT_EQ(lines, 3) << "the skipped steps are reported before the run stops";

  config["strata"]["max_skipped_steps"] = 5;
  config["strata"]["checkpoint"] = tiny_config(dir, 8)["strata"]["checkpoint"];
  const std::string five = error_of<SkippedStepsError>([&] { run_training(options_for(dir, config)); });
  EXPECT_NE(five.find("step 5: 5 steps in a row"), std::string::npos) << five;
  config["strata"]["max_skipped_steps"] = 100;
  config["strata"]["checkpoint"] = tiny_config(dir, 8)["strata"]["checkpoint"];
  EXPECT_EQ(run_training(options_for(dir, config)).steps, 8) << "under the bound the run goes on";
}

// A full disk under strata.metrics: the failure is reported with the path, training goes on, and the
// run ends with the error. A full disk under --summary-json fails the run naming the path.
TEST(TrainTrust, FailedWritesOfTextOutputsFailTheRunNamingThePath) {
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full on this machine";
  TempDir dir;
  nlohmann::json config = tiny_config(dir, 2);
  config["strata"]["metrics"] = "/dev/full";
  TrainOptions o = options_for(dir, config);
  o.save_weights = dir.file("w.safetensors");
  const std::string metrics = error_of<IoError>([&] { run_training(o); });
  EXPECT_NE(metrics.find("strata.metrics"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("'/dev/full'"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("No space left on device"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("ran 2 steps"), std::string::npos) << metrics;
  EXPECT_TRUE(fs::exists(dir.file("w.safetensors"))) << "the other outputs are still written";

  TrainOptions s = options_for(dir, tiny_config(dir, 1));
  s.summary_json = "/dev/full";
  const std::string summary = error_of<IoError>([&] { run_training(s); });
  EXPECT_NE(summary.find("--summary-json"), std::string::npos) << summary;
  EXPECT_NE(summary.find("'/dev/full'"), std::string::npos) << summary;
}

// Output paths are checked before the first step: no metrics line is written for a run whose
// --save-weights directory does not exist, or whose --summary-json is a directory or the config.
TEST(TrainTrust, OutputPathsAreCheckedBeforeTraining) {
  TempDir dir;
  nlohmann::json config = tiny_config(dir, 2);
  config["strata"]["metrics"] = dir.file("metrics.jsonl");
  TrainOptions o = options_for(dir, config);
  o.save_weights = dir.file("no-such-dir/w.safetensors");
  const std::string missing = error_of<ConfigError>([&] { run_training(o); });
  EXPECT_NE(missing.find("--save-weights"), std::string::npos) << missing;
  EXPECT_NE(missing.find("'" + dir.file("no-such-dir") + "' does not exist"), std::string::npos) << missing;
  EXPECT_FALSE(fs::exists(dir.file("metrics.jsonl"))) << "training started before the output path was checked";

  o.save_weights.clear();
  o.summary_json = dir.file(".");
  EXPECT_NE(error_of<ConfigError>([&] { run_training(o); }).find("is a directory"), std::string::npos);

  const std::string config_text = file_text(o.config_path);
  o.summary_json = dir.file("./config.json");
  const std::string input = error_of<ConfigError>([&] { run_training(o); });
  EXPECT_NE(input.find("a file this command reads"), std::string::npos) << input;
  EXPECT_EQ(file_text(o.config_path), config_text);

  o.summary_json = dir.file("same.json");
  o.save_weights = dir.file("same.json");
  EXPECT_NE(error_of<ConfigError>([&] { run_training(o); }).find("are the same file"), std::string::npos);

  o.summary_json.clear();
  o.save_weights.clear();
  o.steps = -1;
  EXPECT_NE(error_of<ConfigError>([&] { run_training(o); }).find("--steps -1"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir.file("metrics.jsonl")));
}

// `strata ckpt export CKPT OUT` never writes into the checkpoint it reads: not over a data file, the
// manifest or `latest`, nor anywhere inside the step directory (also through `..` and symlinks).
TEST(TrainTrust, CkptExportRefusesAnOutputInsideTheCheckpoint) {
  TempDir dir;
  nlohmann::json config = tiny_config(dir, 2);
  config["strata"]["checkpoint"]["dir"] = dir.file("ck");
  ASSERT_EQ(run_training(options_for(dir, config)).steps, 2);
  const std::string step_dir = dir.file("ck/step-00000002");
  ASSERT_TRUE(fs::exists(step_dir + "/rank-00000.bin"));
  const std::string data_before = file_text(step_dir + "/rank-00000.bin");
  const std::string latest_before = file_text(dir.file("ck/latest"));
  fs::create_directory_symlink(step_dir, dir.file("link"));
  for (const std::string& out :
       {step_dir + "/rank-00000.bin", step_dir + "/manifest.json", dir.file("ck/latest"), step_dir + "/new.safetensors",
        dir.file("ck/step-00000002/../step-00000002/x.safetensors"), dir.file("link/rank-00000.bin")}) {
    EXPECT_EQ(run_strata({"ckpt", "export", dir.file("ck"), out}), 1) << out;
  }
  EXPECT_EQ(file_text(step_dir + "/rank-00000.bin"), data_before);
  EXPECT_EQ(file_text(dir.file("ck/latest")), latest_before);
  EXPECT_FALSE(fs::exists(step_dir + "/new.safetensors"));
  EXPECT_EQ(run_strata({"ckpt", "export", dir.file("ck"), dir.file("out.safetensors")}), 0);
  EXPECT_EQ(run_strata({"ckpt", "export", step_dir, dir.file("ck/beside.safetensors")}), 0)
      << "beside the checkpoint, outside its step directory, is fine";
}

}  // namespace
}  // namespace strata::train
