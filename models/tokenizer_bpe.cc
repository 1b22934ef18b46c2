// Byte-level BPE, step for step as HF tokenizers' encode (add_special_tokens=False) of the same
// tokenizer.json: added tokens split off (leftmost-longest, the raw-text ones before
// normalization), NFC through ICU where the file asks for it, the Split regexes through PCRE2 (UTF,
// Unicode properties, JIT), the ByteLevel byte-to-unicode map, and merges lowest rank first, leftmost
// on ties (HF's Word::merge_all). The spec it runs is read in models/tokenizer_bpe_spec.cc.
#include "models/tokenizer_bpe.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <algorithm>
#include <memory>
#include <queue>

#include <fmt/format.h>

#include "core/error.h"
#include "models/tokenizer.h"
#include "models/tokenizer_added.h"
#include "models/tokenizer_regex.h"

namespace strata::models {

namespace {

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for U+0100 onwards.
std::array<std::string, 256> byte_level_chars() {
  std::array<std::string, 256> chars;
  std::uint32_t next = 256;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const std::uint32_t cp = printable ? b : next++;
    std::string& s = chars[b];
    if (cp < 0x80) {
      s = std::string(1, static_cast<char>(cp));
    } else {
      s = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
  }
  return chars;
}

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using WordCache = std::unordered_map<std::string, std::vector<std::uint32_t>, StringHash, std::equal_to<>>;

// Only short pieces are cached (HF's limit too): long ones are rare and would fill the cache.
constexpr std::size_t kMaxCachedPieceBytes = 256;
constexpr std::size_t kMaxCacheEntries = 1 << 17;

class BpeScratch final : public EncodeScratch {
 public:
  RegexMatcher matcher_;
  std::vector<AddedSplit> raw_splits_, normalized_splits_;
  WordCache cache_;
  std::string mapped_;
  std::vector<std::uint32_t> symbols_;
};

struct Merge {
  std::uint32_t rank;
  std::uint32_t new_id;
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeSpec spec);

  void encode_into(std::string_view text, EncodeScratch& scratch, std::vector<std::uint32_t>& out) const override;
  std::unique_ptr<EncodeScratch> new_scratch() const override { return std::make_unique<BpeScratch>(); }
  std::string decode(std::span<const std::uint32_t> ids) const override;
  std::uint64_t vocab_size() const override { return id_to_token_.size(); }
  std::optional<std::uint32_t> token_id(std::string_view token) const override;
  std::optional<std::uint32_t> bos_id() const override { return bos_; }
  std::optional<std::uint32_t> eos_id() const override { return eos_; }
  std::optional<std::string> token_bytes(std::uint32_t id) const override;
  bool normalizes_to_nfc() const override { return spec_.nfc; }

 private:
  std::string raw_bytes(std::uint32_t id) const;
  void encode_text(std::string_view text, BpeScratch& s, std::vector<std::uint32_t>& out) const;
  void split_normalized(std::string_view text, BpeScratch& s, std::vector<std::uint32_t>& out) const;
  void encode_segment(std::string_view text, BpeScratch& s, std::vector<std::uint32_t>& out) const;
  void pre_tokenize(std::string_view text, std::size_t level, BpeScratch& s, std::vector<std::uint32_t>& out) const;
  void encode_piece(std::string_view piece, BpeScratch& s, std::vector<std::uint32_t>& out) const;
  void merge(std::vector<std::uint32_t>& symbols) const;
  const Merge* find_merge(std::uint32_t left, std::uint32_t right) const {
    const auto it = merges_.find((std::uint64_t{left} << 32) | right);
    return it == merges_.end() ? nullptr : &it->second;
  }

