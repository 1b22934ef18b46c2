// Tensor parallelism's pieces (models/tensor_parallel.h) on one process: the slices of every tensor,
// the vocabulary-parallel embedding and cross-entropy split over simulated ranks against the whole
// ops, bit for bit, and the refusals. The ranks together are tested under mpirun by
// tests/tools/train_tensor_parallel_test.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/decoder_params.h"
#include "models/kernels/ops.h"
#include "models/model_config.h"
#include "models/tensor_parallel.h"
#include "tests/models/op_test_util.h"

namespace strata::models {
namespace {

using namespace strata::models::testing;

const KernelContext kInline{};

bool same_bits(const void* a, const void* b, std::size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

TEST(TensorParallelLayout, SlicesOfEveryRankTileEachWholeTensorExactlyOnce) {
  ModelConfig odd = model_config_by_name("tiny");
  odd.vocab_size = 257;  // uneven vocabulary rows
  for (const ModelConfig& c : {odd, model_config_by_name("tiny-llama")}) {
    for (int T : {1, 2, 4}) {  // tiny-llama at 4: its 2 KV heads each on 2 ranks (Note [Replicated KV heads] in models/tensor_parallel.h)
      std::vector<TensorParallelLayout> ranks;
      for (int t = 0; t < T; ++t) ranks.push_back(tensor_parallel_layout(c, T, t));
      const std::vector<ParamGroupSpec>& whole = ranks[0].whole;  // physical groups, whole shapes
      std::size_t model_tensors = 0, found = 0;
      for (const ParamGroupSpec& g : decoder_param_groups(c)) model_tensors += g.tensors.size();
      for (const ParamGroupSpec& g : whole) found += g.tensors.size();
      EXPECT_EQ(found, model_tensors) << "every tensor of the model in exactly one physical group";
      for (std::size_t g = 0; g < whole.size(); ++g) {
        for (std::size_t k = 0; k < whole[g].tensors.size(); ++k) {
          const ParamTensorSpec& w = whole[g].tensors[k];
          std::vector<float> values(w.elems());
          std::iota(values.begin(), values.end(), 0.0f);
          std::vector<float> rebuilt(w.elems(), -1.0f);
          std::size_t total = 0;
          for (int t = 0; t < T; ++t) {
            const ParamTensorSpec& mine = ranks[static_cast<std::size_t>(t)].groups[g].tensors[k];
            EXPECT_EQ(mine.name, w.name);
            std::vector<float> part(mine.elems());
            cut_slice(w, ranks[static_cast<std::size_t>(t)].slices[g][k], values, part);
            place_slice(w, ranks[static_cast<std::size_t>(t)].slices[g][k], part, rebuilt);
            total += part.size();
          }
          const bool split = ranks[0].slices[g][k].kind != SliceKind::Whole;
          EXPECT_EQ(total, w.elems() * static_cast<std::size_t>(ranks[0].copies[g])) << w.name;
          const bool kv = ranks[0].groups[g].name.ends_with(".kv");
          EXPECT_EQ(ranks[0].copies[g], !split ? T : kv ? T / static_cast<int>(c.n_kv_heads) : 1) << w.name;
          EXPECT_EQ(ranks[0].replicated[g], T > 1 && !split) << w.name << ": a group is all split or all replicated";
          EXPECT_EQ(rebuilt, values) << w.name << " at T = " << T;
        }
      }
    }
  }
}

TEST(TensorParallelLayout, MegatronSplitOfGpt2Block) {
  const ModelConfig c = model_config_by_name("tiny");  // d_model 32, 4 heads, MLP 128
  const TensorParallelLayout L = tensor_parallel_layout(c, 2, 1);
  const std::size_t b = block_group_index(0);
  const ParamGroupSpec& block = L.logical[b];  // what the decoder indexes
  using namespace gpt2_block;
  EXPECT_EQ(block.tensors[kQkvW].shape, (std::vector<std::int64_t>{48, 32}));  // q, k, v rows of heads 2-3
  const TensorLocation qkv_at = L.where[b][kQkvW];
  const auto& qkv = L.slices[qkv_at.group][qkv_at.tensor].ranges;
  ASSERT_EQ(qkv.size(), 3u);
  EXPECT_EQ(qkv[0], (RowRange{16, 32}));
  EXPECT_EQ(qkv[1], (RowRange{48, 64}));
  EXPECT_EQ(qkv[2], (RowRange{80, 96}));
  EXPECT_EQ(block.tensors[kAttnProjW].shape, (std::vector<std::int64_t>{32, 16}));  // row-parallel: input columns
  EXPECT_EQ(block.tensors[kAttnProjB].shape, (std::vector<std::int64_t>{32}));      // replicated
  EXPECT_EQ(block.tensors[kFcW].shape, (std::vector<std::int64_t>{64, 32}));
  EXPECT_EQ(block.tensors[kMlpProjW].shape, (std::vector<std::int64_t>{32, 64}));
  // The engine's groups: the block's split weights and biases, then its replicated tensors.
  const ParamGroupSpec& split = L.groups[L.where[b][kQkvW].group];
  const ParamGroupSpec& rep = L.groups[L.where[b][kLn1W].group];
  EXPECT_EQ(split.name, "blocks.0");
  EXPECT_EQ(rep.name, "blocks.0.replicated");
  std::vector<std::string> names;
  for (const ParamTensorSpec& t : rep.tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"blocks.0.ln1.weight", "blocks.0.ln1.bias", "blocks.0.attn.proj.bias",
                                             "blocks.0.ln2.weight", "blocks.0.ln2.bias", "blocks.0.mlp.proj.bias"}));
  EXPECT_TRUE(L.replicated[L.where[b][kLn1W].group]);
  EXPECT_FALSE(L.replicated[L.where[b][kQkvW].group]);
  // GPT-2's head (the final norm) is all replicated; the embedding splits wte from wpe.
  EXPECT_TRUE(L.replicated[L.where[head_group_index(c)][head_group::kNormW].group]);
  EXPECT_EQ(L.logical[embedding_group_index()].tensors[embedding_group::kWte].shape,
            (std::vector<std::int64_t>{128, 32}));
  EXPECT_EQ(L.groups[L.where[embedding_group_index()][embedding_group::kWpe].group].name, "embedding.replicated");
  EXPECT_EQ(L.groups.size(), 1 + 1 + 2 * 2 + 1u);  // embedding (2), 2 blocks (2 each), head (1)
}

TEST(TensorParallelLayout, ReplicatedKvHeadsAreWholeHeadsInAGroupOfTheirOwn) {
  const ModelConfig c = model_config_by_name("tiny-llama");  // 4 heads, 2 KV heads, head_dim 8
  const std::size_t b = block_group_index(0);
  using namespace llama_block;
  for (int t = 0; t < 4; ++t) {
    const TensorParallelLayout L = tensor_parallel_layout(c, 4, t);
    const TensorLocation k = L.where[b][kK], v = L.where[b][kV], q = L.where[b][kQ];
    EXPECT_EQ(L.groups[k.group].name, "blocks.0.kv");
    EXPECT_EQ(v.group, k.group);
    EXPECT_EQ(L.copies[k.group], 2);
    EXPECT_FALSE(L.replicated[k.group]);
    EXPECT_EQ(L.copies[q.group], 1);
    EXPECT_EQ(L.groups[q.group].name, "blocks.0");
    EXPECT_EQ(L.slices[k.group][k.tensor].ranges, (std::vector<RowRange>{{t / 2 * 8, t / 2 * 8 + 8}}))
        << "rank " << t << " holds its queries' KV head whole";
    EXPECT_EQ(L.slices[q.group][q.tensor].ranges, (std::vector<RowRange>{{t * 8, t * 8 + 8}}));
    EXPECT_EQ(L.groups[L.where[b][kAttnNorm].group].name, "blocks.0.replicated");
  }
  EXPECT_EQ(kv_replicas(c, 4), 2);
  EXPECT_EQ(kv_replicas(c, 2), 1);
  EXPECT_TRUE(kv_pieces(c, 4));
  EXPECT_FALSE(kv_pieces(c, 2));
  EXPECT_FALSE(kv_pieces(c, 8)) << "8 slices of 4 query heads: not whole heads";
  EXPECT_FALSE(kv_pieces(model_config_by_name("tiny"), 8)) << "no grouped-query heads, nothing to split";
}

TEST(TensorParallelLayout, RefusesWhatItCannotSplit) {
  ModelConfig kv3 = model_config_by_name("tiny-llama");
  kv3.n_heads = 12;
  kv3.n_kv_heads = 3;  // 4 ranks split the heads but neither split the KV heads nor hold them whole
  kv3.d_model = 48;
  try {
    check_tensor_parallel(kv3, 4, 4, 16, "cfg.json");
    FAIL() << "4 tensor ranks over 3 KV heads were accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("KV heads fewer than the ranks divide it"), std::string::npos) << e.what();
  }
  const ModelConfig llama = model_config_by_name("tiny-llama");  // 4 heads, 2 KV heads
  EXPECT_NO_THROW(check_tensor_parallel(llama, 4, 4, 16, "cfg.json"));  // each KV head on 2 ranks
  EXPECT_NO_THROW(check_tensor_parallel(llama, 2, 8, 16, "cfg.json"));  // T <= K: the whole kernel per KV head
  try {  // KV heads on 2 ranks, but 8 slices would cut a query head in half
    check_tensor_parallel(llama, 4, 8, 16, "cfg.json");
    FAIL() << "8 slices of 4 heads with replicated KV heads were accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("Replicated KV heads"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("valid choices: 4"), std::string::npos) << e.what();
  }
  const ModelConfig tiny = model_config_by_name("tiny");
  for (int slices : {3, 6, 1, 32}) {  // not a power of two; not a multiple of T = 2; more than the chunks
    try {
      check_tensor_parallel(tiny, 2, slices, 16, "cfg.json");
      FAIL() << slices << " slices were accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("strata.parallel.tensor_slices"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("valid choices: 2, 4, 8, 16"), std::string::npos) << e.what();
    }
  }
  try {  // 4 heads do not split over 3 ranks: refused here too, not only by the trainer's shape check
    check_tensor_parallel(tiny, 3, 4, 16, "cfg.json");
    FAIL() << "3 tensor ranks of 4 heads were accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not split model 'tiny' evenly"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_tensor_parallel(tiny, 4, 8, 16, "cfg.json"));
}

class VocabParallel : public ::testing::TestWithParam<DType> {};

// The embedding split over T ranks: the ranks' outputs summed (one row and zeros per token) are
// the whole lookup, and the ranks' gradient rows stacked are the whole gradient, bit for bit.
TEST_P(VocabParallel, EmbeddingSlicesSumToTheWholeLookup) {
  const DType dt = GetParam();
  const std::int64_t batch = 2, seq = 5, ch = 24, vocab = 11, T = 3;
  const std::vector<std::int32_t> tokens = {1, 3, 10, 0, 5, 3, 7, 2, 9, 4};
  const Vec wte = quantize(random_vec(vocab * ch, 41), dt), wpe = quantize(random_vec(seq * ch, 42), dt);
  const Vec dy = quantize(random_vec(batch * seq * ch, 43), dt);
  const std::size_t e = dtype_bytes(dt);
  Buf TE = make_buf(wte, dt), PE = make_buf(wpe, dt), Y = make_buf(Vec(batch * seq * ch), dt);
  embedding_forward(kInline, dt, tokens.data(), TE.data(), PE.data(), Y.data(), batch, seq, ch);
  Buf DY = make_buf(dy, dt), DTE = make_buf(Vec(vocab * ch, 0), dt), DPE = make_buf(Vec(seq * ch, 0), dt);
  embedding_backward(kInline, dt, tokens.data(), DY.data(), DTE.data(), DPE.data(), batch, seq, ch);

  Buf sum = make_buf(Vec(batch * seq * ch, 0), dt);
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t v0 = t * vocab / T, v1 = (t + 1) * vocab / T;
    Buf part = make_buf(Vec(batch * seq * ch), dt);
    embedding_forward_vocab_slice(kInline, dt, tokens.data(), static_cast<char*>(TE.data()) + v0 * ch * e, v0, v1,
                                  PE.data(), part.data(), batch, seq, ch);
    residual_add(kInline, dt, sum.data(), part.data(), sum.data(), batch * seq * ch);
    Buf dte = make_buf(Vec((v1 - v0) * ch, 0), dt), dpe = make_buf(Vec(seq * ch, 0), dt);
    embedding_backward_vocab_slice(kInline, dt, tokens.data(), DY.data(), dte.data(), v0, v1, dpe.data(), batch, seq, ch);
    EXPECT_TRUE(same_bits(dte.data(), static_cast<const char*>(DTE.data()) + v0 * ch * e, dte.bytes.size()))
        << "rank " << t << "'s rows of dwte";
    EXPECT_TRUE(same_bits(dpe.data(), DPE.data(), dpe.bytes.size())) << "rank " << t << "'s dwpe";
  }
  EXPECT_TRUE(same_bits(sum.data(), Y.data(), Y.bytes.size())) << "summed slices differ from the whole lookup";
}

