// Token data: token files, the byte-level tokenizer, deterministic batch sampling with a resumable
// position, consecutive evaluation windows, and the default demo corpus (Debian's `fortunes`).
//
// Token file formats, detected from the first bytes:
//  * Strata: a 64-byte header: magic "STRATOK1", u32 version (1), u32 token width in bytes (2 or 4),
//    u64 token count, u64 vocabulary size (0: unknown), 32 reserved zero bytes; then the tokens (LE).
//  * llm.c: a 256 x int32 header: magic 20240520, version (1: uint16 tokens, 2: uint32 tokens),
//    token count; then the tokens.
//  * flat: nanoGPT's train.bin/val.bin, raw little-endian uint16 (or uint32 when asked) tokens.
// The file is mapped read-only; a size that disagrees with the header is a FormatError naming the
// file and both sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata::models {

enum class TokenFileFormat { Strata, LlmC, Flat };
enum class FlatTokenWidth { U16, U32 };

class TokenFile {
 public:
  // Throws IoError (cannot open/map) or FormatError (bad header or size).
  static TokenFile open(const std::string& path, FlatTokenWidth flat_width = FlatTokenWidth::U16);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  TokenFileFormat format() const { return format_; }
  std::size_t size() const { return count_; }
  std::size_t token_bytes() const { return width_; }
  std::uint64_t declared_vocab_size() const { return vocab_; }  // 0 when the format has none
  std::uint32_t operator[](std::size_t i) const;

  // FormatError naming the file, the position and the token if any token is >= vocab_size.
  void check_vocab(std::int64_t vocab_size) const;

 private:
  TokenFile() = default;
  std::string path_;
  TokenFileFormat format_ = TokenFileFormat::Flat;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const std::uint8_t* tokens_ = nullptr;
  std::size_t count_ = 0;
  std::size_t width_ = 2;
  std::uint64_t vocab_ = 0;
};

// Writes a Strata token file (width 2 if every token fits in uint16, else 4) atomically.
void write_token_file(const std::string& path, std::span<const std::uint32_t> tokens, std::uint64_t vocab_size);
// Writes an llm.c token file (version 1, uint16 tokens); for interoperability and tests.
void write_llmc_token_file(const std::string& path, std::span<const std::uint16_t> tokens);

// Byte-level tokenizer: one token per byte, vocabulary 256.
struct ByteTokenizer {
  static constexpr std::int64_t kVocabSize = 256;
  static std::vector<std::uint32_t> encode(std::string_view text);
  static std::string decode(std::span<const std::uint32_t> tokens);
};

// Draws windows of seq+1 tokens at pseudo-random offsets: window k's offset is a hash of (seed, k),
// so the sequence is fixed by the seed and resuming needs only the position (windows drawn so far).
struct SamplerState {
  std::uint64_t seed = 0;
  std::uint64_t position = 0;
};

class BatchSampler {
 public:
  BatchSampler(const TokenFile& data, std::int64_t batch, std::int64_t seq, std::uint64_t seed);
  // Fills inputs and targets ([batch, seq] int32 each; targets are inputs shifted by one token).
  void next(std::int32_t* inputs, std::int32_t* targets);
  SamplerState state() const { return state_; }
  void restore(const SamplerState& state) { state_ = state; }

 private:
  const TokenFile& data_;
  std::int64_t batch_, seq_;
  SamplerState state_;
};

// Consecutive windows from the start: window w covers tokens [w*seq, w*seq + seq] (inputs and the
// targets shifted by one). count() = (size - 1) / seq.
class ConsecutiveWindows {
 public:
  ConsecutiveWindows(const TokenFile& data, std::int64_t seq);
  std::int64_t count() const { return count_; }
  void window(std::int64_t w, std::int32_t* inputs, std::int32_t* targets) const;

 private:
  const TokenFile& data_;
  std::int64_t seq_, count_;
};

// The `fortunes` corpus: every regular fortune file under `dir` (the .dat indexes and .u8 links
// skipped), split into entries at "%" lines, every 10th entry to validation. Deterministic.
struct TextCorpus {
  std::string train, validation;
  std::size_t files = 0, entries = 0;
};
inline constexpr const char* kDefaultFortunesDir = "/usr/share/games/fortunes";
TextCorpus load_fortunes(const std::string& dir = kDefaultFortunesDir);
// Writes train.tok and val.tok (byte tokens, Strata format) under out_dir; returns the corpus.
TextCorpus prepare_fortunes_token_files(const std::string& out_dir, const std::string& fortunes_dir = kDefaultFortunesDir);

}  // namespace strata::models
