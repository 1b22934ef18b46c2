// Tokenizers (models/tokenizer.h) on small cases with known ids, and every refusal: unsupported
// tokenizer.json fields, damaged files, invalid UTF-8. The comparison with HF tokenizers on real
// vocabularies is tests/models/tokenizer_reference.py.
#include "models/tokenizer.h"

#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/models/tokenizer_test_util.h"

namespace strata::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Ids = std::vector<std::uint32_t>;

class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata_tokenizer_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static json tiny_bpe() { return tiny_bpe_json(); }
  static void add_token(json& j, std::uint32_t id, const std::string& content, bool special) {
    add_added_token(j, id, content, special);
  }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::unique_ptr<Tokenizer> load(const json& j) const { return load_tokenizer(write("tokenizer.json", j.dump())); }
  // The message load() throws, checked to name the file.
  std::string refusal(const json& j) const {
    try {
      load(j);
    } catch (const FormatError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find((dir_ / "tokenizer.json").string()), std::string::npos) << what;
      return what;
    }
    ADD_FAILURE() << "loaded: " << j.dump().substr(0, 200);
    return {};
  }

  fs::path dir_;
};

TEST_F(TokenizerTest, MergesLowestRankFirstAndLeftmostOnTies) {
  const auto t = load(tiny_bpe());
  EXPECT_EQ(t->encode("hello"), (Ids{259}));
  EXPECT_EQ(t->encode("lll"), (Ids{256, 'l'}));  // the leftmost "l l" merges first
  // GPT-2's regex keeps the space with the word; "Ġ" (the space's character) has no merge.
  EXPECT_EQ(t->encode("hello hello"), (Ids{259, ' ', 259}));
  EXPECT_EQ(t->encode("lo"), (Ids{'l', 'o'}));  // in the vocab, but no merge makes it
  EXPECT_EQ(t->vocab_size(), 261u);
  EXPECT_EQ(t->identity().kind, TokenizerKind::ByteLevelBpe);
  EXPECT_NE(t->identity().file_hash, 0u);
}

// HF drops a character missing from the vocabulary when there is no unk token (found by the fuzzer:
// the missing byte came out as id 2^32 - 1).
TEST_F(TokenizerTest, BytesMissingFromTheVocabAreDroppedOrUnk) {
  json j = tiny_bpe();
  j["model"]["vocab"].erase("z");
  EXPECT_EQ(load(j)->encode("azz"), (Ids{'a'}));
  j["model"]["unk_token"] = "!";
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(load(j)->encode("azz"), (Ids{'a', '!'}));
}

TEST_F(TokenizerTest, IgnoreMergesTakesWholePiecesFromTheVocab) {
  json j = tiny_bpe();
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(load(j)->encode("lo"), (Ids{260}));
}

TEST_F(TokenizerTest, AddedTokensSplitFirstLeftmostLongest) {
  json j = tiny_bpe();
  add_token(j, 300, "<|eot|>", true);
  add_token(j, 301, "<|a", false);
  add_token(j, 302, "<|ab", false);
  const auto t = load(j);
  EXPECT_EQ(t->encode("he<|eot|>hello"), (Ids{257, 300, 259}));
  EXPECT_EQ(t->encode("<|abc<|a"), (Ids{302, 'c', 301}));
  EXPECT_EQ(t->vocab_size(), 303u);
  EXPECT_EQ(t->token_id("<|eot|>"), 300u);
  EXPECT_EQ(t->eos_id(), std::nullopt);  // no config and no known end-of-text name
}

TEST_F(TokenizerTest, BosAndEosFromTokenizerConfig) {
  json j = tiny_bpe();
  add_token(j, 300, "<s>", true);
  add_token(j, 301, "</s>", true);
  write("tokenizer_config.json", R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>"})");
  const auto t = load(j);
  EXPECT_EQ(t->bos_id(), 300u);
  EXPECT_EQ(t->eos_id(), 301u);
}

