// Token files, byte tokenizer, samplers and the fortunes corpus (see models/token_data.h).
#include "models/token_data.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/file_io.h"

namespace strata::models {

namespace {

constexpr char kStrataMagic[8] = {'S', 'T', 'R', 'A', 'T', 'O', 'K', '1'};
constexpr std::size_t kStrataHeaderBytes = 64;
constexpr std::uint32_t kFlagLossMask = 1;
constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::size_t kLlmcHeaderBytes = 256 * sizeof(std::int32_t);

template <typename T>
T load_le(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // x86-64 and every target Strata builds for are little-endian
  return v;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw FormatError(fmt::format("token file '{}': {}", path, what));
}

// What a token file's header says (a flat file has none: its size does).
struct TokenHeader {
  TokenFileFormat format = TokenFileFormat::Flat;
  std::size_t width = 2;
  std::uint64_t vocab = 0;
  std::uint64_t tokenizer_hash = 0, source_hash = 0;
  std::uint32_t tokenizer_kind = 0;
  std::uint32_t flags = 0;
  std::size_t bytes = 0;      // the header's
  std::uint64_t declared = 0;  // tokens
  bool has_count = false;      // the header declares the count (else the size gives it)
};

TokenHeader read_strata_header(const std::string& path, const std::uint8_t* head, std::uint64_t size) {
  if (size < kStrataHeaderBytes) bad(path, fmt::format("the file has {} bytes, fewer than its 64-byte header; it is truncated", size));
  TokenHeader h;
  h.format = TokenFileFormat::Strata;
  const auto version = load_le<std::uint32_t>(head + 8);
  if (version != 1 && version != 2) {
    bad(path, fmt::format("unsupported Strata token file version {} (this build reads 1 and 2); a newer Strata wrote it",
                          version));
  }
  h.width = load_le<std::uint32_t>(head + 12);
  if (h.width != 2 && h.width != 4) bad(path, fmt::format("token width {} bytes in the header; it must be 2 or 4", h.width));
  h.declared = load_le<std::uint64_t>(head + 16);
  h.vocab = load_le<std::uint64_t>(head + 24);
  if (version == 2) {
    h.tokenizer_hash = load_le<std::uint64_t>(head + 32);
    h.source_hash = load_le<std::uint64_t>(head + 40);
    h.flags = load_le<std::uint32_t>(head + 48);
    h.tokenizer_kind = load_le<std::uint32_t>(head + 52);
    if ((h.flags & ~kFlagLossMask) != 0) {
      bad(path, fmt::format("header flags 0x{:x} hold bits this build does not know; a newer Strata wrote it", h.flags));
    }
  }
  h.bytes = kStrataHeaderBytes;
  h.has_count = true;
  return h;
}

TokenHeader read_llmc_header(const std::string& path, const std::uint8_t* head, std::uint64_t size) {
  if (size < kLlmcHeaderBytes) bad(path, fmt::format("the file has {} bytes, fewer than its 1024-byte llm.c header; it is truncated", size));
  TokenHeader h;
  h.format = TokenFileFormat::LlmC;
  const auto version = load_le<std::int32_t>(head + 4);
  if (version != 1 && version != 2) bad(path, fmt::format("unsupported llm.c token file version {} (1: uint16, 2: uint32)", version));
  h.width = version == 1 ? 2 : 4;
  const auto count = load_le<std::int32_t>(head + 8);
  if (count < 0) bad(path, fmt::format("negative token count {} in the llm.c header", count));
  h.declared = static_cast<std::uint64_t>(count);
  h.bytes = kLlmcHeaderBytes;
  h.has_count = true;
  return h;
}

TokenHeader flat_header(const std::string& path, FlatTokenWidth flat_width, std::uint64_t size) {
  TokenHeader h;
  h.format = TokenFileFormat::Flat;
  h.width = flat_width == FlatTokenWidth::U16 ? 2 : 4;
  if (size % h.width != 0) {
    bad(path, fmt::format("a flat uint{} token file must be a multiple of {} bytes, this one has {}; it is truncated "
                          "or has another format",
                          8 * h.width, h.width, size));
  }
  h.declared = size / h.width;
  return h;
}

}  // namespace

TokenFile TokenFile::open(const std::string& path, FlatTokenWidth flat_width) {
  const UniqueFd fd = open_for_read(path, "token file");
  const std::uint64_t size = file_size_bytes(fd.get(), path);
  TokenFile f;
  f.path_ = path;
  std::uint8_t head[kLlmcHeaderBytes] = {};
  read_exact(fd.get(), head, static_cast<std::size_t>(std::min<std::uint64_t>(size, sizeof head)), 0, path);
  TokenHeader h;
  if (size >= 8 && std::memcmp(head, kStrataMagic, 8) == 0) {
    h = read_strata_header(path, head, size);
  } else if (size >= 4 && load_le<std::int32_t>(head) == kLlmcMagic) {
    h = read_llmc_header(path, head, size);
  } else {
    h = flat_header(path, flat_width, size);
  }
  f.format_ = h.format;
  f.width_ = h.width;
  f.vocab_ = h.vocab;
  f.tokenizer_hash_ = h.tokenizer_hash;
  f.source_hash_ = h.source_hash;
  f.tokenizer_kind_ = h.tokenizer_kind;
  const std::size_t header = h.bytes;
  const std::uint64_t declared = h.declared;
  // The loss mask (version 2) follows the tokens: one bit per token.
  const std::uint64_t mask_bytes = (h.flags & kFlagLossMask) != 0 ? (declared / 8 + (declared % 8 != 0 ? 1 : 0)) : 0;
  if (size - header < mask_bytes) bad(path, fmt::format("the file has {} bytes, fewer than its header and loss mask; it is truncated", size));
  const std::uint64_t payload = size - header - mask_bytes;
  // declared * width must not wrap: 2^63 two-byte tokens would "fit" in an empty file.
  if (h.has_count && (declared > payload / f.width_ || payload != declared * f.width_)) {
    bad(path, fmt::format("the header declares {} tokens ({} bytes) but the file holds {} bytes after the header; it is "
                          "{}",
                          declared,
                          declared > ~std::uint64_t{0} / f.width_ ? "over 2^64" : std::to_string(declared * f.width_),
                          payload,
                          declared > payload / f.width_ ? "truncated" : "corrupt"));
  }
  f.count_ = declared;
  if (size > 0) {
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      throw IoError(fmt::format("cannot map token file '{}' ({} bytes): {}", path, size, errno_text(err)), err);
    }
    f.map_ = map;
    f.map_bytes_ = size;
    f.tokens_ = static_cast<const std::uint8_t*>(map) + header;
    if (mask_bytes > 0) f.mask_ = f.tokens_ + declared * f.width_;
  }
  return f;
}

