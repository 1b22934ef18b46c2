// Fuzzes the tokenizers: mutated tokenizer.json files (load, encode, decode: a strata::Error or a
// sane result, never a crash; every id below the vocabulary size), and mutated text through the
// UTF-8 check and a byte-level BPE, which must give the text back when it is valid UTF-8.
#include <fstream>

#include <gtest/gtest.h>

#include "models/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/models/tokenizer_test_util.h"
#include "tests/offload/offload_test_util.h"

namespace strata::fuzz {
namespace {

using nlohmann::json;

std::vector<std::string> tokenizer_seeds() {
  json plain = models::tiny_bpe_json();
  models::add_added_token(plain, 300, "<|endoftext|>", true);
  models::add_added_token(plain, 301, "<m>", false);
  plain["added_tokens"][1]["lstrip"] = true;
  json split = plain;
  split["normalizer"] = {{"type", "NFC"}};
  split["pre_tokenizer"] = {{"type", "Sequence"},
                            {"pretokenizers",
                             {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}| ?\\p{L}+|\\s+(?!\\S)|\\s+|."}}},
                               {"behavior", "Isolated"}, {"invert", false}},
                              {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}}}}};
  split["model"]["ignore_merges"] = true;
  return {plain.dump(), split.dump(1)};
}

void check_ids(const models::Tokenizer& t, const std::vector<std::uint32_t>& ids) {
  for (const std::uint32_t id : ids) {
    if (id >= t.vocab_size()) {
      throw InsaneResult("id " + std::to_string(id) + " from a tokenizer of " + std::to_string(t.vocab_size()));
    }
  }
}

TEST(FuzzTokenizer, TokenizerJson) {
  offload::testing::TempDir dir;
  const std::string path = dir.path() + "/tokenizer.json";
  const std::string text = "hello <m> world 12345 <|endoftext|> e\u0301 \u4f60\u597d \U0001F468\u200d\U0001F469  \n\n";
  const FuzzStats s = fuzz_loop("tokenizer-json", tokenizer_seeds(), mutate_json, [&](const std::string& input) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << input;
    const auto t = models::load_tokenizer(path);
    const auto ids = t->encode(text);
    check_ids(*t, ids);
    (void)t->decode(ids);
  }, 0.25);
  EXPECT_GT(s.inputs, 0u);
}

TEST(FuzzTokenizer, Text) {
  offload::testing::TempDir dir;
  const std::string path = dir.path() + "/tokenizer.json";
  std::ofstream(path) << tokenizer_seeds()[0];
  const auto t = models::load_tokenizer(path);
  const std::vector<std::string> seeds = {"hello hello, he said: 'll've 123 \t\n", "\u4f60\u597d\u3000\u0410\u0411 \U0001F600\u200d",
                                          std::string(300, ' ') + "x\r\n\r\n"};
  const FuzzStats s = fuzz_loop("tokenizer-text", seeds, mutate_bytes, [&](const std::string& input) {
    const auto ids = t->encode(input, "the fuzzed text");  // FormatError for invalid UTF-8
    check_ids(*t, ids);
    if (t->decode(ids) != input) throw InsaneResult("decode(encode(text)) is not the text");
  });
  EXPECT_GT(s.refused, 0u);
  EXPECT_GT(s.accepted, 0u);
}

}  // namespace
}  // namespace strata::fuzz