// The cross-entropy of `ranks` ranks holding `slices` / `ranks` vocabulary slices each, the
// collectives done by hand: losses and the dlogits of all columns.
struct SplitCe {
  std::vector<float> losses;
  Buf dlogits;
};
SplitCe split_cross_entropy(DType dt, const Vec& logits, const std::vector<std::int32_t>& targets, std::int64_t rows,
                            std::int64_t vocab, std::int64_t slices, std::int64_t ranks, float scale) {
  const std::int64_t L = slices / ranks;
  const std::size_t e = dtype_bytes(dt);
  std::vector<Buf> parts;
  std::vector<std::int64_t> begin;
  std::vector<float> row_max(static_cast<std::size_t>(rows), -INFINITY), target(static_cast<std::size_t>(rows), 0.0f);
  std::vector<double> all(static_cast<std::size_t>(ranks * rows * L));
  for (std::int64_t t = 0; t < ranks; ++t) {
    const std::int64_t v0 = t * L * vocab / slices, v1 = (t + 1) * L * vocab / slices;
    Vec mine;
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = v0; j < v1; ++j) mine.push_back(logits[static_cast<std::size_t>(r * vocab + j)]);
    }
    parts.push_back(make_buf(mine, dt));
    begin.push_back(v0);
    std::vector<float> m(static_cast<std::size_t>(rows));
    cross_entropy_row_max(kInline, dt, parts.back().data(), rows, v1 - v0, v1 - v0, m.data());
    for (std::int64_t r = 0; r < rows; ++r) row_max[r] = std::max(row_max[r], m[r]);  // all-reduce max
  }
  for (std::int64_t t = 0; t < ranks; ++t) {
    const std::int64_t cols = (t + 1) * L * vocab / slices - begin[t];
    std::vector<float> tl(static_cast<std::size_t>(rows));
    cross_entropy_slice_sums(kInline, dt, parts[t].data(), targets.data(), rows, cols, vocab, slices, t * L, L,
                             row_max.data(), all.data() + t * rows * L, tl.data());
    for (std::int64_t r = 0; r < rows; ++r) target[r] += tl[r];  // one rank's value and zeros
  }
  SplitCe out{std::vector<float>(static_cast<std::size_t>(rows)), make_buf(Vec(rows * vocab, 0), dt)};
  for (std::int64_t t = 0; t < ranks; ++t) {
    const std::int64_t cols = (t + 1) * L * vocab / slices - begin[t];
    cross_entropy_finish(kInline, dt, parts[t].data(), targets.data(), out.losses.data(), parts[t].data(), rows, cols,
                         vocab, slices, t * L, L, row_max.data(), all.data(), target.data(), scale);
    for (std::int64_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<char*>(out.dlogits.data()) + (r * vocab + begin[t]) * e,
                  static_cast<const char*>(parts[t].data()) + r * cols * e, cols * e);
    }
  }
  return out;
}