TokenFile::TokenFile(TokenFile&& other) noexcept { *this = std::move(other); }

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
    path_ = std::move(other.path_);
    format_ = other.format_;
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
    width_ = other.width_;
    vocab_ = other.vocab_;
    tokenizer_hash_ = other.tokenizer_hash_;
    source_hash_ = other.source_hash_;
    tokenizer_kind_ = other.tokenizer_kind_;
    mask_ = std::exchange(other.mask_, nullptr);
  }
  return *this;
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

std::uint32_t TokenFile::operator[](std::size_t i) const {
  return width_ == 2 ? load_le<std::uint16_t>(tokens_ + 2 * i) : load_le<std::uint32_t>(tokens_ + 4 * i);
}

void TokenFile::check_vocab(std::int64_t vocab_size) const {
  if (vocab_ != 0 && (vocab_size < 0 || vocab_ > static_cast<std::uint64_t>(vocab_size))) {
    bad(path_, fmt::format("it was written for a vocabulary of {} tokens, the model has {}", vocab_, vocab_size));
  }
  for (std::size_t i = 0; i < count_; ++i) {
    const std::uint32_t t = (*this)[i];
    if (static_cast<std::int64_t>(t) >= vocab_size) {
      bad(path_, fmt::format("token {} at position {} is outside the model's vocabulary of {}; the data was tokenized "
                             "for another model",
                             t, i, vocab_size));
    }
  }
}