  BpeSpec spec_;
  std::array<std::string, 256> byte_chars_;
  std::array<std::int64_t, 256> byte_ids_{};  // -1: the byte's character is not in the vocab
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::unordered_map<std::string, std::uint32_t, StringHash, std::equal_to<>> added_ids_;
  std::unordered_map<std::uint32_t, std::string> added_by_id_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, std::uint8_t> char_to_byte_;
  AddedTokenMatcher raw_added_, normalized_added_;  // HF's split_trie and split_normalized_trie
  std::vector<Regex> splits_;
  const icu::Normalizer2* nfc_ = nullptr;
  std::optional<std::uint32_t> bos_, eos_;
};

BpeTokenizer::BpeTokenizer(BpeSpec spec) : spec_(std::move(spec)), byte_chars_(byte_level_chars()) {
  identity_ = {TokenizerKind::ByteLevelBpe, spec_.path, spec_.file_hash};
  std::uint64_t size = 0;
  for (const auto& [token, id] : spec_.vocab) size = std::max<std::uint64_t>(size, std::uint64_t{id} + 1);
  for (const auto& t : spec_.added) size = std::max<std::uint64_t>(size, std::uint64_t{t.id} + 1);
  // Ids are dense in every published tokenizer; one far beyond the token count is damage, and would
  // make the id -> token table as large as the id.
  const std::uint64_t entries = spec_.vocab.size() + spec_.added.size();
  if (size > 2 * entries + 1024) {
    throw FormatError(fmt::format("tokenizer.json '{}': model.vocab or added_tokens use id {} for {} tokens; the ids "
                                  "must be numbered from 0 without large gaps (the file is damaged)",
                                  spec_.path, size - 1, entries));
  }
  id_to_token_.resize(size);
  for (const auto& [token, id] : spec_.vocab) id_to_token_[id] = token;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const auto it = spec_.vocab.find(byte_chars_[b]);
    byte_ids_[b] = it == spec_.vocab.end() ? std::int64_t{-1} : std::int64_t{it->second};
    char_to_byte_.emplace(byte_chars_[b], static_cast<std::uint8_t>(b));
  }
  merges_.reserve(spec_.merges.size());
  for (std::size_t rank = 0; rank < spec_.merges.size(); ++rank) {
    const auto& [a, b] = spec_.merges[rank];
    const auto ia = spec_.vocab.find(a), ib = spec_.vocab.find(b), ab = spec_.vocab.find(a + b);
    if (ia == spec_.vocab.end() || ib == spec_.vocab.end() || ab == spec_.vocab.end()) {
      throw FormatError(fmt::format("tokenizer.json '{}': model.merges[{}] (\"{} {}\") names a token missing from "
                                    "model.vocab; the file is damaged",
                                    spec_.path, rank, a, b));
    }
    // A pair listed twice keeps its first (lowest) rank, as HF's merge map does.
    merges_.emplace((std::uint64_t{ia->second} << 32) | ib->second, Merge{static_cast<std::uint32_t>(rank), ab->second});
  }
  if (spec_.nfc) {
    UErrorCode status = U_ZERO_ERROR;
    nfc_ = icu::Normalizer2::getNFCInstance(status);
    STRATA_CHECK(U_SUCCESS(status) && nfc_ != nullptr, "ICU's NFC normalizer is unavailable: {}", u_errorName(status));
  }
  // HF matches `normalized` tokens, normalized themselves, after the normalizer; the others before.
  std::vector<BpeAddedToken> raw, normalized;
  for (const auto& t : spec_.added) {
    added_ids_[t.content] = t.id;
    added_by_id_[t.id] = t.content;
    if (!t.normalized) {
      raw.push_back(t);
      continue;
    }
    BpeAddedToken n = t;
    if (nfc_ != nullptr) {
      UErrorCode status = U_ZERO_ERROR;
      n.content.clear();
      icu::StringByteSink<std::string> sink(&n.content);
      nfc_->normalizeUTF8(0, icu::StringPiece(t.content.data(), static_cast<std::int32_t>(t.content.size())), sink,
                          nullptr, status);
      STRATA_CHECK(U_SUCCESS(status), "ICU NFC normalization failed: {}", u_errorName(status));
      added_ids_.emplace(n.content, n.id);
    }
    normalized.push_back(std::move(n));
  }
  raw_added_ = AddedTokenMatcher(std::move(raw), spec_.path);
  normalized_added_ = AddedTokenMatcher(std::move(normalized), spec_.path);
  for (std::size_t i = 0; i < spec_.split_patterns.size(); ++i) {
    splits_.push_back(compile_regex(spec_.split_patterns[i], spec_.path, fmt::format("the pre-tokenizer's split pattern {}", i + 1)));
  }
  if (spec_.bos_token) bos_ = token_id(*spec_.bos_token);
  if (spec_.eos_token) eos_ = token_id(*spec_.eos_token);
}

