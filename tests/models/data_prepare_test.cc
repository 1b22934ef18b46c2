// `strata data prepare`'s work (models/data_prepare.h): the token stream and loss mask of known
// documents, BOS/EOS placement, mixing by weight, a disjoint seeded validation split, and every
// refused input naming its file and line.
#include "models/data_prepare.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/token_data.h"
#include "tests/models/tokenizer_test_util.h"

namespace strata::models {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<std::uint32_t>;

class DataPrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata_data_prepare_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "tok");
    nlohmann::json j = tiny_bpe_json();
    add_added_token(j, 300, "<|endoftext|>", true);
    add_added_token(j, 301, "<s>", true);
    write("tok/tokenizer.json", j.dump());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  PrepareOptions options(std::vector<DataSource> sources) const {
    PrepareOptions o;
    o.sources = std::move(sources);
    o.out_dir = (dir_ / "out").string();
    o.threads = 2;
    return o;
  }
  static Ids tokens(const TokenFile& f) {
    Ids out;
    for (std::size_t i = 0; i < f.size(); ++i) out.push_back(f[i]);
    return out;
  }
  // The documents of a token file as decoded text between EOS tokens.
  static std::multiset<std::string> documents(const Tokenizer& t, const TokenFile& f) {
    std::multiset<std::string> out;
    Ids doc;
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (f[i] == 300) {
        out.insert(t.decode(doc));
        doc.clear();
      } else {
        doc.push_back(f[i]);
      }
    }
    return out;
  }
  std::string error_of(const PrepareOptions& o) const {
    try {
      prepare_token_data(*load_tokenizer((dir_ / "tok").string()), o);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  }

  fs::path dir_;
};

