// Memory-centric tiling of the decoders (models/tiling.h): tiled and untiled runs give the same
// loss and gradients bit for bit (fp32, and bf16 too), for GPT-2 and LLaMA, uniform and per-layer
// tilings, with and without activation checkpointing, inline and on the sim device; a tiled block
// holds one tile at a time and declares each tile's gradients once; the automatic rule picks the
// fewest tiles that fit; bad specs are refused naming the key; tile init equals the rows of the
// untiled init; a tiled model saves the untiled model's file and loads it back.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/device/device.h"
#include "core/error.h"
#include "models/decoder.h"
#include "models/decoder_params.h"
#include "models/param_init.h"
#include "models/resident_provider.h"
#include "tests/models/decoder_test_util.h"
#include "models/safetensors.h"
#include "models/tiling.h"
#include "models/weights_io.h"

namespace strata::models {
namespace {

using testing::random_tokens;
using testing::tiny;

TilingSpec parse(const ModelConfig& c, const char* json) { return parse_tiling(nlohmann::json::parse(json), c); }

// Every whole tensor's weights or gradients (tiles reassembled), by whole name.
std::map<std::string, std::vector<std::uint8_t>> whole_values(const ModelConfig& c, const ResidentParamProvider& p,
                                                              bool grads, Stream* stream = nullptr) {
  std::map<std::string, std::vector<std::uint8_t>> out;
  for (const WholeTensor& w : whole_tensors(c, p.groups())) {
    std::vector<std::uint8_t> v(w.spec.bytes());
    for (const TensorPart& part : w.parts) {
      const std::string& name = p.groups()[part.group].tensors[part.tensor].name;
      std::vector<std::uint8_t> piece(w.part_bytes(part));
      if (grads) {
        p.read_grad(name, piece.data(), stream);
      } else {
        p.read_param(name, piece.data(), stream);
      }
      std::memcpy(v.data() + w.part_offset_bytes(part), piece.data(), piece.size());
    }
    out[w.spec.name] = std::move(v);
  }
  return out;
}

// The first differing whole tensor, for the failure message.
std::string first_difference(const std::map<std::string, std::vector<std::uint8_t>>& a,
                             const std::map<std::string, std::vector<std::uint8_t>>& b) {
  for (const auto& [name, v] : a) {
    auto it = b.find(name);
    if (it == b.end()) return name + " (missing)";
    if (it->second != v) return name;
  }
  return a.size() == b.size() ? "" : "(tensor sets differ)";
}

struct RunResult {
  LossSum loss;
  std::map<std::string, std::vector<std::uint8_t>> weights, grads;
};

// Two micro-batches of forward_backward from GPT-2-style init (seed 5).
RunResult run(const ModelConfig& c, const DecoderOptions& opts) {
  Decoder model(c, opts);
  ResidentParamProvider p(model.param_groups(), nullptr);
  p.init_gpt2_style(5, c.n_layers, nullptr);
  p.zero_grads(nullptr);
  const std::int64_t B = 2, T = 12;
  const auto in = random_tokens(2 * B * T, 61);
  auto tg = random_tokens(2 * B * T, 62);
  tg[3] = -1;
  RunResult r;
  r.loss = accumulate_step_gradients(model, {}, p, in.data(), tg.data(), 2, B, T);
  EXPECT_EQ(p.live_groups(), 0);
  r.weights = whole_values(c, p, false);
  r.grads = whole_values(c, p, true);
  return r;
}

struct TilingCase {
  const char* name;
  const char* json;
  Checkpointing checkpointing = Checkpointing::Off;
  DType dtype = DType::F32;
};

class TiledEqualsUntiled : public ::testing::TestWithParam<std::tuple<testing::Tiny, TilingCase>> {};

TEST_P(TiledEqualsUntiled, SameLossAndGradientsBitForBit) {
  const auto [arch, tc] = GetParam();
  ModelConfig c = tiny(arch);
  c.dtype = tc.dtype;
  const TilingSpec spec = parse(c, tc.json);
  ASSERT_TRUE(spec.tiled()) << tc.json;
  TilingSpec untiled_spec;  // the same reduction chunks, no tiles (Note [Tile-invariant linear layers] in models/tiling.h)
  untiled_spec.chunks = spec.chunks;
  const RunResult untiled = run(c, {tc.checkpointing, untiled_spec});
  const RunResult tiled = run(c, {tc.checkpointing, spec});
  EXPECT_GT(Decoder(c, {tc.checkpointing, spec}).param_groups().size(), decoder_param_groups(c).size());
  EXPECT_EQ(first_difference(untiled.weights, tiled.weights), "") << "tiled init differs from untiled init";
  EXPECT_EQ(tiled.loss.sum, untiled.loss.sum);
  EXPECT_EQ(tiled.loss.tokens, untiled.loss.tokens);
  EXPECT_EQ(first_difference(untiled.grads, tiled.grads), "") << "gradients differ";
}

const TilingCase kCases[] = {
    {"uniform2", R"({"default": 2})"},
    {"uniform4", R"({"default": 4})"},
    {"mixed", R"({"layers": {"0": {"attn": 4, "mlp": 2}, "1": {"mlp": 8}}})"},
    {"attn_only16", R"({"default": {"attn": 16}})"},
    {"uniform4_checkpointed", R"({"default": 4})", Checkpointing::Blocks},
    {"chunks8_mixed", R"({"chunks": 8, "default": 2, "layers": {"1": 8}})"},
    {"uniform4_bf16", R"({"default": 4})", Checkpointing::Off, DType::BF16},
};

INSTANTIATE_TEST_SUITE_P(Tiling, TiledEqualsUntiled,
                         ::testing::Combine(testing::kEveryTiny, ::testing::ValuesIn(kCases)),
                         [](const auto& info) {
                           return testing::tiny_name(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param).name;
                         });

// Wraps the resident provider and records what the engine would see: live groups, their bytes,
// and grads_ready per group.
class RecordingProvider final : public ParamProvider {
 public:
  explicit RecordingProvider(ResidentParamProvider& inner) : inner_(inner), ready_(inner.groups().size(), 0) {}
  std::span<const ParamGroupSpec> groups() const override { return inner_.groups(); }
  GroupViews acquire_params(std::size_t g, ParamPhase phase, Stream* s) override {
    live_.insert(g);
    std::size_t bytes = 0, tiles = 0;
    for (auto l : live_) {
      bytes += groups()[l].bytes();
      tiles += groups()[l].name.find(".tile") != std::string::npos ? 1 : 0;
    }
    peak_live_bytes = std::max(peak_live_bytes, bytes);
    peak_live_tiles = std::max(peak_live_tiles, tiles);
    return inner_.acquire_params(g, phase, s);
  }
  void release_params(std::size_t g, Stream* s) override {
    live_.erase(g);
    inner_.release_params(g, s);
  }
  GroupViews acquire_grads(std::size_t g, Stream* s) override { return inner_.acquire_grads(g, s); }
  void grads_ready(std::size_t g, Stream* s) override {
    ++ready_[g];
    inner_.grads_ready(g, s);
  }
  const std::vector<int>& ready() const { return ready_; }
  std::size_t peak_live_bytes = 0, peak_live_tiles = 0;

