// Fuzzes the safetensors reader: whole files (SafetensorsFile::open, then every float tensor read,
// whole and by rows) from files written by write_safetensors, and the header alone
// (parse_safetensors_header) with JSON-aware mutations.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "models/safetensors.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/offload/offload_test_util.h"

namespace strata::fuzz {
namespace {

using models::SafetensorsFile;
using models::SafetensorsTensorOut;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Files written by the real writer: float dtypes, a scalar, an empty tensor, metadata.
std::vector<std::string> file_seeds(const std::string& dir) {
  std::vector<float> f32(24);
  for (std::size_t i = 0; i < f32.size(); ++i) f32[i] = 0.25f * static_cast<float>(i) - 2.0f;
  std::vector<std::uint16_t> half(12, 0x3c00);
  std::vector<std::string> seeds;
  const std::vector<std::vector<SafetensorsTensorOut>> sets = {
      {{"w", DType::F32, {4, 6}, f32.data()}},
      {{"embed.weight", DType::BF16, {3, 4}, half.data()}, {"bias", DType::F32, {6}, f32.data()},
       {"scale", DType::F32, {}, f32.data()}},
      {{"h", DType::F16, {2, 2, 3}, half.data()}, {"empty", DType::F32, {0, 5}, f32.data()}}};
  for (std::size_t k = 0; k < sets.size(); ++k) {
    const std::string path = dir + "/seed" + std::to_string(k) + ".safetensors";
    std::map<std::string, std::string> meta;
    if (k == 1) meta = {{"format", "pt"}, {"producer", "strata-fuzz"}};
    models::write_safetensors(path, sets[k], meta);
    seeds.push_back(slurp(path));
  }
  return seeds;
}

// The header text of a safetensors file (bytes 8 .. 8 + length).
std::string header_of(const std::string& file) {
  std::uint64_t len = 0;
  std::memcpy(&len, file.data(), 8);
  return file.substr(8, len);
}

void read_everything(const SafetensorsFile& f, std::uint64_t file_bytes) {
  std::uint64_t total = 0;
  for (const auto& t : f.tensors()) {
    const std::size_t esize = models::safetensors_dtype_bytes(t.dtype_name);
    if (t.data_end < t.data_begin || t.bytes() != t.elems() * esize || t.data_end > file_bytes) {
      throw InsaneResult("tensor '" + t.name + "' was accepted with a byte span that does not match its shape");
    }
    total += t.bytes();
    if (total > file_bytes) throw InsaneResult("the tensors were accepted with more bytes than the file has");
    if (!t.dtype) continue;
    std::vector<float> out(t.elems());
    f.read(t, DType::F32, out.data());
    std::vector<std::uint16_t> half(t.elems());
    f.read(t, DType::BF16, half.data());
    if (!t.shape.empty() && t.shape[0] > 0) f.read_rows(t, DType::F32, t.shape[0] / 2, t.shape[0], out.data());
  }
}

TEST(FuzzSafetensors, Files) {
  offload::testing::TempDir dir;
  const std::vector<std::string> seeds = file_seeds(dir.path());
  const std::string path = dir.path() + "/mutant.safetensors";
  const FuzzStats s = fuzz_loop("safetensors", seeds, mutate_bytes, [&](const std::string& input) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << input;
    read_everything(SafetensorsFile::open(path), input.size());
  });
  EXPECT_GT(s.refused, 0u);
}

TEST(FuzzSafetensors, Headers) {
  offload::testing::TempDir dir;
  std::vector<std::string> headers;
  for (const std::string& file : file_seeds(dir.path())) headers.push_back(header_of(file));
  const FuzzStats s = fuzz_loop("safetensors-header", headers, mutate_json, [&](const std::string& input) {
    // The data buffer of seed 0; other seeds' offsets then mostly disagree, which is fine.
    const auto h = models::parse_safetensors_header(input, 96, "fuzz");
    std::uint64_t total = 0;
    for (const auto& t : h.tensors) {
      if (t.bytes() != t.elems() * models::safetensors_dtype_bytes(t.dtype_name) || t.data_end > 96) {
        throw InsaneResult("tensor '" + t.name + "' was accepted with a byte span that does not match its shape");
      }
      total += t.bytes();
    }
    if (total > 96) throw InsaneResult("the tensors were accepted with more bytes than the data buffer has");
  });
  EXPECT_GT(s.refused, 0u);
}

}  // namespace
}  // namespace strata::fuzz