TEST_P(VocabParallel, OneSliceIsTheWholeCrossEntropyBitForBit) {
  const DType dt = GetParam();
  const std::int64_t rows = 5, vocab = 37;
  const std::vector<std::int32_t> targets = {3, 36, -1, 0, 20};
  const Vec logits = quantize(random_vec(rows * vocab, 44, -4, 4), dt);
  Buf L = make_buf(logits, dt);
  std::vector<float> want(rows);
  cross_entropy(kInline, dt, L.data(), targets.data(), want.data(), L.data(), rows, vocab, vocab, 0.25f);
  const SplitCe got = split_cross_entropy(dt, logits, targets, rows, vocab, 1, 1, 0.25f);
  EXPECT_TRUE(same_bits(got.losses.data(), want.data(), want.size() * 4));
  EXPECT_TRUE(same_bits(got.dlogits.data(), L.data(), L.bytes.size()));
}

TEST_P(VocabParallel, AnySplitOfTheSlicesIntoRanksGivesTheSameBits) {
  const DType dt = GetParam();
  const std::int64_t rows = 6, vocab = 53, slices = 8;  // uneven slices
  const std::vector<std::int32_t> targets = {0, 52, -1, 17, 30, 6};
  const Vec logits = quantize(random_vec(rows * vocab, 45, -6, 6), dt);
  const SplitCe one = split_cross_entropy(dt, logits, targets, rows, vocab, slices, 1, 0.5f);
  for (std::int64_t ranks : {2, 4, 8}) {
    const SplitCe split = split_cross_entropy(dt, logits, targets, rows, vocab, slices, ranks, 0.5f);
    EXPECT_TRUE(same_bits(split.losses.data(), one.losses.data(), one.losses.size() * 4)) << ranks << " ranks";
    EXPECT_TRUE(same_bits(split.dlogits.data(), one.dlogits.data(), one.dlogits.bytes.size())) << ranks << " ranks";
  }
  // And it is the cross-entropy: close to the whole op (the sum's order differs).
  Buf L = make_buf(logits, dt);
  std::vector<float> want(rows);
  cross_entropy(kInline, dt, L.data(), targets.data(), want.data(), L.data(), rows, vocab, vocab, 0.5f);
  for (std::int64_t r = 0; r < rows; ++r) EXPECT_NEAR(one.losses[r], want[r], 1e-5 * (1 + std::fabs(want[r])));
  expect_close("dlogits", read_buf(one.dlogits), read_buf(L), dtype_tolerance(dt));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, VocabParallel, ::testing::Values(DType::F32, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); });

}  // namespace
}  // namespace strata::models
