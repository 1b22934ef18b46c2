// Token data: token files, the byte-level tokenizer, deterministic batch sampling with a resumable
// position, consecutive evaluation windows, and the default demo corpus (Debian's `fortunes`).
//
// Token file formats, detected from the first bytes:
//  * Strata: a 64-byte header: magic "STRATOK1", u32 version (1 or 2), u32 token width in bytes (2
//    or 4), u64 token count, u64 vocabulary size (0: unknown), then in version 1 32 reserved zero
//    bytes, in version 2 (written by `strata data prepare`): u64 XXH64 of the tokenizer's file (0:
//    bytes), u64 identity of the sources (XXH64 over their contents and the options), u32 flags (bit
//    0: a loss mask follows the tokens), u32 tokenizer kind (0 bytes, 1 byte-level BPE, 2
//    SentencePiece), 8 reserved zero bytes; then the tokens (LE), then with the mask flag
//    ceil(count / 8) bytes of mask, bit t % 8 of byte t / 8 set when token t counts toward the loss
//    as a prediction target (0 for prompt tokens). Version 1 files are written when there is no
//    tokenizer and no mask, so older builds read them.
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
  // Version 2 metadata; 0 / false for other formats and versions.
  std::uint64_t tokenizer_hash() const { return tokenizer_hash_; }
  std::uint32_t tokenizer_kind() const { return tokenizer_kind_; }
  std::uint64_t source_hash() const { return source_hash_; }
  bool has_loss_mask() const { return mask_ != nullptr; }
  // Whether token i counts toward the loss as a target (true for files without a mask).
  bool counts_in_loss(std::size_t i) const { return mask_ == nullptr || ((mask_[i / 8] >> (i % 8)) & 1u) != 0; }
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
  std::uint64_t tokenizer_hash_ = 0, source_hash_ = 0;
  std::uint32_t tokenizer_kind_ = 0;
  const std::uint8_t* mask_ = nullptr;
};

// What a version 2 Strata token file records beside its tokens.
struct TokenFileMeta {
  std::uint64_t vocab_size = 0;
  std::uint64_t tokenizer_hash = 0;
  std::uint32_t tokenizer_kind = 0;  // 0 bytes, 1 byte-level BPE, 2 SentencePiece
  std::uint64_t source_hash = 0;
  // One entry per token (1: counts toward the loss), or empty for no mask.
  std::span<const std::uint8_t> loss_mask;
};

// Writes a Strata token file (width 2 if every token fits in uint16, else 4) atomically: version 1
// with only a vocabulary size, version 2 with a tokenizer or a mask.
void write_token_file(const std::string& path, std::span<const std::uint32_t> tokens, std::uint64_t vocab_size);
void write_token_file(const std::string& path, std::span<const std::uint32_t> tokens, const TokenFileMeta& meta);
// Writes an llm.c token file (version 1, uint16 tokens); for interoperability and tests.
void write_llmc_token_file(const std::string& path, std::span<const std::uint16_t> tokens);

// Byte-level tokenizer: one token per byte, vocabulary 256.
struct ByteTokenizer {
  static constexpr std::int64_t kVocabSize = 256;
  static std::vector<std::uint32_t> encode(std::string_view text);
  static std::string decode(std::span<const std::uint32_t> tokens);
};

// Note [Loss mask]: a token file's loss mask (written by `strata data prepare`: 0 on the prompt
// tokens of prompt/completion pairs) says which tokens count as prediction targets. The samplers
// below write kIgnoredTarget for target t of a window when token t's bit is 0 (the target is the
// token predicted, the input before it is not looked at), and every cross-entropy kernel
// (models/kernels/ops.h, the vocabulary-parallel ones too, on the CPU and in CUDA) gives an ignored
// target loss 0 and a gradient row of exact zeros, so a masked position contributes nothing to the
// loss or to any gradient, in exact and fast mode. Targets travel beside the tokens to wherever the
// head runs (the last pipeline stage, the first stage for a tied embedding across stages, every
// tensor rank), so every layout applies the mask with no code of its own. The loss is the mean over
// the counted targets of the whole step, as transformers' loss with labels -100 over one batch: the
// trainer (train/trainer.cc, step_target_count) counts the targets of every micro-batch of every data rank
// from the sampler (the same count on every rank, no collective) and seeds the loss gradient with
// units / count, which the engine's 1 / units (optim/optimizer_phase.h) turns into 1 / count; the
// reported loss is the sum of the per-token losses over the ranks divided by the same count. A
// window (or a whole step) with no counted target adds nothing: its gradient is zero and a step
// without any counted target reports loss 0, never NaN. `strata eval` averages over the counted
// targets of the windows the same way (models::LossSum).
inline constexpr std::int32_t kIgnoredTarget = -1;

// Draws windows of seq+1 tokens at pseudo-random offsets: window k's offset is a hash of (seed, k),
// so the sequence is fixed by the seed and resuming needs only the position (windows drawn so far).
struct SamplerState {
  std::uint64_t seed = 0;
  std::uint64_t position = 0;
};

class BatchSampler {
 public:
  BatchSampler(const TokenFile& data, std::int64_t batch, std::int64_t seq, std::uint64_t seed);
  // Fills inputs and targets ([batch, seq] int32 each; targets are inputs shifted by one token,
  // kIgnoredTarget where the file's loss mask leaves a token out, Note [Loss mask]).
  void next(std::int32_t* inputs, std::int32_t* targets);
  // The targets the next call of next() would count toward the loss (batch * seq without a mask);
  // the position is unchanged.
  std::int64_t counted_targets() const;
  SamplerState state() const { return state_; }
  void restore(const SamplerState& state) { state_ = state; }

 private:
  const TokenFile& data_;
  std::int64_t batch_, seq_;
  SamplerState state_;
};

// Consecutive windows from the start: window w covers tokens [w*seq, w*seq + seq] (inputs and the
// targets shifted by one, kIgnoredTarget where the loss mask leaves a token out). count() = (size - 1) / seq.
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