TEST_F(TokenizerTest, DecodeRoundTripsAndReplacesInvalidUtf8) {
  json j = tiny_bpe();
  add_token(j, 300, "<|endoftext|>", true);
  const auto t = load(j);
  EXPECT_EQ(t->eos_id(), 300u);
  const std::string text = "hello wörld 你好 👨‍👩‍👧 \t\n  <|endoftext|>x";
  EXPECT_EQ(t->decode(t->encode(text)), text);
  EXPECT_EQ(t->decode(Ids{'a', 0xFF, 'b'}), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(t->decode(Ids{0xE4, 0xBD}), "\xEF\xBF\xBD");  // a cut-off character is one U+FFFD
  try {
    t->decode(Ids{1, 9999});
    FAIL() << "decoded an id outside the vocabulary";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("token 9999 at position 1"), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerTest, NfcNormalizerComposes) {
  json j = tiny_bpe();
  EXPECT_EQ(load(j)->encode("e\u0301"), (Ids{'e', 0xCC, 0x81}));
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(load(j)->encode("e\u0301"), (Ids{0xC3, 0xA9}));
}

TEST_F(TokenizerTest, SplitSequenceThenByteLevel) {
  json j = tiny_bpe();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}|[^\\p{N}]+"}}}, {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  EXPECT_EQ(load(j)->encode("hello12345"), (Ids{259, '1', '2', '3', '4', '5'}));
}

TEST_F(TokenizerTest, RefusesWhatItDoesNotImplementNamingTheField) {
  struct Case {
    const char* pointer;
    json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"/model/type", "WordPiece", "model.type \"WordPiece\" is not supported"},
      {"/model/type", "Unigram", "model.type \"Unigram\""},
      {"/normalizer", {{"type", "Lowercase"}}, "normalizer.type \"Lowercase\""},
      {"/pre_tokenizer", {{"type", "Metaspace"}}, "pre_tokenizer.type \"Metaspace\""},
      {"/pre_tokenizer", nullptr, "pre_tokenizer null"},
      {"/decoder", {{"type", "WordPiece"}}, "decoder.type \"WordPiece\""},
      {"/model/dropout", 0.1, "model.dropout"},
      {"/model/byte_fallback", true, "model.byte_fallback = true"},
      {"/model/continuing_subword_prefix", "##", "model.continuing_subword_prefix"},
  };
  for (const auto& c : cases) {
    json j = tiny_bpe();
    j[json::json_pointer(c.pointer)] = c.value;
    const std::string what = refusal(j);
    EXPECT_NE(what.find(c.expect), std::string::npos) << what;
    EXPECT_NE(what.find("this build reads byte-level BPE"), std::string::npos) << what;
  }
  json j = tiny_bpe();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Removed"}, {"invert", false}},
                          {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  EXPECT_NE(refusal(j).find("pre_tokenizer.pretokenizers[0].behavior \"Removed\""), std::string::npos);
}

// HF's find_matches: lstrip/rstrip take the whitespace beside the token (not what an earlier split
// holds); a single_word token inside a word is not matched; normalized tokens match after the raw ones.
TEST_F(TokenizerTest, AddedTokenStripAndSingleWord) {
  json j = tiny_bpe();
  add_token(j, 300, "<m>", true);
  add_token(j, 301, "[S]", false);
  add_token(j, 302, "he", false);
  j["added_tokens"][0]["lstrip"] = true;
  j["added_tokens"][1]["rstrip"] = true;
  j["added_tokens"][2]["single_word"] = true;
  const auto t = load(j);
  EXPECT_EQ(t->encode("a \u3000 <m>b"), (Ids{'a', 300, 'b'}));
  EXPECT_EQ(t->encode("a[S] \n\tb"), (Ids{'a', 301, 'b'}));
  EXPECT_EQ(t->encode("[S]  <m>"), (Ids{301, 300}));
  EXPECT_EQ(t->encode("he hello, he"), (Ids{302, ' ', 259, ',', ' ', 302}));
  EXPECT_EQ(t->encode("_he"), (Ids{'_', 257}));  // '_' is a word character
}

// A pattern that backtracks exponentially hits PCRE2's match limit: one message naming the file.
TEST_F(TokenizerTest, ARegexThatBacktracksTooMuchIsAFormatError) {
  json j = tiny_bpe();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "(a|a)+b"}}}, {"behavior", "Isolated"}},
                          {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  const auto t = load(j);
  try {
    t->encode(std::string(60, 'a') + "cb");
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find((dir_ / "tokenizer.json").string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("backtracks too much"), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerTest, RefusesDamagedFiles) {
  EXPECT_NE(refusal(json::array()).find("is not a JSON object"), std::string::npos);
  json j = tiny_bpe();
  j["model"]["merges"] = {"l q"};
  EXPECT_NE(refusal(j).find("model.merges[0]"), std::string::npos);
  j = tiny_bpe();
  j["model"]["merges"] = {"llo"};
  EXPECT_NE(refusal(j).find("model.merges[0]"), std::string::npos);
  j = tiny_bpe();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
                          {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  EXPECT_NE(refusal(j).find("does not compile as a PCRE2 regex"), std::string::npos);
  try {
    load_tokenizer(write("tokenizer.json", "{\"model\": \n {"));
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerTest, Utf8CheckNamesByteLineAndColumn) {
  const auto expect_refused = [](const std::string& text, const std::string& where) {
    try {
      check_utf8(text, "'data.txt'");
      ADD_FAILURE() << "accepted " << where;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'data.txt' is not valid UTF-8"), std::string::npos) << e.what();
    }
  };
  expect_refused("ab\ncd\xFF", "at byte 5 (line 2, byte 3 of the line)");
  expect_refused("\xC0\x80", "at byte 0");           // overlong NUL
  expect_refused("x\xED\xA0\x80", "at byte 1");      // a UTF-16 surrogate
  expect_refused("\xF4\x90\x80\x80", "at byte 0");   // above U+10FFFF
  expect_refused("0123456789\xE4\xB8", "at byte 10");  // cut off by the end
  expect_refused("\x80", "continuation byte");
  EXPECT_NO_THROW(check_utf8("plain ascii, é, 你好, 👨‍👩‍👧, \xF4\x8F\xBF\xBF", "x"));
}

TEST_F(TokenizerTest, EncodeRefusesInvalidUtf8AndEncodeDocumentsNamesTheDocument) {
  const auto t = load(tiny_bpe());
  EXPECT_THROW(t->encode("he\xFFllo", "'x.txt'"), FormatError);
  const std::vector<std::string_view> docs = {"hello", "lll hello", "he\xFF"};
  try {
    encode_documents(*t, docs, 2, "'in.jsonl'");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("'in.jsonl' document 3 is not valid UTF-8 at byte 2"), std::string::npos) << e.what();
  }
  const auto ids = encode_documents(*t, std::span(docs).first(2), 2, "x");
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0], t->encode(docs[0]));
  EXPECT_EQ(ids[1], t->encode(docs[1]));
}

TEST_F(TokenizerTest, LoaderPicksTheFileAndSaysWhatIsMissing) {
  try {
    load_tokenizer((dir_ / "nope").string());
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
  try {
    load_tokenizer(dir_.string());
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("neither tokenizer.json nor tokenizer.model"), std::string::npos) << e.what();
  }
}

// A SentencePiece model trained here by libsentencepiece's trainer.
class SentencePieceTest : public TokenizerTest {
 protected:
  std::string train() const {
    std::string text;
    for (int i = 0; i < 300; ++i) {
      text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + " times\n";
      text += "Съешь же ещё этих мягких французских булок 你好世界\n";
    }
    const std::string input = write("corpus.txt", text);
    const std::string prefix = (dir_ / "tokenizer").string();
    const auto status = sentencepiece::SentencePieceTrainer::Train(
        "--input=" + input + " --model_prefix=" + prefix +
        " --vocab_size=400 --model_type=bpe --byte_fallback=true --minloglevel=2 --num_threads=1");
    EXPECT_TRUE(status.ok()) << status.ToString();
    return prefix + ".model";
  }
};

TEST_F(SentencePieceTest, EncodesDecodesAndNamesItsSpecials) {
  const std::string model = train();
  const auto t = load_tokenizer(dir_.string());
  EXPECT_EQ(t->identity().kind, TokenizerKind::SentencePiece);
  EXPECT_EQ(t->vocab_size(), 400u);
  EXPECT_EQ(t->bos_id(), 1u);
  EXPECT_EQ(t->eos_id(), 2u);
  const std::string text = "the lazy fox ещё 你好 ✨";  // ✨ is unseen: byte fallback
  const auto ids = t->encode(text);
  EXPECT_GT(ids.size(), 3u);
  EXPECT_EQ(t->decode(ids), text);
  EXPECT_EQ(t->token_id("<s>"), 1u);
  EXPECT_EQ(t->token_id("no such piece"), std::nullopt);
  EXPECT_THROW(t->decode(Ids{5000}), FormatError);
}

TEST_F(SentencePieceTest, AnUnsupportedTokenizerJsonFallsBackToTokenizerModel) {
  train();
  json j = tiny_bpe();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  write("tokenizer.json", j.dump());
  EXPECT_EQ(load_tokenizer(dir_.string())->identity().kind, TokenizerKind::SentencePiece);
  fs::remove(dir_ / "tokenizer.model");
  EXPECT_THROW(load_tokenizer(dir_.string()), FormatError);
}

TEST_F(SentencePieceTest, RefusesADamagedModel) {
  const std::string path = write("tokenizer.model", "not a protobuf at all \xFF\xFF");
  try {
    load_tokenizer(path);
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a SentencePiece model"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::models
