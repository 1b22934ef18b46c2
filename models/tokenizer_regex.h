// PCRE2 for the tokenizers: owned compiled patterns and the per-thread state of matching them
// (match data, a JIT stack large enough for long whitespace runs). Internal to models/. A match that
// fails on a resource limit is a FormatError (the pattern comes from the tokenizer file).
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <string>
#include <string_view>

namespace strata::models {

struct Pcre2CodeFree {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
using Regex = std::unique_ptr<pcre2_code, Pcre2CodeFree>;

// Compiles `pattern` in UTF mode with Unicode properties for \w, \d, \s (UCP), JIT when available.
// FormatError naming the tokenizer file `path`, `what` (the field) and PCRE2's message.
Regex compile_regex(const std::string& pattern, const std::string& path, const std::string& what);

// One thread's state for matching one or more patterns: a match context with a JIT stack, and
// match data sized for the largest pattern given (all tokenizer patterns have few groups).
class RegexMatcher {
 public:
  RegexMatcher();
  // The next match of `re` in `text` at or after `from`: true with [*begin, *end), false when none.
  // `text` must be valid UTF-8 (checked once by the caller, not per call).
  bool find(const pcre2_code* re, std::string_view text, std::size_t from, std::size_t* begin, std::size_t* end,
            std::uint32_t options = 0);

 private:
  struct MatchDataFree {
    void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
  };
  struct MatchContextFree {
    void operator()(pcre2_match_context* m) const { pcre2_match_context_free(m); }
  };
  struct JitStackFree {
    void operator()(pcre2_jit_stack* s) const { pcre2_jit_stack_free(s); }
  };
  std::unique_ptr<pcre2_jit_stack, JitStackFree> stack_;
  std::unique_ptr<pcre2_match_context, MatchContextFree> context_;
  std::unique_ptr<pcre2_match_data, MatchDataFree> data_;
};

}  // namespace strata::models