void write_token_file(const std::string& path, std::span<const std::uint32_t> tokens, std::uint64_t vocab_size) {
  TokenFileMeta meta;
  meta.vocab_size = vocab_size;
  write_token_file(path, tokens, meta);
}

void write_token_file(const std::string& path, std::span<const std::uint32_t> tokens, const TokenFileMeta& meta) {
  STRATA_CHECK(meta.loss_mask.empty() || meta.loss_mask.size() == tokens.size(), "loss mask of {} entries for {} tokens",
               meta.loss_mask.size(), tokens.size());
  const bool narrow = std::all_of(tokens.begin(), tokens.end(), [](std::uint32_t t) { return t <= 0xFFFFu; });
  const bool v2 = meta.tokenizer_hash != 0 || meta.tokenizer_kind != 0 || meta.source_hash != 0 || !meta.loss_mask.empty();
  std::uint8_t header[kStrataHeaderBytes] = {};
  std::memcpy(header, kStrataMagic, 8);
  const std::uint32_t version = v2 ? 2 : 1, width = narrow ? 2 : 4;
  const std::uint64_t count = tokens.size();
  const std::uint32_t flags = meta.loss_mask.empty() ? 0 : kFlagLossMask;
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &width, 4);
  std::memcpy(header + 16, &count, 8);
  std::memcpy(header + 24, &meta.vocab_size, 8);
  if (v2) {
    std::memcpy(header + 32, &meta.tokenizer_hash, 8);
    std::memcpy(header + 40, &meta.source_hash, 8);
    std::memcpy(header + 48, &flags, 4);
    std::memcpy(header + 52, &meta.tokenizer_kind, 4);
  }
  AtomicFileWriter out(path);
  out.append(header, sizeof header);
  if (narrow) {
    std::vector<std::uint16_t> t16(tokens.begin(), tokens.end());
    out.append(t16.data(), t16.size() * 2);
  } else {
    out.append(tokens.data(), tokens.size() * 4);
  }
  if (!meta.loss_mask.empty()) {
    std::vector<std::uint8_t> bits((tokens.size() + 7) / 8, 0);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (meta.loss_mask[i] != 0) bits[i / 8] |= static_cast<std::uint8_t>(1u << (i % 8));
    }
    out.append(bits.data(), bits.size());
  }
  out.commit();
}

void write_llmc_token_file(const std::string& path, std::span<const std::uint16_t> tokens) {
  std::int32_t header[256] = {};
  header[0] = kLlmcMagic;
  header[1] = 1;
  header[2] = static_cast<std::int32_t>(tokens.size());
  AtomicFileWriter out(path);
  out.append(header, sizeof header);
  out.append(tokens.data(), tokens.size() * 2);
  out.commit();
}

