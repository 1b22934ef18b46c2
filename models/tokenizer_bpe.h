// Byte-level BPE from a Hugging Face tokenizer.json: what the file says (BpeSpec, read and checked
// by models/tokenizer_bpe_spec.cc) and the tokenizer built from it (models/tokenizer_bpe.cc).
// Internal to models/: users go through load_tokenizer (models/tokenizer.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata::models {

// GPT-2's pre-tokenization regex, which HF's ByteLevel pre-tokenizer applies when use_regex is true.
inline constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct BpeAddedToken {
  std::uint32_t id = 0;
  std::string content;
  bool special = false;
  // Matched on the normalized text (after NFC) rather than the raw text; HF's `normalized`.
  bool normalized = false;
  bool single_word = false;  // only between non-word characters
  bool lstrip = false, rstrip = false;  // takes the whitespace on that side into the token
};

// The parts of a tokenizer.json this build implements; anything else was refused while reading.
struct BpeSpec {
  std::string path;
  std::uint64_t file_hash = 0;
  bool nfc = false;                         // normalizer: null or NFC
  std::vector<std::string> split_patterns;  // Split pre-tokenizers (Isolated), applied in order
  bool add_prefix_space = false;            // ByteLevel's
  std::unordered_map<std::string, std::uint32_t> vocab;  // byte-level strings ("Ġthe")
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::optional<std::uint32_t> unk_id;
  bool fuse_unk = false;
  bool ignore_merges = false;  // a piece that is itself in the vocab is one token (LLaMA 3)
  std::vector<BpeAddedToken> added;
  std::optional<std::string> bos_token, eos_token;
};

// Reads and checks `path` (a tokenizer.json); the bos/eos names come from tokenizer_config.json
// beside it when present. FormatError naming the file, the field and what is supported.
BpeSpec read_bpe_spec(const std::string& path);

// `bytes` with each maximal invalid UTF-8 subpart replaced by U+FFFD (Rust's from_utf8_lossy, which
// HF's decode applies). Lives in models/tokenizer.cc beside the UTF-8 check.
std::string utf8_lossy(std::string_view bytes);

}  // namespace strata::models
