// Splitting text at added tokens, as HF's AddedVocabulary::find_matches does: leftmost-longest
// matches of the tokens' contents, a single_word token only between non-word characters, lstrip and
// rstrip taking the whitespace beside the token into it. Internal to models/ (used by
// models/tokenizer_bpe.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "models/tokenizer_bpe.h"
#include "models/tokenizer_regex.h"

namespace strata::models {

struct AddedSplit {
  std::size_t begin = 0, end = 0;
  std::int64_t id = -1;  // -1: text between added tokens
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `contents[i]` is what token `tokens[i]` matches (its content, normalized when the tokenizer
  // normalizes and the token is matched on normalized text).
  AddedTokenMatcher(std::vector<BpeAddedToken> tokens, const std::string& path);
  bool empty() const { return alternation_ == nullptr; }
  // Replaces `out` with the splits of `text`, covering it whole and in order.
  void split(std::string_view text, RegexMatcher& m, std::vector<AddedSplit>& out) const;

 private:
  bool is_char(const pcre2_code* re, std::string_view text, std::size_t at, RegexMatcher& m) const;

  Regex alternation_, space_, word_;
  std::unordered_map<std::string, BpeAddedToken> by_content_;
};

}  // namespace strata::models
