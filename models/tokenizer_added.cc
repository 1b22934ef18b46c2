// Added-token splitting (see models/tokenizer_added.h).
#include "models/tokenizer_added.h"

#include <algorithm>

namespace strata::models {

namespace {

// The leftmost-longest alternation of literal tokens (HF matches added tokens with a leftmost-longest
// Aho-Corasick automaton; PCRE2 takes the first alternative that matches, so longest first).
std::string literal_alternation(std::vector<std::string> tokens) {
  std::sort(tokens.begin(), tokens.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  std::string out;
  for (const auto& t : tokens) {
    if (!out.empty()) out += '|';
    out += "\\Q";
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (t.compare(i, 2, "\\E") == 0) {
        out += "\\E\\\\E\\Q";  // a literal \E cannot sit inside \Q...\E
        ++i;
      } else {
        out += t[i];
      }
    }
    out += "\\E";
  }
  return out;
}

std::size_t previous_char(std::string_view text, std::size_t at) {
  do {
    --at;
  } while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80);
  return at;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<BpeAddedToken> tokens, const std::string& path) {
  if (tokens.empty()) return;
  std::vector<std::string> contents;
  for (auto& t : tokens) {
    contents.push_back(t.content);
    by_content_.emplace(t.content, std::move(t));
  }
  alternation_ = compile_regex(literal_alternation(contents), path, "added_tokens");
  // Rust's regex classes, which HF's find_matches uses: \s is Unicode White_Space (PCRE2's UCP \s
  // lacks U+0085), \w is Alphabetic, marks, decimal digits, connector punctuation and Join_Control.
  space_ = compile_regex(R"([\s\x{85}])", path, "the added tokens' whitespace class");
  word_ = compile_regex(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])", path, "the added tokens' word class");
}

bool AddedTokenMatcher::is_char(const pcre2_code* re, std::string_view text, std::size_t at, RegexMatcher& m) const {
  std::size_t b = 0, e = 0;
  return at < text.size() && m.find(re, text, at, &b, &e, PCRE2_ANCHORED);
}

void AddedTokenMatcher::split(std::string_view text, RegexMatcher& m, std::vector<AddedSplit>& out) const {
  out.clear();
  std::size_t done = 0, from = 0, begin = 0, end = 0;
  while (!empty() && from < text.size() && m.find(alternation_.get(), text, from, &begin, &end)) {
    from = end;
    const BpeAddedToken& token = by_content_.find(std::string(text.substr(begin, end - begin)))->second;
    if (token.single_word) {
      const bool word_before = begin > 0 && is_char(word_.get(), text, previous_char(text, begin), m);
      const bool word_after = is_char(word_.get(), text, end, m);
      if (word_before || word_after) continue;  // inside a word: not this token
    }
    if (token.lstrip) {
      // The whitespace before, but not what the previous split already holds.
      while (begin > done && is_char(space_.get(), text, previous_char(text, begin), m)) begin = previous_char(text, begin);
    }
    if (token.rstrip) {
      std::size_t b = 0, e = 0;
      while (end < text.size() && m.find(space_.get(), text, end, &b, &e, PCRE2_ANCHORED)) end = e;
      from = end;
    }
    if (begin > done) out.push_back({done, begin, -1});
    out.push_back({begin, end, token.id});
    done = end;
  }
  if (done < text.size() || out.empty()) out.push_back({done, text.size(), -1});
}

}  // namespace strata::models