std::optional<std::uint32_t> BpeTokenizer::token_id(std::string_view token) const {
  if (const auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
  if (const auto it = spec_.vocab.find(std::string(token)); it != spec_.vocab.end()) return it->second;
  return std::nullopt;
}

void BpeTokenizer::encode_into(std::string_view text, EncodeScratch& scratch, std::vector<std::uint32_t>& out) const {
  try {
    encode_text(text, static_cast<BpeScratch&>(scratch), out);
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("tokenizer.json '{}': {}", spec_.path, e.what()));
  }
}

void BpeTokenizer::encode_text(std::string_view text, BpeScratch& s, std::vector<std::uint32_t>& out) const {
  raw_added_.split(text, s.matcher_, s.raw_splits_);
  for (const AddedSplit& r : s.raw_splits_) {
    if (r.id >= 0) {
      out.push_back(static_cast<std::uint32_t>(r.id));
      continue;
    }
    const std::string_view segment = text.substr(r.begin, r.end - r.begin);
    UErrorCode status = U_ZERO_ERROR;
    const icu::StringPiece piece(segment.data(), static_cast<std::int32_t>(segment.size()));
    if (nfc_ == nullptr || (nfc_->isNormalizedUTF8(piece, status) && U_SUCCESS(status))) {
      split_normalized(segment, s, out);
      continue;
    }
    std::string normalized;  // own buffer: the scratch's are in use further down
    icu::StringByteSink<std::string> sink(&normalized);
    status = U_ZERO_ERROR;
    nfc_->normalizeUTF8(0, piece, sink, nullptr, status);
    STRATA_CHECK(U_SUCCESS(status), "ICU NFC normalization failed: {}", u_errorName(status));
    split_normalized(normalized, s, out);
  }
}

void BpeTokenizer::split_normalized(std::string_view text, BpeScratch& s, std::vector<std::uint32_t>& out) const {
  if (normalized_added_.empty()) return encode_segment(text, s, out);
  // Its own vector: encode_into is iterating raw_splits_.
  normalized_added_.split(text, s.matcher_, s.normalized_splits_);
  for (const AddedSplit& n : s.normalized_splits_) {
    if (n.id >= 0) {
      out.push_back(static_cast<std::uint32_t>(n.id));
    } else {
      encode_segment(text.substr(n.begin, n.end - n.begin), s, out);
    }
  }
}

void BpeTokenizer::encode_segment(std::string_view text, BpeScratch& s, std::vector<std::uint32_t>& out) const {
  if (text.empty()) return;
  if (spec_.add_prefix_space && text.front() != ' ') {
    // HF's ByteLevel prepends the space to every segment between added tokens, not only the first.
    std::string prefixed = " ";
    prefixed.append(text);
    return pre_tokenize(prefixed, 0, s, out);
  }
  pre_tokenize(text, 0, s, out);
}

// Split `level` (Isolated: matches and the text between them are pieces), then the next split.
void BpeTokenizer::pre_tokenize(std::string_view text, std::size_t level, BpeScratch& s, std::vector<std::uint32_t>& out) const {
  if (level == splits_.size()) return encode_piece(text, s, out);
  const pcre2_code* re = splits_[level].get();
  std::size_t done = 0, from = 0, begin = 0, end = 0;
  while (from < text.size() && s.matcher_.find(re, text, from, &begin, &end)) {
    if (end == begin) {  // an empty match splits nothing; step over one character
      from = begin + 1;
      while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
      continue;
    }
    if (begin > done) pre_tokenize(text.substr(done, begin - done), level + 1, s, out);
    pre_tokenize(text.substr(begin, end - begin), level + 1, s, out);
    done = from = end;
  }
  if (done < text.size()) pre_tokenize(text.substr(done), level + 1, s, out);
}