 private:
  ResidentParamProvider& inner_;
  std::set<std::size_t> live_;
  std::vector<int> ready_;
};

class TilingArch : public ::testing::TestWithParam<testing::Tiny> {};

TEST_P(TilingArch, TiledBlockHoldsOneTileAtATimeAndDeclaresEachTileReadyOnce) {
  const ModelConfig c = tiny(GetParam());
  const TilingSpec spec = parse(c, R"({"default": 4})");
  for (auto ck : {Checkpointing::Off, Checkpointing::Blocks}) {
    Decoder model(c, {ck, spec});
    const DecoderLayout& L = model.layout();
    ResidentParamProvider inner(model.param_groups(), nullptr);
    inner.init_gpt2_style(1, c.n_layers, nullptr);
    inner.zero_grads(nullptr);
    RecordingProvider p(inner);
    const auto in = random_tokens(16, 1), tg = random_tokens(16, 2);
    model.forward_backward({}, p, in.data(), tg.data(), 2, 8, 1.0f / 16);
    EXPECT_EQ(inner.live_groups(), 0);
    EXPECT_EQ(p.peak_live_tiles, 1u) << "one tile group live at a time";
    for (std::size_t g = 0; g < L.groups.size(); ++g) EXPECT_EQ(p.ready()[g], 1) << L.groups[g].name;
    const auto& counts = inner.acquire_counts();
    for (const BlockGroups& bg : L.blocks) {
      EXPECT_EQ(counts[bg.base], 2) << "base: forward + backward";
      for (std::size_t s = 0; s < kBlockStages; ++s) {
        for (std::int64_t t = 0; t < 4; ++t) {
          const std::size_t gi = bg.tile_group(static_cast<BlockStage>(s), t);
          EXPECT_EQ(counts[gi], ck == Checkpointing::Off ? 2 : 3)
              << L.groups[gi].name << ": forward, (recompute,) backward";
        }
      }
    }
    // The block's live bytes are its base group and one tile, not the whole block (the embedding
    // and head groups aside: GPT-2's tied head holds both of those).
    const std::size_t whole_block = decoder_block_group(c, 0).bytes();
    const BlockTileBytes tile_bytes = block_tile_bytes(c, spec.block(0), spec.chunks);
    EXPECT_LT(tile_bytes.live(), whole_block / 2);
    const std::size_t emb_head = L.groups[L.embedding].bytes() + L.groups[L.head].bytes();
    EXPECT_LE(p.peak_live_bytes, std::max<std::size_t>(tile_bytes.live(), emb_head));
  }
}

// The sim device (streams, device memory) gives the inline host run's bits, untiled and tiled.
TEST_P(TilingArch, SimDeviceRunMatchesInlineUntiledRun) {
  const ModelConfig c = tiny(GetParam());
  const std::int64_t B = 2, T = 10;
  const auto in = random_tokens(B * T, 41), tg = random_tokens(B * T, 42);
  Decoder inline_model(c, {});
  ResidentParamProvider host(inline_model.param_groups(), nullptr);
  host.init_gpt2_style(4, c.n_layers, nullptr);
  host.zero_grads(nullptr);
  const LossSum want = inline_model.forward_backward({}, host, in.data(), tg.data(), B, T, 0.05f);

  for (const DecoderOptions& options :
       {DecoderOptions{}, DecoderOptions{Checkpointing::Blocks, parse(c, R"({"default": {"attn": 2, "mlp": 8}})")}}) {
    SimDeviceOptions opts;
    opts.capacity_bytes = 64ull << 20;
    auto dev = make_sim_device(opts);
    auto stream = dev->create_stream("compute");
    Decoder sim_model(c, options);
    ResidentParamProvider sim(sim_model.param_groups(), dev.get());
    sim.init_gpt2_style(4, c.n_layers, stream.get());
    sim.zero_grads(stream.get());
    const DecoderRuntime rt{{DeviceKind::Sim, stream.get(), nullptr}, dev.get()};
    const LossSum got = sim_model.forward_backward(rt, sim, in.data(), tg.data(), B, T, 0.05f);
    const std::string what = options.tiling.tiled() ? "tiled" : "untiled";
    EXPECT_EQ(got.sum, want.sum) << what;
    EXPECT_EQ(first_difference(whole_values(c, host, true), whole_values(c, sim, true, stream.get())), "") << what;
    EXPECT_GT(dev->memory_stats().peak_bytes_by_tag.at("activations"), 0u) << what;
  }
}

TEST_P(TilingArch, LayoutNamesMapBackToWholeTensors) {
  const ModelConfig c = tiny(GetParam());
  // Untiled: the groups are exactly the untiled declaration.
  const auto untiled = decoder_param_groups(c);
  const auto same = decoder_param_groups(c, TilingSpec{});
  ASSERT_EQ(same.size(), untiled.size());
  for (std::size_t g = 0; g < same.size(); ++g) {
    EXPECT_EQ(same[g].name, untiled[g].name);
    ASSERT_EQ(same[g].tensors.size(), untiled[g].tensors.size());
    for (std::size_t t = 0; t < same[g].tensors.size(); ++t)
      EXPECT_EQ(same[g].tensors[t].name, untiled[g].tensors[t].name);
  }
  // Tiled: the same parameters, every tile naming its whole tensor and rows, the rows covering it.
  const DecoderLayout L = decoder_layout(c, parse(c, R"({"layers": {"1": 4}})"));
  std::int64_t elems = 0;
  for (const auto& g : L.groups) {
    for (const auto& t : g.tensors) elems += static_cast<std::int64_t>(t.elems());
  }
  EXPECT_EQ(elems, param_count(c));
  EXPECT_EQ(L.blocks[0].tiling, BlockTiling{});
  EXPECT_EQ(L.groups[L.blocks[1].base].name, "blocks.1");
  const std::size_t g0 = L.blocks[1].tile_group(BlockStage::MlpIn, 1);
  const ParamGroupSpec& tile = L.groups[g0];
  const std::string whole = c.arch == Architecture::Gpt2 ? "blocks.1.mlp.fc.weight" : "blocks.1.mlp.gate.weight";
  const RowRange rows = tile_rows(c.ffn_hidden, kDefaultTileChunks, 4, 1);
  EXPECT_EQ(tile.tensors[0].name, tile_tensor_name(whole, rows));
  const auto back = whole_tensor_of(tile.tensors[0].name);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->whole_name, whole);
  EXPECT_EQ(back->rows, rows);
  EXPECT_EQ(rows, (RowRange{c.ffn_hidden / 4, c.ffn_hidden / 2}));
  for (const WholeTensor& w : whole_tensors(c, L.groups)) {
    EXPECT_EQ(
        w.parts.size(),
        w.spec.name.starts_with("blocks.1.") && w.spec.name.ends_with("weight") && w.spec.shape.size() == 2 ? 4u : 1u)
        << w.spec.name;
  }
}

TEST_P(TilingArch, TileInitEqualsRowsOfUntiledInit) {
  const ModelConfig c = tiny(GetParam());
  std::map<std::string, std::vector<float>> whole;
  for (const auto& g : decoder_param_groups(c)) {
    for (const auto& t : g.tensors) {
      std::vector<float> v(t.elems());
      init_tensor_gpt2_style(c.n_layers, t, 77, v);
      whole[t.name] = std::move(v);
    }
  }
  int tiles = 0;
  for (const auto& g : decoder_param_groups(c, parse(c, R"({"default": 4, "layers": {"0": 16}})"))) {
    for (const auto& t : g.tensors) {
      std::vector<float> v(t.elems());
      init_tensor_gpt2_style(c.n_layers, t, 77, v);
      const auto w = whole_tensor_of(t.name);
      const std::vector<float>& src = whole.at(w ? w->whole_name : t.name);
      const std::size_t offset = w ? static_cast<std::size_t>(w->rows.begin) * static_cast<std::size_t>(t.shape[1]) : 0;
      ASSERT_LE(offset + v.size(), src.size()) << t.name;
      EXPECT_TRUE(std::equal(v.begin(), v.end(), src.begin() + static_cast<std::ptrdiff_t>(offset))) << t.name;
      tiles += w ? 1 : 0;
    }
  }
  const int linears_per_block = c.arch == Architecture::Gpt2 ? 4 : 7;  // LLaMA: q k v, o, gate up, down
  EXPECT_EQ(tiles, linears_per_block * (16 + 4)) << "some tiles were not initialized";
}

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/strata-tiling-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

TEST_P(TilingArch, TiledModelSavesTheUntiledFileAndLoadsItBack) {
  const ModelConfig c = tiny(GetParam());
  const TilingSpec spec = parse(c, R"({"default": {"attn": 2, "mlp": 4}, "layers": {"1": 8}})");
  TempDir dir;
  ResidentParamProvider untiled(decoder_param_groups(c), nullptr);
  untiled.init_gpt2_style(13, c.n_layers, nullptr);
  ResidentParamProvider tiled(decoder_param_groups(c, spec), nullptr);
  tiled.init_gpt2_style(13, c.n_layers, nullptr);
  for (auto naming : {WeightNaming::Strata, WeightNaming::HuggingFace}) {
    const std::string a = dir.file("untiled.safetensors"), b = dir.file("tiled.safetensors");
    save_weights(a, c, untiled, nullptr, naming);
    save_weights(b, c, tiled, nullptr, naming);
    EXPECT_TRUE(file_bytes(a) == file_bytes(b)) << "a tiled model must save the untiled model's file";
    // Loading the untiled file into a fresh tiled model gives the same weights.
    ResidentParamProvider loaded(decoder_param_groups(c, spec), nullptr);
    EXPECT_EQ(load_weights(a, c, loaded, nullptr), naming);
    EXPECT_EQ(first_difference(whole_values(c, untiled, false), whole_values(c, loaded, false)), "");
  }
  // The trainer's path: per-tensor fp32 values in group order -> whole tensors; and init from a file.
  std::vector<std::vector<float>> values;
  for (const auto& g : tiled.groups()) {
    for (const auto& t : g.tensors) {
      values.emplace_back(t.elems());
      tiled.read_param(t.name, values.back().data(), nullptr);
    }
  }
  const auto assembled = assemble_whole_tensors(c, tiled.groups(), values);
  const auto want = whole_values(c, untiled, false);
  ASSERT_EQ(assembled.size(), want.size());
  std::vector<SafetensorsTensorOut> out;
  for (const auto& w : assembled) {
    const auto& bytes = want.at(w.name);
    ASSERT_EQ(bytes.size(), w.values.size() * 4) << w.name;
    EXPECT_EQ(std::memcmp(bytes.data(), w.values.data(), bytes.size()), 0) << w.name;
    out.push_back({w.name, DType::F32, w.shape, w.values.data()});
  }
  const std::string init_path = dir.file("init.safetensors");
  write_safetensors(init_path, out);
  const WeightSource init = WeightSource::open(init_path, c, "strata.init_weights");
  for (const auto& g : tiled.groups()) {
    for (const auto& t : g.tensors) {
      std::vector<float> got(t.elems()), expect(t.elems());
      read_init_tensor(init, c, t, got);
      tiled.read_param(t.name, expect.data(), nullptr);
      EXPECT_TRUE(got == expect) << t.name;
    }
  }
  ParamTensorSpec beyond = tiled.groups()[1].tensors[0];
  beyond.name = "blocks.0.no_such.weight[0:1]";
  std::vector<float> sink(beyond.elems());
  EXPECT_THROW(read_init_tensor(init, c, beyond, sink), FormatError);
}

// A NaN or infinity in strata.init_weights (or in the weights eval loads) is refused when read,
// naming the file, the whole tensor and the element's index in it, also when the tensor is read
// tile by tile; the tiles before the bad element read as usual.
TEST_P(TilingArch, NonFiniteInitWeightsAreRefusedNamingTensorAndElement) {
  const ModelConfig c = tiny(GetParam());
  const TilingSpec spec = parse(c, R"({"default": {"attn": 1, "mlp": 4}})");
  TempDir dir;
  ResidentParamProvider untiled(decoder_param_groups(c), nullptr);
  untiled.init_gpt2_style(13, c.n_layers, nullptr);
  const std::string good = dir.file("good.safetensors");
  save_weights(good, c, untiled, nullptr, WeightNaming::Strata);
  // The same file with one element of an MLP weight (read in 4 tiles) made non-finite, in its last tile.
  const SafetensorsFile file = SafetensorsFile::open(good);
  const ParamTensorSpec* tiled_tensor = nullptr;
  const auto tiled_groups = decoder_param_groups(c, spec);
  for (const auto& g : tiled_groups) {
    for (const auto& t : g.tensors) {
      if (tiled_tensor == nullptr && whole_tensor_of(t.name) && whole_tensor_of(t.name)->rows.begin > 0) {
        tiled_tensor = &t;
      }
    }
  }
  ASSERT_NE(tiled_tensor, nullptr) << "no tile after the first";
  const std::string whole_name = whole_tensor_of(tiled_tensor->name)->whole_name;
  const std::int64_t tile_begin = whole_tensor_of(tiled_tensor->name)->rows.begin;
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    std::vector<std::vector<float>> values;
    std::vector<SafetensorsTensorOut> out;
    std::size_t bad_index = 0;
    for (const auto& e : file.tensors()) {
      values.emplace_back(static_cast<std::size_t>(e.elems()));
      file.read(e, DType::F32, values.back().data());
    }
    std::size_t i = 0;
    for (const auto& e : file.tensors()) {
      if (e.name == whole_name) {
        const std::size_t row_elems = values[i].size() / static_cast<std::size_t>(e.shape[0]);
        bad_index = static_cast<std::size_t>(tile_begin) * row_elems + 3;
        values[i][bad_index] = bad;
      }
      out.push_back({e.name, DType::F32, e.shape, values[i].data()});
      ++i;
    }
    const std::string path = dir.file("bad.safetensors");
    write_safetensors(path, out);
    const WeightSource init = WeightSource::open(path, c, "strata.init_weights");
    for (const auto& g : tiled_groups) {
      for (const auto& t : g.tensors) {
        std::vector<float> got(t.elems());
        if (&t != tiled_tensor) {  // the other tiles of the tensor too: the bad element is in this one
          EXPECT_NO_THROW(read_init_tensor(init, c, t, got)) << t.name;
          continue;
        }
        try {
          read_init_tensor(init, c, t, got);
          ADD_FAILURE() << "a non-finite element in " << t.name << " was accepted";
        } catch (const FormatError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("strata.init_weights"), std::string::npos) << what;
          EXPECT_NE(what.find(path), std::string::npos) << what;
          EXPECT_NE(what.find(fmt::format("tensor '{}' element {} ", whole_name, bad_index)), std::string::npos)
              << what;
          EXPECT_NE(what.find(std::isnan(bad) ? "nan" : "-inf"), std::string::npos) << what;
        }
      }
    }
    // eval's loader refuses the same file, naming the same element.
    ResidentParamProvider loaded(decoder_param_groups(c), nullptr);
    try {
      load_weights(path, c, loaded, nullptr);
      ADD_FAILURE() << "load_weights accepted a non-finite weight";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("element {} ", bad_index)), std::string::npos) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Arch, TilingArch, testing::kEveryTiny,
                         [](const auto& info) { return testing::tiny_name(info.param); });