std::vector<std::uint32_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<std::uint32_t> out(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string ByteTokenizer::decode(std::span<const std::uint32_t> tokens) {
  std::string out;
  out.reserve(tokens.size());
  for (auto t : tokens) {
    STRATA_CHECK(t < 256, "byte token {} out of range", t);
    out.push_back(static_cast<char>(t));
  }
  return out;
}

BatchSampler::BatchSampler(const TokenFile& data, std::int64_t batch, std::int64_t seq, std::uint64_t seed)
    : data_(data), batch_(batch), seq_(seq), state_{seed, 0} {
  if (static_cast<std::int64_t>(data.size()) < seq + 1) {
    throw FormatError(fmt::format("token file '{}' has {} tokens, fewer than one window of seq_len + 1 = {}; use more "
                                  "data or a shorter --seq-len",
                                  data.path(), data.size(), seq + 1));
  }
}

namespace {

// Target i of the file (token i as a prediction), or kIgnoredTarget when its mask bit is 0.
std::int32_t target_at(const TokenFile& data, std::uint64_t i) {
  return data.counts_in_loss(i) ? static_cast<std::int32_t>(data[i]) : kIgnoredTarget;
}

// Offset of the window drawn at sampler position `position`.
std::uint64_t window_start(const TokenFile& data, std::int64_t seq, const SamplerState& state, std::uint64_t position) {
  const std::uint64_t starts = data.size() - static_cast<std::uint64_t>(seq);  // offsets with seq+1 tokens
  return splitmix64(state.seed ^ splitmix64(position)) % starts;
}

}  // namespace

void BatchSampler::next(std::int32_t* inputs, std::int32_t* targets) {
  for (std::int64_t b = 0; b < batch_; ++b) {
    const std::uint64_t start = window_start(data_, seq_, state_, state_.position);
    ++state_.position;
    for (std::int64_t t = 0; t < seq_; ++t) {
      inputs[b * seq_ + t] = static_cast<std::int32_t>(data_[start + static_cast<std::uint64_t>(t)]);
      targets[b * seq_ + t] = target_at(data_, start + static_cast<std::uint64_t>(t) + 1);
    }
  }
}

std::int64_t BatchSampler::counted_targets() const {
  if (!data_.has_loss_mask()) return batch_ * seq_;
  std::int64_t counted = 0;
  for (std::int64_t b = 0; b < batch_; ++b) {
    const std::uint64_t start = window_start(data_, seq_, state_, state_.position + static_cast<std::uint64_t>(b));
    for (std::int64_t t = 1; t <= seq_; ++t) counted += data_.counts_in_loss(start + static_cast<std::uint64_t>(t)) ? 1 : 0;
  }
  return counted;
}

ConsecutiveWindows::ConsecutiveWindows(const TokenFile& data, std::int64_t seq)
    : data_(data), seq_(seq), count_(data.size() < 2 ? 0 : static_cast<std::int64_t>(data.size() - 1) / seq) {}

void ConsecutiveWindows::window(std::int64_t w, std::int32_t* inputs, std::int32_t* targets) const {
  STRATA_CHECK(w >= 0 && w < count_, "window {} of {}", w, count_);
  const std::uint64_t start = static_cast<std::uint64_t>(w * seq_);
  for (std::int64_t t = 0; t < seq_; ++t) {
    inputs[t] = static_cast<std::int32_t>(data_[start + static_cast<std::uint64_t>(t)]);
    targets[t] = target_at(data_, start + static_cast<std::uint64_t>(t) + 1);
  }
}

TextCorpus load_fortunes(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw IoError(fmt::format("fortunes directory '{}' does not exist; install the Debian package 'fortunes' "
                              "(tools/setup.sh does) or give another corpus",
                              dir),
                  ENOENT);
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto ext = e.path().extension().string();
    if (!e.is_regular_file() || e.is_symlink() || ext == ".dat" || ext == ".u8") continue;
    files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  TextCorpus corpus;
  for (const auto& p : files) {
    const std::string text = read_text_file(p.string(), "fortune file");
    ++corpus.files;
    // Entries are separated by lines holding only "%" (some files have trailing blanks or CRs).
    std::string entry;
    auto flush = [&] {
      while (!entry.empty() && (entry.back() == '\n' || entry.back() == '\r')) entry.pop_back();
      if (entry.empty()) return;
      std::string& target = (corpus.entries % 10 == 9) ? corpus.validation : corpus.train;
      target += entry;
      target += "\n\n";
      ++corpus.entries;
      entry.clear();
    };
    std::size_t begin = 0;
    while (begin < text.size()) {
      std::size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      std::string_view line(text.data() + begin, end - begin);
      while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) line.remove_suffix(1);
      if (line == "%") {
        flush();
      } else {
        entry.append(text, begin, end - begin);
        entry.push_back('\n');
      }
      begin = end + 1;
    }
    flush();
  }
  if (corpus.entries == 0) throw FormatError(fmt::format("no fortunes found under '{}'", dir));
  return corpus;
}

TextCorpus prepare_fortunes_token_files(const std::string& out_dir, const std::string& fortunes_dir) {
  TextCorpus corpus = load_fortunes(fortunes_dir);
  std::filesystem::create_directories(out_dir);
  write_token_file(out_dir + "/train.tok", ByteTokenizer::encode(corpus.train), ByteTokenizer::kVocabSize);
  write_token_file(out_dir + "/val.tok", ByteTokenizer::encode(corpus.validation), ByteTokenizer::kVocabSize);
  return corpus;
}

}  // namespace strata::models