TEST_F(DataPrepareTest, PromptIsMaskedAndEosEndsEveryDocument) {
  const auto t = load_tokenizer((dir_ / "tok").string());
  ASSERT_EQ(t->eos_id(), 300u);
  const std::string in = write("a.jsonl", "{\"prompt\": \"he\", \"completion\": \"llo\"}\n");
  const auto report = prepare_token_data(*t, options({{in, 1.0}}));
  const auto f = TokenFile::open(report.train.path);
  EXPECT_EQ(tokens(f), (Ids{257, 256, 'o', 300}));
  ASSERT_TRUE(f.has_loss_mask());
  EXPECT_EQ((std::vector<bool>{f.counts_in_loss(0), f.counts_in_loss(1), f.counts_in_loss(2), f.counts_in_loss(3)}),
            (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ(f.declared_vocab_size(), 302u);
  EXPECT_EQ(f.tokenizer_hash(), t->identity().file_hash);
  EXPECT_EQ(f.tokenizer_kind(), 1u);
  EXPECT_EQ(f.source_hash(), report.source_hash);
  EXPECT_EQ(report.train.masked_tokens, 1u);
}

TEST_F(DataPrepareTest, BosWhereTheTokenizerNamesOneAndNoMaskForPlainText) {
  write("tok/tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": "<|endoftext|>"})");
  const auto t = load_tokenizer((dir_ / "tok").string());
  const std::string in = write("a.txt", "hello");
  const auto f = TokenFile::open(prepare_token_data(*t, options({{in, 1.0}})).train.path);
  EXPECT_EQ(tokens(f), (Ids{301, 259, 300}));
  EXPECT_FALSE(f.has_loss_mask());
  PrepareOptions never = options({{in, 1.0}});
  never.bos = BosPolicy::Never;
  EXPECT_EQ(tokens(TokenFile::open(prepare_token_data(*t, never).train.path)), (Ids{259, 300}));
}

TEST_F(DataPrepareTest, WeightsRepeatAndSampleAndTheSplitIsDisjoint) {
  const auto t = load_tokenizer((dir_ / "tok").string());
  std::string a, b;
  for (int i = 0; i < 3; ++i) a += "{\"text\": \"a" + std::to_string(i) + "\"}\n";
  for (int i = 0; i < 400; ++i) b += "{\"text\": \"b" + std::to_string(i) + "\"}\n";
  const std::string pa = write("a.jsonl", a), pb = write("b.jsonl", b);
  const auto report = prepare_token_data(*t, options({{pa, 2.0}, {pb, 0.5}}));
  const auto docs = documents(*t, TokenFile::open(report.train.path));
  EXPECT_EQ(docs.count("a0") + docs.count("a1") + docs.count("a2"), 6u);
  EXPECT_GT(report.train.documents, 6u + 150u);
  EXPECT_LT(report.train.documents, 6u + 250u);
  // Same seed, same bytes.
  const auto bytes = [&](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string first = bytes(report.train.path);
  EXPECT_EQ(bytes(prepare_token_data(*t, options({{pa, 2.0}, {pb, 0.5}})).train.path), first);

  PrepareOptions split = options({{pb, 1.0}});
  split.val_fraction = 0.25;
  split.seed = 7;
  const auto r = prepare_token_data(*t, split);
  const auto train = documents(*t, TokenFile::open(r.train.path));
  const auto val = documents(*t, TokenFile::open(r.validation.path));
  EXPECT_EQ(train.size() + val.size(), 400u);
  EXPECT_GT(val.size(), 60u);
  for (const auto& d : val) EXPECT_EQ(train.count(d), 0u) << d << " is in both splits";
}

TEST_F(DataPrepareTest, TextFilesSplitIntoParagraphsOrLines) {
  const std::string text = "one\ntwo\n\n \r\nthree\n\n\nfour";
  const auto texts = [&](TextDocuments how) {
    std::vector<std::string> out;
    for (const auto& d : read_documents("a.txt", text, "text", how)) out.push_back(d.text + "@" + std::to_string(d.line));
    return out;
  };
  EXPECT_EQ(texts(TextDocuments::File), (std::vector<std::string>{text + "@1"}));
  EXPECT_EQ(texts(TextDocuments::Paragraphs), (std::vector<std::string>{"one\ntwo\n@1", "three\n@5", "four@8"}));
  EXPECT_EQ(texts(TextDocuments::Lines), (std::vector<std::string>{"one@1", "two@2", "three@5", "four@8"}));
  EXPECT_TRUE(read_documents("b.txt", "\n \n", "text", TextDocuments::Lines).empty());
}

TEST_F(DataPrepareTest, RefusesBadInputsNamingFileAndLine) {
  const auto expect = [&](const std::string& name, const std::string& text, const std::string& want) {
    const std::string path = write(name, text);
    const std::string what = error_of(options({{path, 1.0}}));
    EXPECT_NE(what.find(want), std::string::npos) << what;
    EXPECT_NE(what.find(path), std::string::npos) << what;
  };
  expect("missing.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"x\", \"id\": 3}\n", "line 2: no \"text\" field, no \"prompt\" + \"completion\" pair and no chat \"messages\" (it has: body, id)");
  expect("prompt_only.jsonl", "{\"prompt\": \"x\"}\n", "line 1: no \"text\" field");
  expect("number.jsonl", "{\"text\": 5}\n", "line 1: the \"text\" field is 5, not a string");
  expect("array.jsonl", "\n[1, 2]\n", "line 2: not a JSON object");
  expect("broken.jsonl", "{\"text\": \"a\"\n", "line 1:");
  // Chats are checked before any rendering (chat_reference renders them against transformers).
  expect("chat_no_content.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\"}]}\n",
         "line 1: message 2 has no \"content\"");
  expect("chat_empty.jsonl", "{\"text\": \"x\"}\n{\"messages\": []}\n", "line 2: \"messages\" is [], not a non-empty array");
  expect("chat_role.jsonl", "{\"messages\": [{\"role\": 1, \"content\": \"hi\"}]}\n", "line 1: message 1's \"role\" is 1, not a string");
  expect("latin1.txt", "caf\xE9\n", "is not valid UTF-8 at byte 3 (line 1");
  expect("latin1.jsonl", "{\"text\": \"caf\xE9\"}\n", "line 1:");

  const std::string ok = write("ok.txt", "hello");
  EXPECT_NE(error_of(options({{ok, 0.0}})).find("--weight 0"), std::string::npos);
  EXPECT_NE(error_of(options({{ok, -1.0}})).find("must be a positive number"), std::string::npos);
  PrepareOptions frac = options({{ok, 1.0}});
  frac.val_fraction = 1.0;
  EXPECT_NE(error_of(frac).find("--val-fraction 1"), std::string::npos);
  PrepareOptions eos = options({{ok, 1.0}});
  eos.eos_token = "<none>";
  EXPECT_NE(error_of(eos).find("--eos '<none>' is not a token"), std::string::npos);
  EXPECT_NE(error_of(options({})).find("at least one --input"), std::string::npos);
  PrepareOptions all_val = options({{ok, 1.0}});
  all_val.val_fraction = 0.999999;
  EXPECT_NE(error_of(all_val).find("no document is left for training"), std::string::npos);
}

}  // namespace
}  // namespace strata::models
