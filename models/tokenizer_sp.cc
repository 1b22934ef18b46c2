// SentencePiece tokenizer.model (LLaMA 2, Mistral 7B v0.1) through libsentencepiece: the library
// encodes and decodes; this file adapts it to the Tokenizer interface and turns its status codes
// into one message naming the file.
#include <sentencepiece_processor.h>

#include <fmt/format.h>
#include <xxhash.h>

#include "core/error.h"
#include "core/file_io.h"
#include "models/tokenizer.h"

namespace strata::models {

namespace {

// SentencePiece keeps no per-call state worth reusing; its Encode is const and thread-safe.
class SpScratch final : public EncodeScratch {
 public:
  std::vector<int> ids;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) {
    const std::string bytes = read_text_file(path, "tokenizer.model");
    identity_ = {TokenizerKind::SentencePiece, path, XXH64(bytes.data(), bytes.size(), 0)};
    const auto status = processor_.LoadFromSerializedProto(bytes);
    if (!status.ok()) {
      throw FormatError(fmt::format("tokenizer.model '{}' is not a SentencePiece model ({}); download it again or "
                                    "give the folder's tokenizer.json",
                                    path, status.ToString()));
    }
  }

  void encode_into(std::string_view text, EncodeScratch& scratch, std::vector<std::uint32_t>& out) const override {
    auto& s = static_cast<SpScratch&>(scratch);
    s.ids.clear();
    const auto status = processor_.Encode(text, &s.ids);
    STRATA_CHECK(status.ok(), "SentencePiece Encode of {} bytes with '{}' failed: {}", text.size(), identity_.path,
                 status.ToString());
    out.insert(out.end(), s.ids.begin(), s.ids.end());
  }
  std::unique_ptr<EncodeScratch> new_scratch() const override { return std::make_unique<SpScratch>(); }

  std::string decode(std::span<const std::uint32_t> ids) const override {
    std::vector<int> pieces(ids.begin(), ids.end());
    for (std::size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] >= vocab_size()) {
        throw FormatError(fmt::format("token {} at position {} is outside the vocabulary of {} tokens of '{}'", ids[k],
                                      k, vocab_size(), identity_.path));
      }
    }
    std::string text;
    const auto status = processor_.Decode(pieces, &text);
    STRATA_CHECK(status.ok(), "SentencePiece Decode with '{}' failed: {}", identity_.path, status.ToString());
    return text;
  }

  std::uint64_t vocab_size() const override { return static_cast<std::uint64_t>(processor_.GetPieceSize()); }
  std::optional<std::uint32_t> token_id(std::string_view token) const override {
    const int id = processor_.PieceToId(token);
    // PieceToId answers unk for an unknown piece; only the unk piece itself maps there truly.
    if (id < 0 || (id == processor_.unk_id() && processor_.IdToPiece(id) != token)) return std::nullopt;
    return static_cast<std::uint32_t>(id);
  }
  std::optional<std::uint32_t> bos_id() const override { return valid(processor_.bos_id()); }
  std::optional<std::uint32_t> eos_id() const override { return valid(processor_.eos_id()); }

 private:
  static std::optional<std::uint32_t> valid(int id) {
    return id >= 0 ? std::optional<std::uint32_t>(static_cast<std::uint32_t>(id)) : std::nullopt;
  }
  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& tokenizer_model) {
  return std::make_unique<SentencePieceTokenizer>(tokenizer_model);
}

}  // namespace strata::models