void BpeTokenizer::encode_piece(std::string_view piece, BpeScratch& s, std::vector<std::uint32_t>& out) const {
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    if (const auto it = s.cache_.find(piece); it != s.cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<std::uint32_t>& symbols = s.symbols_;
  symbols.clear();
  bool whole = false;
  if (spec_.ignore_merges) {
    s.mapped_.clear();
    for (char c : piece) s.mapped_ += byte_chars_[static_cast<unsigned char>(c)];
    if (const auto it = spec_.vocab.find(s.mapped_); it != spec_.vocab.end()) {
      symbols.push_back(it->second);
      whole = true;
    }
  }
  if (!whole) {
    bool last_unk = false;
    for (char c : piece) {
      const std::int64_t id = byte_ids_[static_cast<unsigned char>(c)];
      if (id >= 0) {
        symbols.push_back(static_cast<std::uint32_t>(id));
        last_unk = false;
      } else if (spec_.unk_id) {  // a character missing from the vocab: HF's unk, or nothing
        if (!(spec_.fuse_unk && last_unk)) symbols.push_back(*spec_.unk_id);
        last_unk = true;
      }
    }
    merge(symbols);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (cacheable) {
    if (s.cache_.size() >= kMaxCacheEntries) s.cache_.clear();
    s.cache_.emplace(std::string(piece), symbols);
  }
}

// HF's Word::merge_all: a queue of candidate pairs ordered by (rank, position); a popped pair whose
// symbols changed since it was queued is stale and skipped.
void BpeTokenizer::merge(std::vector<std::uint32_t>& symbols) const {
  const std::size_t n = symbols.size();
  if (n < 2) return;
  struct Candidate {
    std::uint32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<std::int64_t> prev(n), next(n);
  std::vector<bool> gone(n, false);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<std::int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<std::int64_t>(i + 1) : -1;
    if (i + 1 < n) {
      if (const Merge* m = find_merge(symbols[i], symbols[i + 1])) queue.push({m->rank, static_cast<std::uint32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    if (gone[top.pos] || next[top.pos] < 0) continue;
    const auto right = static_cast<std::size_t>(next[top.pos]);
    const Merge* m = find_merge(symbols[top.pos], symbols[right]);
    if (m == nullptr || m->new_id != top.new_id) continue;
    symbols[top.pos] = top.new_id;
    gone[right] = true;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[static_cast<std::size_t>(next[right])] = top.pos;
    if (prev[top.pos] >= 0) {
      const auto p = static_cast<std::size_t>(prev[top.pos]);
      if (const Merge* pm = find_merge(symbols[p], symbols[top.pos])) queue.push({pm->rank, static_cast<std::uint32_t>(p), pm->new_id});
    }
    if (next[top.pos] >= 0) {
      const auto q = static_cast<std::size_t>(next[top.pos]);
      if (const Merge* nm = find_merge(symbols[top.pos], symbols[q])) queue.push({nm->rank, top.pos, nm->new_id});
    }
  }
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!gone[i]) symbols[kept++] = symbols[i];
  }
  symbols.resize(kept);
}

std::string BpeTokenizer::raw_bytes(std::uint32_t id) const {
  const auto added = added_by_id_.find(id);
  const std::string& token = added != added_by_id_.end() ? added->second : id_to_token_[id];
  // HF's ByteLevel decoder: a token made of byte-level characters gives their bytes; one with any
  // other character (an added token like "<|endoftext|>" mostly is not) gives its own UTF-8.
  std::string mapped;
  for (std::size_t i = 0; i < token.size();) {
    const std::size_t len = (static_cast<unsigned char>(token[i]) & 0x80) == 0 ? 1 : 2;
    const auto it = char_to_byte_.find(token.substr(i, len));
    if (it == char_to_byte_.end()) return token;
    mapped.push_back(static_cast<char>(it->second));
    i += len;
  }
  return mapped;
}

std::optional<std::string> BpeTokenizer::token_bytes(std::uint32_t id) const {
  // With a prefix space the tokens add up to more than the text.
  if (id >= id_to_token_.size() || spec_.add_prefix_space) return std::nullopt;
  return raw_bytes(id);
}

std::string BpeTokenizer::decode(std::span<const std::uint32_t> ids) const {
  std::string bytes;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const std::uint32_t id = ids[k];
    if (id >= id_to_token_.size()) {
      throw FormatError(fmt::format("token {} at position {} is outside the vocabulary of {} tokens of '{}'", id, k,
                                    id_to_token_.size(), spec_.path));
    }
    bytes += raw_bytes(id);
  }
  return utf8_lossy(bytes);
}

}  // namespace

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& tokenizer_json) {
  return std::make_unique<BpeTokenizer>(read_bpe_spec(tokenizer_json));
}

}  // namespace strata::models
