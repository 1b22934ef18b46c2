// `strata ckpt export` in-process: a short exact-mode run writes a checkpoint; its export with
// Strata names equals the run's --save-weights file byte for byte (tiled runs too: tiles are put back
// together), and its export with Hugging Face names, loaded back through Strata's Hugging Face
// loader (models/weights_io.h), gives every tensor of the Strata-named export bit for bit. The HF
// file's names and shapes are also checked against Hugging Face's own conventions, written out here
// rather than taken from models/hf_names.h.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "models/decoder_params.h"
#include "models/hf_names.h"
#include "models/resident_provider.h"
#include "models/safetensors.h"
#include "models/weights_io.h"
#include "cli/commands.h"
#include "train/trainer.h"

namespace strata::train {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/strata-ckpt-export-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs `strata ARGS...` in-process; returns its exit code.
int run_strata(std::vector<std::string> args) {
  args.insert(args.begin(), "strata");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  CLI::App app;
  app.require_subcommand(1);
  bench::CommandTable table;
  cli::register_commands(app, table);
  app.parse(static_cast<int>(argv.size()), argv.data());
  return cli::run_selected(app, table, "warn");
}

struct ExportCase {
  const char* model;
  nlohmann::json tiling;  // strata.tiling; {} untiled
  const char* label;
};

void PrintTo(const ExportCase& c, std::ostream* os) { *os << c.label; }

class CkptExport : public ::testing::TestWithParam<ExportCase> {};

TEST_P(CkptExport, HfNamesLoadBackToTheStrataExportBitForBit) {
  const ExportCase& c = GetParam();
  TempDir dir;
  // A tiny exact-mode run at stage 3 with a checkpoint after its last step.
  const nlohmann::json config = {
      {"train_micro_batch_size_per_gpu", 2},
      {"gradient_accumulation_steps", 1},
      {"zero_optimization", {{"stage", 3}}},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}},
      {"strata",
       {{"exact", true},
        {"seed", 99},
        {"model", c.model},
        {"tiling", c.tiling},
        {"data", {{"train", "fortunes"}, {"seq_len", 16}}},
        {"device", {{"kind", "sim"}, {"memory", "64MiB"}}},
        {"steps", 3},
        {"checkpoint", {{"dir", dir.file("ck")}}}}}};
  std::ofstream(dir.file("config.json")) << config.dump(2);
  TrainOptions options;
  options.config_path = dir.file("config.json");
  options.quiet = true;
  options.save_weights = dir.file("saved.safetensors");
  ASSERT_EQ(run_training(options).steps, 3);

  ASSERT_EQ(run_strata({"ckpt", "export", dir.file("ck"), dir.file("strata.safetensors")}), 0);
  ASSERT_EQ(run_strata({"ckpt", "export", dir.file("ck"), dir.file("hf.safetensors"), "--names", "hf"}), 0);
  EXPECT_EQ(file_bytes(dir.file("strata.safetensors")), file_bytes(dir.file("saved.safetensors")))
      << "the Strata-named export differs from --save-weights of the same run";

  bool checkpointing = false;
  const models::ModelConfig model = training_model_config(load_train_config(options.config_path, {}), &checkpointing);
  ASSERT_EQ(model.dtype, DType::F32);

  // Hugging Face's conventions, independently of models/hf_names.h.
  const models::SafetensorsFile hf = models::SafetensorsFile::open(dir.file("hf.safetensors"));
  ASSERT_EQ(hf.metadata().count("format"), 1u);
  EXPECT_EQ(hf.metadata().at("format"), "pt") << "Hugging Face's loaders refuse a file without format pt";
  const std::int64_t d = model.d_model, v = model.vocab_size;
  auto expect_shape = [&](const std::string& name, std::vector<std::int64_t> shape) {
    const models::SafetensorsEntry* e = hf.find(name);
    ASSERT_NE(e, nullptr) << "no tensor " << name;
    EXPECT_EQ(e->shape, shape) << name;
  };
  if (model.arch == models::Architecture::Gpt2) {
    expect_shape("wte.weight", {v, d});
    expect_shape("h.0.attn.c_attn.weight", {d, 3 * d});  // Conv1D: [in, out]
    expect_shape("h.0.mlp.c_fc.weight", {d, model.ffn_hidden});
    expect_shape("h.0.mlp.c_proj.weight", {model.ffn_hidden, d});
    EXPECT_EQ(hf.find("lm_head.weight"), nullptr) << "GPT-2's head is tied to wte: HF files omit it";
  } else {
    expect_shape("model.embed_tokens.weight", {v, d});
    expect_shape("model.layers.0.self_attn.q_proj.weight", {d, d});  // nn.Linear: [out, in]
    expect_shape("model.layers.0.mlp.gate_proj.weight", {model.ffn_hidden, d});
    expect_shape("model.norm.weight", {d});
    expect_shape("lm_head.weight", {v, d});
  }
  std::set<std::string> hf_names, mapped;
  for (const auto& e : hf.tensors()) hf_names.insert(e.name);
  for (const auto& m : models::hf_tensor_names(model)) mapped.insert(m.hf_name);
  EXPECT_EQ(hf_names, mapped);

  // Through the Hugging Face loader into a fresh (untiled) model, then tensor by tensor.
  models::ResidentParamProvider loaded(models::decoder_param_groups(model), nullptr);
  EXPECT_EQ(models::load_weights(dir.file("hf.safetensors"), model, loaded, nullptr),
            models::WeightNaming::HuggingFace);
  const models::SafetensorsFile strata = models::SafetensorsFile::open(dir.file("strata.safetensors"));
  ASSERT_EQ(strata.tensors().size(), loaded.tensor_names().size());
  for (const auto& e : strata.tensors()) {
    std::vector<float> want(e.elems()), got(e.elems());
    strata.read(e, DType::F32, want.data());
    loaded.read_param(e.name, got.data(), nullptr);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
        << e.name << ": the Hugging Face export loaded back differs from the Strata export";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CkptExport,
                         ::testing::Values(ExportCase{"tiny", nlohmann::json::object(), "gpt2"},
                                           ExportCase{"tiny-llama", nlohmann::json::object(), "llama"},
                                           ExportCase{"tiny", {{"default", 4}}, "gpt2_tiled"},
                                           ExportCase{"tiny-llama", {{"default", {{"attn", 2}, {"mlp", 4}}}},
                                                      "llama_tiled"}),
                         [](const ::testing::TestParamInfo<ExportCase>& info) { return info.param.label; });

TEST(CkptExportCli, BadNamesIsOneClearMessage) {
  TempDir dir;
  ::testing::internal::CaptureStderr();
  const int rc = run_strata({"ckpt", "export", dir.file("ck"), dir.file("out.safetensors"), "--names", "huggingface"});
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("--names huggingface: choose strata"), std::string::npos) << err;
  EXPECT_NE(err.find(" or hf "), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << "one line:\n" << err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.safetensors")));
}

}  // namespace
}  // namespace strata::train