TEST(TilingSpecTest, TileNamesRoundTripAndOtherNamesAreNotTiles) {
  const auto w = whole_tensor_of(tile_tensor_name("blocks.3.mlp.fc.weight", {768, 1536}));
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->whole_name, "blocks.3.mlp.fc.weight");
  EXPECT_EQ(w->rows, (RowRange{768, 1536}));
  for (const char* name :
       {"blocks.3.mlp.fc.weight", "a[1:]", "a[:2]", "a[2:1]", "[1:2]", "a[1-2]", "a[x:2]", "a[1:2"}) {
    EXPECT_FALSE(whole_tensor_of(name).has_value()) << name;
  }
}

TEST(TilingSpecTest, ChunksAndTilesPartitionRowsConsistently) {
  for (std::int64_t out : {1, 7, 16, 33, 96, 3072}) {
    for (std::int64_t chunks : {1, 4, 16}) {
      std::int64_t next = 0;
      for (std::int64_t ch = 0; ch < chunks; ++ch) {
        const RowRange r = chunk_rows(out, chunks, ch);
        EXPECT_EQ(r.begin, next);
        EXPECT_GE(r.rows(), 0);
        next = r.end;
      }
      EXPECT_EQ(next, out);
      for (std::int64_t tiles = 1; tiles <= chunks; tiles *= 2) {
        if (chunks % tiles != 0) continue;
        const std::int64_t per = chunks / tiles;
        for (std::int64_t t = 0; t < tiles; ++t) {
          EXPECT_EQ(tile_rows(out, chunks, tiles, t).begin, chunk_rows(out, chunks, t * per).begin);
          EXPECT_EQ(tile_rows(out, chunks, tiles, t).end, chunk_rows(out, chunks, (t + 1) * per - 1).end);
        }
      }
    }
  }
}

