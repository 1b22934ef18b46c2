// Tokenizers of a model folder: text to token ids and back, identical to what Hugging Face's
// `tokenizers` (or SentencePiece) gives for the same files, so that data prepared here trains a
// published model on the ids it was trained on.
//
// Two kinds, chosen by load_tokenizer from the files in the folder:
//  * byte-level BPE from `tokenizer.json` (GPT-2, LLaMA 3, Qwen2, newer Mistral): added tokens are
//    split off first (models/tokenizer_added.h), the rest is normalized (none or NFC), pre-tokenized by the Split regex(es)
//    through PCRE2 and the ByteLevel byte-to-unicode map, and each piece is merged by rank
//    (models/tokenizer_bpe.cc; what tokenizer.json may hold: models/tokenizer_bpe_spec.cc);
//  * SentencePiece `tokenizer.model` (LLaMA 2, Mistral 7B v0.1) through libsentencepiece
//    (models/tokenizer_sp.cc).
// encode adds no BOS/EOS (as `add_special_tokens=False`): whoever builds documents places them,
// from bos_id()/eos_id(). decode keeps special tokens and replaces invalid UTF-8 by U+FFFD, as HF's
// `decode(ids, skip_special_tokens=False)` does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata::models {

enum class TokenizerKind { ByteLevelBpe, SentencePiece };

// What identifies a tokenizer: the file it came from and the XXH64 (seed 0) of that file's bytes,
// which a token file records so that data and model can be checked to match.
struct TokenizerIdentity {
  TokenizerKind kind = TokenizerKind::ByteLevelBpe;
  std::string path;
  std::uint64_t file_hash = 0;
};

// Per-thread working state of an encoder (PCRE2 match data, the BPE word cache). Not thread-safe:
// one per thread, reused across calls so the cache pays off.
class EncodeScratch {
 public:
  virtual ~EncodeScratch() = default;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Appends the ids of `text`, which must be valid UTF-8 (check_utf8). Thread-safe with one
  // scratch per thread.
  virtual void encode_into(std::string_view text, EncodeScratch& scratch, std::vector<std::uint32_t>& out) const = 0;
  virtual std::unique_ptr<EncodeScratch> new_scratch() const = 0;
  // Checks `text` (FormatError naming `source`, the byte offset and line) and encodes it.
  std::vector<std::uint32_t> encode(std::string_view text, std::string_view source = "the text") const;

  // The text of `ids`; an id outside the vocabulary is a FormatError naming it.
  virtual std::string decode(std::span<const std::uint32_t> ids) const = 0;
  // Every id is below vocab_size() (the model's vocab plus added tokens, HF's get_vocab_size()).
  virtual std::uint64_t vocab_size() const = 0;
  // The id of a token given as its text (an added/special token, or a piece of the vocabulary).
  virtual std::optional<std::uint32_t> token_id(std::string_view token) const = 0;
  virtual std::optional<std::uint32_t> bos_id() const = 0;
  virtual std::optional<std::uint32_t> eos_id() const = 0;
  // (optional) The exact bytes token `id` stands for, when the tokens of a text concatenate to the
  // text (to its NFC form where normalizes_to_nfc()): byte-level BPE without a prefix space;
  // nullopt where they need not (SentencePiece). The chat loss mask maps tokens onto the rendered
  // text through it (models/chat_template.h).
  virtual std::optional<std::string> token_bytes(std::uint32_t id) const {
    (void)id;
    return std::nullopt;
  }
  // Whether text is brought to Unicode NFC before it is split into tokens (Qwen2's normalizer).
  virtual bool normalizes_to_nfc() const { return false; }

  const TokenizerIdentity& identity() const { return identity_; }

 protected:
  TokenizerIdentity identity_;
};

// Loads the tokenizer of a model folder (or a tokenizer.json / tokenizer.model given directly):
// tokenizer.json when it holds a byte-level BPE this build implements, else tokenizer.model (a
// SentencePiece folder's tokenizer.json is a conversion of it). An unsupported tokenizer.json with
// no tokenizer.model beside it is a FormatError naming the file, the field and what is supported.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_folder);
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& tokenizer_json);
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& tokenizer_model);

// FormatError when `text` is not valid UTF-8 (overlong forms, surrogates and code points above
// U+10FFFF included), naming `source`, the byte offset, line and column, and the fix.
void check_utf8(std::string_view text, std::string_view source);

// Encodes each document on its own, in parallel over documents on `threads` threads (oneTBB; 0:
// all cores). Each document is checked with check_utf8, named "`source` document N".
std::vector<std::vector<std::uint32_t>> encode_documents(const Tokenizer& tokenizer,
                                                         std::span<const std::string_view> documents,
                                                         int threads, std::string_view source);

const char* tokenizer_kind_name(TokenizerKind kind);

}  // namespace strata::models
