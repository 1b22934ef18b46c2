// The tokenizer front: picking the file of a model folder, the UTF-8 check every input passes, and
// encoding many documents in parallel (see models/tokenizer.h).
#include "models/tokenizer.h"

#include <filesystem>

#include <fmt/format.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "core/error.h"
#include "core/log.h"

namespace strata::models {

// The length of the UTF-8 sequence starting at text[i], or 0 when none starts there, with the
// reason. Follows RFC 3629 (what Rust's str and PCRE2's UTF check accept).
static std::size_t utf8_sequence_bytes(std::string_view text, std::size_t i, const char** why) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong below
    if (b0 == 0xED) hi = 0x9F;  // UTF-16 surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    *why = b0 < 0xC2 && b0 >= 0xC0 ? "an overlong encoding" : (b0 < 0xC0 ? "a continuation byte with no lead byte"
                                                                         : "a byte that never occurs in UTF-8");
    return 0;
  }
  if (i + n > text.size()) {
    *why = "a character cut off by the end of the text";
    return 0;
  }
  for (std::size_t k = 1; k < n; ++k) {
    const unsigned char b = byte(i + k);
    const unsigned char min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) {
      *why = k == 1 && (b >= 0x80 && b <= 0xBF) ? "an overlong form, a surrogate or a code point above U+10FFFF"
                                                 : "a character whose continuation bytes are missing";
      return 0;
    }
  }
  return n;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  std::size_t i = 0;
  while (i < bytes.size()) {
    const char* why = nullptr;
    const std::size_t n = utf8_sequence_bytes(bytes, i, &why);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
      continue;
    }
    // One U+FFFD per maximal invalid subpart (Unicode's recommended practice, Rust's
    // from_utf8_lossy): a lead byte with the continuation bytes that were still acceptable.
    std::size_t skip = 1;
    const auto b0 = static_cast<unsigned char>(bytes[i]);
    if (b0 >= 0xC2 && b0 <= 0xF4) {
      const std::size_t want = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
      while (skip < want && i + skip < bytes.size()) {
        const auto b = static_cast<unsigned char>(bytes[i + skip]);
        unsigned char lo = 0x80, hi = 0xBF;
        if (skip == 1 && b0 == 0xE0) lo = 0xA0;
        if (skip == 1 && b0 == 0xED) hi = 0x9F;
        if (skip == 1 && b0 == 0xF0) lo = 0x90;
        if (skip == 1 && b0 == 0xF4) hi = 0x8F;
        if (b < lo || b > hi) break;
        ++skip;
      }
    }
    out.append("\xEF\xBF\xBD");
    i += skip;
  }
  return out;
}

const char* tokenizer_kind_name(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::ByteLevelBpe: return "byte-level BPE";
    case TokenizerKind::SentencePiece: return "SentencePiece";
  }
  return "?";
}

void check_utf8(std::string_view text, std::string_view source) {
  std::size_t i = 0;
  while (i < text.size()) {
    // ASCII runs are most text; skip them eight bytes at a time.
    while (i + 8 <= text.size()) {
      std::uint64_t w;
      __builtin_memcpy(&w, text.data() + i, 8);
      if ((w & 0x8080808080808080ull) != 0) break;
      i += 8;
    }
    if (i >= text.size()) break;
    const char* why = nullptr;
    const std::size_t n = utf8_sequence_bytes(text, i, &why);
    if (n == 0) {
      std::size_t line = 1, line_start = 0;
      for (std::size_t k = 0; k < i; ++k) {
        if (text[k] == '\n') ++line, line_start = k + 1;
      }
      throw FormatError(fmt::format("{} is not valid UTF-8 at byte {} (line {}, byte {} of the line): 0x{:02x} is {}; "
                                    "convert the file to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8) or remove the byte",
                                    source, i, line, i - line_start + 1, static_cast<unsigned char>(text[i]), why));
    }
    i += n;
  }
}

std::vector<std::uint32_t> Tokenizer::encode(std::string_view text, std::string_view source) const {
  check_utf8(text, source);
  std::vector<std::uint32_t> out;
  out.reserve(text.size() / 3);
  const auto scratch = new_scratch();
  encode_into(text, *scratch, out);
  return out;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(model_folder, ec)) {
    const std::string name = fs::path(model_folder).filename().string();
    if (name.ends_with(".json")) return load_bpe_tokenizer(model_folder);
    if (name.ends_with(".model")) return load_sentencepiece_tokenizer(model_folder);
    throw ConfigError(fmt::format("tokenizer '{}': give a model folder, a tokenizer.json or a tokenizer.model",
                                  model_folder));
  }
  if (!fs::is_directory(model_folder, ec)) {
    throw ConfigError(fmt::format("tokenizer folder '{}' does not exist; give the model folder holding "
                                  "tokenizer.json or tokenizer.model",
                                  model_folder));
  }
  const std::string json = (fs::path(model_folder) / "tokenizer.json").string();
  const std::string sp = (fs::path(model_folder) / "tokenizer.model").string();
  const bool have_json = fs::exists(json, ec), have_sp = fs::exists(sp, ec);
  if (have_json) {
    try {
      return load_bpe_tokenizer(json);
    } catch (const FormatError& e) {
      if (!have_sp) throw;
      // A SentencePiece folder's tokenizer.json (Metaspace, byte fallback) converts tokenizer.model.
      spdlog::info("{}; using '{}' beside it", e.what(), sp);
    }
  }
  if (have_sp) return load_sentencepiece_tokenizer(sp);
  throw ConfigError(fmt::format("model folder '{}' has neither tokenizer.json nor tokenizer.model; copy the "
                                "tokenizer files of the model (Hugging Face folders ship them)",
                                model_folder));
}

std::vector<std::vector<std::uint32_t>> encode_documents(const Tokenizer& tokenizer,
                                                         std::span<const std::string_view> documents,
                                                         int threads, std::string_view source) {
  std::vector<std::vector<std::uint32_t>> out(documents.size());
  tbb::enumerable_thread_specific<std::unique_ptr<EncodeScratch>> scratch([&] { return tokenizer.new_scratch(); });
  const auto encode_range = [&](const tbb::blocked_range<std::size_t>& r) {
    EncodeScratch& s = *scratch.local();
    for (std::size_t d = r.begin(); d != r.end(); ++d) {
      check_utf8(documents[d], fmt::format("{} document {}", source, d + 1));
      out[d].reserve(documents[d].size() / 3);
      tokenizer.encode_into(documents[d], s, out[d]);
    }
  };
  tbb::task_arena arena(threads > 0 ? threads : tbb::task_arena::automatic);
  // Small grains balance documents of very different lengths.
  arena.execute([&] { tbb::parallel_for(tbb::blocked_range<std::size_t>(0, documents.size(), 16), encode_range); });
  return out;
}

}  // namespace strata::models