TEST(TilingSpecTest, ParsesTheSchema) {
  const ModelConfig c = tiny(Architecture::Llama);
  EXPECT_FALSE(parse(c, "{}").tiled());
  EXPECT_TRUE(parse(c, "{}").layers.empty());
  EXPECT_TRUE(parse(c, R"({"default": 1, "layers": {"1": {"attn": 1}}})").layers.empty()) << "all-1 is untiled";
  const TilingSpec s = parse(c, R"({"chunks": 8, "default": {"mlp": 4}, "layers": {"1": 2}})");
  EXPECT_EQ(s.chunks, 8);
  EXPECT_EQ(s.block(0), (BlockTiling{1, 4}));
  EXPECT_EQ(s.block(1), (BlockTiling{2, 2}));
  const TilingSpec a = parse(c, R"({"default": {"attn": 2, "mlp": "auto"}})");
  EXPECT_TRUE(a.has_auto());
  EXPECT_EQ(a.block(0), (BlockTiling{2, kAutoTiles}));
  EXPECT_THROW(Decoder(c, {Checkpointing::Off, a}), ConfigError) << "auto must be resolved before building";
}

void expect_config_error(const ModelConfig& c, const char* json, const std::string& needle) {
  try {
    parse(c, json);
    ADD_FAILURE() << json << " was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << json << " -> " << e.what();
  }
}

