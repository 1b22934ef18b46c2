// A tiny byte-level BPE tokenizer.json for the tokenizer and data tests: byte ids are the byte
// values; merges make ll=256, he=257, hell=258, hello=259; "lo"=260 is in the vocab with no merge.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace strata::models {

// GPT-2's bytes_to_unicode as UTF-8, for writing byte-level vocabularies by hand.
inline std::string byte_char(int b) {
  int next = 256;
  for (int c = 0; c < 256; ++c) {
    const bool printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
    const int cp = printable ? c : next++;
    if (c == b) return cp < 0x80 ? std::string(1, static_cast<char>(cp))
                                 : std::string{static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
  }
  return {};
}

inline nlohmann::json tiny_bpe_json() {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const char* merged[] = {"ll", "he", "hell", "hello", "lo"};
  for (int i = 0; i < 5; ++i) vocab[merged[i]] = 256 + i;
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false},
            {"vocab", vocab}, {"merges", {"l l", "h e", "he ll", "hell o"}}}}};
}

inline void add_added_token(nlohmann::json& j, std::uint32_t id, const std::string& content, bool special) {
  j["added_tokens"].push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                               {"rstrip", false}, {"normalized", !special}, {"special", special}});
}

}  // namespace strata::models
