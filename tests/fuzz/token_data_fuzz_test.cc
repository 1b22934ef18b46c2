// Fuzzes the token file reader (TokenFile::open with both flat widths, then every token, the
// vocabulary check and a sampler) from files written by write_token_file, write_llmc_token_file
// and flat uint16 files.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "models/token_data.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/offload/offload_test_util.h"

namespace strata::fuzz {
namespace {

using models::FlatTokenWidth;
using models::TokenFile;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> token_seeds(const std::string& dir) {
  std::vector<std::string> seeds;
  const std::vector<std::uint32_t> small = models::ByteTokenizer::encode("a token file for the fuzzer, byte tokens");
  std::vector<std::uint32_t> wide(40);
  for (std::size_t i = 0; i < wide.size(); ++i) wide[i] = static_cast<std::uint32_t>(i * 9973 % 100'000);
  models::write_token_file(dir + "/u16.tok", small, 256);
  models::write_token_file(dir + "/u32.tok", wide, 100'000);
  models::write_token_file(dir + "/novocab.tok", small, 0);
  std::vector<std::uint16_t> llmc(small.begin(), small.end());
  models::write_llmc_token_file(dir + "/llmc.bin", llmc);
  for (const char* name : {"u16.tok", "u32.tok", "novocab.tok", "llmc.bin"}) seeds.push_back(slurp(dir + "/" + name));
  seeds.push_back(std::string(reinterpret_cast<const char*>(llmc.data()), llmc.size() * 2));  // flat uint16
  return seeds;
}

void use_everything(const TokenFile& f, std::uint64_t file_bytes) {
  if (f.size() > file_bytes / f.token_bytes()) {
    throw InsaneResult("the file was accepted with " + std::to_string(f.size()) + " tokens of " +
                       std::to_string(f.token_bytes()) + " bytes in a file of " + std::to_string(file_bytes));
  }
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < f.size(); ++i) sum += f[i];
  (void)sum;
  for (const std::int64_t vocab : {std::int64_t{256}, std::int64_t{1} << 31}) {
    try {
      f.check_vocab(vocab);
    } catch (const FormatError&) {
    }
  }
  if (f.size() >= 9) {
    models::BatchSampler sampler(f, 2, 8, 7);
    std::int32_t in[16], tg[16];
    sampler.next(in, tg);
    models::ConsecutiveWindows windows(f, 8);
    for (std::int64_t w = 0; w < windows.count(); ++w) windows.window(w, in, tg);
  }
}

TEST(FuzzTokenData, TokenFiles) {
  offload::testing::TempDir dir;
  const std::vector<std::string> seeds = token_seeds(dir.path());
  const std::string path = dir.path() + "/mutant.tok";
  const FuzzStats s = fuzz_loop("tokens", seeds, mutate_bytes, [&](const std::string& input) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << input;
    for (const FlatTokenWidth w : {FlatTokenWidth::U16, FlatTokenWidth::U32}) {
      try {
        use_everything(TokenFile::open(path, w), input.size());
      } catch (const FormatError& e) {
        if (std::string_view(e.what()).empty()) throw;
      }
    }
  });
  EXPECT_GT(s.inputs, 0u);
}

}  // namespace
}  // namespace strata::fuzz