TEST(TilingSpecTest, BadSpecsAreRefusedNamingTheKey) {
  const ModelConfig c = tiny(Architecture::Llama);  // attention weights have 16 rows at least (k, v)
  expect_config_error(c, "[]", "strata.tiling: expected an object");
  expect_config_error(c, R"({"defualt": 2})", "unknown key 'defualt'");
  expect_config_error(c, R"({"default": 0})", "strata.tiling.default: tile count 0");
  expect_config_error(c, R"({"default": "two"})", "strata.tiling.default: expected a positive tile count");
  expect_config_error(c, R"({"default": 3})", "strata.tiling.default.attn: 3 tiles do not divide the 16");
  expect_config_error(c, R"({"default": {"atn": 2}})", "strata.tiling.default: unknown key 'atn'");
  expect_config_error(c, R"({"chunks": 64, "default": {"attn": 32}})",
                      "strata.tiling.default.attn: 32 tiles exceed the 16 rows");
  expect_config_error(c, R"({"default": 1000000})", "1000000 tiles exceed the 16 rows of the smallest attn weight");
  expect_config_error(c, R"({"chunks": 0})", "strata.tiling.chunks");
  expect_config_error(c, R"({"chunks": "many"})", "strata.tiling.chunks");
  expect_config_error(c, R"({"chunks": 12, "layers": {"0": 8}})", "strata.tiling.layers.0.attn: 8 tiles do not divide");
  expect_config_error(c, R"({"layers": {"2": 2}})", "strata.tiling.layers.2: '2' is not a block index");
  expect_config_error(c, R"({"layers": {"x": 2}})", "strata.tiling.layers.x");
  expect_config_error(c, R"({"layers": {"-1": 2}})", "strata.tiling.layers.-1");
  expect_config_error(c, R"({"layers": [2, 2]})", "strata.tiling.layers: expected an object");
  expect_config_error(c, R"({"layers": {"1": {"mlp": 5}}})", "strata.tiling.layers.1.mlp: 5 tiles");
  // A spec built by hand is checked when the decoder is built.
  TilingSpec bad;
  bad.layers = {BlockTiling{2, 2}};
  EXPECT_THROW(Decoder(c, {Checkpointing::Off, bad}), ConfigError) << "one entry for two blocks";
}

