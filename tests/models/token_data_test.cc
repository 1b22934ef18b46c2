// Token data: the three file formats read back, corrupt and truncated files rejected clearly, the
// byte tokenizer, the seeded sampler (same seed same batches; resume from a saved position), the
// consecutive evaluation windows, masked targets in both, and the fortunes corpus split.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "models/token_data.h"

namespace strata::models {
namespace {

class TokenDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata_tokens_test_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string file(const std::string& n) const { return dir_ + "/" + n; }
  std::string dir_;
};

std::string open_error(const std::string& path, FlatTokenWidth w = FlatTokenWidth::U16) {
  try {
    TokenFile::open(path, w);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "no error";
}

TEST_F(TokenDataTest, ReadsStrataLlmcAndFlatFiles) {
  std::vector<std::uint32_t> toks = {5, 0, 65535, 17, 3};
  write_token_file(file("a.tok"), toks, 65536);
  auto a = TokenFile::open(file("a.tok"));
  EXPECT_EQ(a.format(), TokenFileFormat::Strata);
  EXPECT_EQ(a.token_bytes(), 2u);
  ASSERT_EQ(a.size(), toks.size());
  for (std::size_t i = 0; i < toks.size(); ++i) EXPECT_EQ(a[i], toks[i]);
  std::vector<std::uint32_t> wide = {70000, 1};
  write_token_file(file("w.tok"), wide, 0);
  auto w = TokenFile::open(file("w.tok"));
  EXPECT_EQ(w.token_bytes(), 4u);
  EXPECT_EQ(w[0], 70000u);

  std::vector<std::uint16_t> t16 = {1, 2, 50256, 4};
  write_llmc_token_file(file("l.bin"), t16);
  auto l = TokenFile::open(file("l.bin"));
  EXPECT_EQ(l.format(), TokenFileFormat::LlmC);
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[2], 50256u);

  std::ofstream(file("flat.bin"), std::ios::binary).write(reinterpret_cast<const char*>(t16.data()), 8);
  auto f = TokenFile::open(file("flat.bin"));
  EXPECT_EQ(f.format(), TokenFileFormat::Flat);
  EXPECT_EQ(f.size(), 4u);
  EXPECT_EQ(f[3], 4u);
  auto f32 = TokenFile::open(file("flat.bin"), FlatTokenWidth::U32);
  EXPECT_EQ(f32.size(), 2u);
}

TEST_F(TokenDataTest, RejectsTruncatedAndCorruptFiles) {
  std::vector<std::uint32_t> toks(100, 7);
  write_token_file(file("a.tok"), toks, 256);
  std::filesystem::resize_file(file("a.tok"), 64 + 150);
  EXPECT_NE(open_error(file("a.tok")).find("declares 100 tokens (200 bytes) but the file holds 150"), std::string::npos)
      << open_error(file("a.tok"));
  std::filesystem::resize_file(file("a.tok"), 40);
  EXPECT_NE(open_error(file("a.tok")).find("truncated"), std::string::npos);

  std::vector<std::uint16_t> t16(10, 3);
  write_llmc_token_file(file("l.bin"), t16);
  std::filesystem::resize_file(file("l.bin"), 1024 + 19);
  EXPECT_NE(open_error(file("l.bin")).find("truncated"), std::string::npos) << open_error(file("l.bin"));
  {
    std::fstream io(file("l.bin"), std::ios::binary | std::ios::in | std::ios::out);
    const std::int32_t bad_version = 9;
    io.seekp(4);
    io.write(reinterpret_cast<const char*>(&bad_version), 4);
  }
  EXPECT_NE(open_error(file("l.bin")).find("unsupported llm.c token file version 9"), std::string::npos);

  std::ofstream(file("odd.bin"), std::ios::binary) << "abc";
  EXPECT_NE(open_error(file("odd.bin")).find("multiple of 2 bytes"), std::string::npos);

  write_token_file(file("v.tok"), std::vector<std::uint32_t>{1, 2, 300}, 0);
  auto v = TokenFile::open(file("v.tok"));
  try {
    v.check_vocab(256);
    FAIL() << "token 300 must be rejected for vocab 256";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("token 300 at position 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TokenFile::open(file("nope.tok")), IoError);
}

// Found reviewing the reader for tests/fuzz: a token count whose byte size wraps around 2^64 (2^63 two-byte tokens)
// passed the size check and the reader then indexed far past the mapping; a vocabulary size of
// 2^63 or more read as negative and passed check_vocab.
TEST_F(TokenDataTest, CountsAndVocabulariesThatWrapAreRefused) {
  write_token_file(file("w.tok"), std::vector<std::uint32_t>{1, 2, 3, 4}, 256);
  const auto set_u64 = [&](std::streamoff at, std::uint64_t v) {
    std::fstream io(file("w.tok"), std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(at);
    io.write(reinterpret_cast<const char*>(&v), 8);
  };
  set_u64(16, (std::uint64_t{1} << 63) + 4);  // x 2 bytes wraps to the 8 bytes the file holds
  EXPECT_NE(open_error(file("w.tok")).find("declares 9223372036854775812 tokens"), std::string::npos)
      << open_error(file("w.tok"));
  set_u64(16, 4);
  set_u64(24, std::uint64_t{1} << 63);
  const auto f = TokenFile::open(file("w.tok"));
  EXPECT_THROW(f.check_vocab(256), FormatError);
}

// Version 2 (strata data prepare): tokenizer hash, sources' identity and the loss mask read back;
// a file with only a vocabulary stays version 1, which older builds read.
TEST_F(TokenDataTest, Version2CarriesTokenizerAndLossMask) {
  write_token_file(file("v1.tok"), std::vector<std::uint32_t>{1, 2, 3}, 256);
  std::ifstream v1(file("v1.tok"), std::ios::binary);
  char head[12];
  v1.read(head, sizeof head);
  EXPECT_EQ(head[8], 1) << "a file without tokenizer or mask must stay version 1";
  const auto old = TokenFile::open(file("v1.tok"));
  EXPECT_FALSE(old.has_loss_mask());
  EXPECT_EQ(old.tokenizer_hash(), 0u);
  EXPECT_TRUE(old.counts_in_loss(2));

  std::vector<std::uint32_t> toks(19);
  std::vector<std::uint8_t> mask(19);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(i * 7000), mask[i] = i % 3 == 0;
  TokenFileMeta meta;
  meta.vocab_size = 200'000;
  meta.tokenizer_hash = 0x1234567890abcdefull;
  meta.tokenizer_kind = 1;
  meta.source_hash = 42;
  meta.loss_mask = mask;
  write_token_file(file("v2.tok"), toks, meta);
  const auto f = TokenFile::open(file("v2.tok"));
  EXPECT_EQ(f.size(), 19u);
  EXPECT_EQ(f.token_bytes(), 4u);
  EXPECT_EQ(f.declared_vocab_size(), 200'000u);
  EXPECT_EQ(f.tokenizer_hash(), 0x1234567890abcdefull);
  EXPECT_EQ(f.tokenizer_kind(), 1u);
  EXPECT_EQ(f.source_hash(), 42u);
  ASSERT_TRUE(f.has_loss_mask());
  for (std::size_t i = 0; i < toks.size(); ++i) {
    EXPECT_EQ(f[i], toks[i]);
    EXPECT_EQ(f.counts_in_loss(i), mask[i] != 0) << i;
  }
  // A mask cut off, and flag bits from a newer writer, are refused.
  std::filesystem::resize_file(file("v2.tok"), std::filesystem::file_size(file("v2.tok")) - 1);
  EXPECT_NE(open_error(file("v2.tok")).find("truncated"), std::string::npos) << open_error(file("v2.tok"));
  write_token_file(file("v2.tok"), toks, meta);
  {
    std::fstream io(file("v2.tok"), std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(48);
    const std::uint32_t flags = 3;
    io.write(reinterpret_cast<const char*>(&flags), 4);
  }
  EXPECT_NE(open_error(file("v2.tok")).find("flags 0x3"), std::string::npos) << open_error(file("v2.tok"));
}

TEST_F(TokenDataTest, ByteTokenizerRoundTrips) {
  const std::string text = "Hello, \xff\x00 world\n";
  const auto toks = ByteTokenizer::encode(text);
  EXPECT_EQ(toks.size(), text.size());
  EXPECT_EQ(toks[7], 255u);
  EXPECT_EQ(ByteTokenizer::decode(toks), text);
}

TEST_F(TokenDataTest, SamplerIsSeededAndResumable) {
  std::vector<std::uint32_t> toks(1000);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(i % 251);
  write_token_file(file("a.tok"), toks, 256);
  auto data = TokenFile::open(file("a.tok"));
  const std::int64_t B = 3, T = 8;
  auto draw = [&](BatchSampler& s) {
    std::vector<std::int32_t> in(B * T), tg(B * T);
    s.next(in.data(), tg.data());
    for (std::int64_t i = 0; i < B * T; ++i) EXPECT_EQ(tg[i], static_cast<std::int32_t>((in[i] + 1) % 251)) << "targets shift by one";
    return in;
  };
  BatchSampler a(data, B, T, 42), b(data, B, T, 42), c(data, B, T, 43);
  const auto a1 = draw(a), a2 = draw(a);
  EXPECT_EQ(a1, draw(b));
  EXPECT_NE(a1, draw(c));
  EXPECT_NE(a1, a2);
  BatchSampler resumed(data, B, T, 0);
  resumed.restore({42, B});  // one batch of B windows drawn
  EXPECT_EQ(draw(resumed), a2);
}

// A target whose token's mask bit is 0 comes out as kIgnoredTarget from the
// sampler and the evaluation windows (the input before it is the token as it is), and
// counted_targets() counts what the next draw will count without moving the sampler.
TEST_F(TokenDataTest, MaskedTargetsAreIgnoredAndCounted) {
  std::vector<std::uint32_t> toks(300);
  std::vector<std::uint8_t> mask(toks.size());
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(i), mask[i] = (i / 5) % 3 != 0;
  TokenFileMeta meta;
  meta.vocab_size = 512;
  meta.loss_mask = mask;
  write_token_file(file("m.tok"), toks, meta);
  const auto data = TokenFile::open(file("m.tok"));
  const std::int64_t B = 4, T = 16;
  BatchSampler s(data, B, T, 9);
  std::int64_t masked_seen = 0;
  for (int draw = 0; draw < 20; ++draw) {
    const std::int64_t counted = s.counted_targets();
    const SamplerState before = s.state();
    EXPECT_EQ(s.counted_targets(), counted) << "counting moved the sampler";
    std::vector<std::int32_t> in(B * T), tg(B * T);
    s.next(in.data(), tg.data());
    EXPECT_EQ(s.state().position, before.position + B);
    std::int64_t counted_here = 0;
    for (std::int64_t i = 0; i < B * T; ++i) {
      // Input i is token p; target i is token p + 1, ignored where its mask bit is 0.
      const auto p = static_cast<std::size_t>(in[i]);  // every token is its position
      if (mask[p + 1] != 0) {
        EXPECT_EQ(tg[i], static_cast<std::int32_t>(p + 1)) << i;
      } else {
        EXPECT_EQ(tg[i], kIgnoredTarget) << i;
      }
    }
    for (std::int64_t i = 0; i < B * T; ++i) counted_here += tg[i] >= 0 ? 1 : 0;
    EXPECT_EQ(counted_here, counted);
    masked_seen += B * T - counted_here;
  }
  EXPECT_GT(masked_seen, 0);
  // Without a mask every target counts.
  write_token_file(file("plain.tok"), toks, 512);
  const auto plain = TokenFile::open(file("plain.tok"));
  EXPECT_EQ(BatchSampler(plain, B, T, 9).counted_targets(), B * T);

  const ConsecutiveWindows windows(data, T);
  std::vector<std::int32_t> in(T), tg(T);
  windows.window(2, in.data(), tg.data());
  for (std::int64_t t = 0; t < T; ++t) {
    const std::size_t target_pos = static_cast<std::size_t>(2 * T + t + 1);
    EXPECT_EQ(in[t], static_cast<std::int32_t>(target_pos - 1));
    EXPECT_EQ(tg[t], mask[target_pos] != 0 ? static_cast<std::int32_t>(target_pos) : kIgnoredTarget) << t;
  }
}

TEST_F(TokenDataTest, ConsecutiveWindowsWalkFromTheStart) {
  std::vector<std::uint32_t> toks(21);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(i);
  write_token_file(file("a.tok"), toks, 256);
  auto data = TokenFile::open(file("a.tok"));
  ConsecutiveWindows w(data, 5);
  EXPECT_EQ(w.count(), 4);
  std::vector<std::int32_t> in(5), tg(5);
  w.window(3, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<std::int32_t>{15, 16, 17, 18, 19}));
  EXPECT_EQ(tg, (std::vector<std::int32_t>{16, 17, 18, 19, 20}));
}

TEST_F(TokenDataTest, FortunesCorpusSplitsDeterministically) {
  if (!std::filesystem::is_directory(kDefaultFortunesDir)) GTEST_SKIP() << "Debian package 'fortunes' not installed";
  const TextCorpus c = prepare_fortunes_token_files(file("fortunes"));
  EXPECT_GT(c.files, 5u);
  EXPECT_GT(c.entries, 1000u);
  EXPECT_GT(c.train.size(), 8 * c.validation.size());
  EXPECT_GT(c.validation.size(), c.train.size() / 20);
  EXPECT_EQ(c.train.find("\n%\n"), std::string::npos) << "separators are removed";
  auto train = TokenFile::open(file("fortunes/train.tok"));
  EXPECT_EQ(train.size(), c.train.size());
  train.check_vocab(256);
  EXPECT_EQ(load_fortunes().validation, c.validation);
}

}  // namespace
}  // namespace strata::models
