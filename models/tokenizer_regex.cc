// PCRE2 wrappers of the tokenizers (see models/tokenizer_regex.h).
#include "models/tokenizer_regex.h"

#include <fmt/format.h>

#include "core/error.h"

namespace strata::models {

Regex compile_regex(const std::string& pattern, const std::string& path, const std::string& what) {
  int code = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                 &code, &offset, nullptr);
  if (re == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(code, message, sizeof message);
    throw FormatError(fmt::format("tokenizer.json '{}': {} does not compile as a PCRE2 regex at offset {}: {}; this "
                                  "build reads the Oniguruma syntax PCRE2 shares",
                                  path, what, offset, reinterpret_cast<const char*>(message)));
  }
  // Without JIT support (an exotic CPU) PCRE2 interprets the same pattern: slower, same matches.
  (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
  return Regex(re);
}

RegexMatcher::RegexMatcher() {
  // Long whitespace and digit runs backtrack deeply; PCRE2's default 32 KiB JIT stack is too small.
  stack_.reset(pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr));
  context_.reset(pcre2_match_context_create(nullptr));
  data_.reset(pcre2_match_data_create(16, nullptr));
  STRATA_CHECK(stack_ && context_ && data_, "pcre2 match state allocation failed");
  pcre2_jit_stack_assign(context_.get(), nullptr, stack_.get());
}

bool RegexMatcher::find(const pcre2_code* re, std::string_view text, std::size_t from, std::size_t* begin,
                        std::size_t* end, std::uint32_t options) {
  const int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), from,
                             options | PCRE2_NO_UTF_CHECK, data_.get(), context_.get());
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    // Resource limits (match, depth, heap, JIT stack): the pattern comes from a tokenizer file.
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof message);
    throw FormatError(fmt::format("a tokenizer regex failed on the text at byte {}: {} (PCRE2 error {}); the pattern "
                                  "backtracks too much on this input",
                                  from, reinterpret_cast<const char*>(message), rc));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data_.get());
  *begin = ov[0];
  *end = ov[1];
  return true;
}

}  // namespace strata::models