TEST(TilingSpecTest, AutoRulePicksTheFewestTilesThatFit) {
  for (const char* name : {"tiny", "tiny-llama", "gpt2-124m", "llama-7b"}) {
    const ModelConfig c = model_config_by_name(name);
    const std::uint64_t whole = decoder_block_group(c, 0).bytes();
    EXPECT_FALSE(auto_tiles(c, whole).tiled()) << name << ": a block that fits stays untiled";
    for (std::uint64_t budget : {whole - 1, whole / 2, whole / 5}) {
      const TilingSpec s = auto_tiles(c, budget);
      ASSERT_TRUE(s.tiled()) << name;
      validate_tiling(s, c);
      const BlockTiling b = s.block(0);
      for (std::int64_t l = 1; l < c.n_layers; ++l) EXPECT_EQ(s.block(l), b);
      EXPECT_LE(block_tile_bytes(c, b, s.chunks).live(), budget) << name;
      // Nothing with fewer tiles fits.
      for (std::int64_t a = 1; a <= s.chunks; ++a) {
        for (std::int64_t m = 1; m <= s.chunks; ++m) {
          if (s.chunks % a != 0 || s.chunks % m != 0 || a + m >= b.attn + b.mlp) continue;
          EXPECT_GT(block_tile_bytes(c, {a, m}, s.chunks).live(), budget) << name << " attn " << a << " mlp " << m;
        }
      }
    }
    // Too small for any tiling: refused with the numbers and the knobs.
    try {
      auto_tiles(c, 64);
      ADD_FAILURE() << name << ": a 64-byte budget was accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("stage3_max_live_parameters"), std::string::npos) << what;
      EXPECT_NE(what.find("strata.tiling.chunks"), std::string::npos) << what;
    }
  }
  // A fixed count is kept; the auto one is chosen beside it.
  const ModelConfig c = tiny(Architecture::Gpt2);
  const TilingSpec want = parse(c, R"({"default": {"attn": 2, "mlp": "auto"}})");
  const std::uint64_t budget = block_tile_bytes(c, {2, 4}, kDefaultTileChunks).live();
  const TilingSpec got = resolve_auto_tiles(want, c, budget);
  EXPECT_FALSE(got.has_auto());
  EXPECT_EQ(got.block(0).attn, 2);
  EXPECT_LE(got.block(0).mlp, 4);
  EXPECT_LE(block_tile_bytes(c, got.block(0), got.chunks).live(), budget);
}

}  // namespace
}  // namespace strata::models
