// Tests of the flat, padded, sharded layout of param groups and of hybrid-sharding topology.
#include <gtest/gtest.h>

#include "core/error.h"
#include "plan/partition.h"

namespace strata {
namespace {

ParamGroupSpec group_of(std::vector<std::vector<std::int64_t>> shapes) {
  ParamGroupSpec g;
  g.name = "blocks.0";
  int i = 0;
  for (auto& s : shapes) g.tensors.push_back(ParamTensorSpec{"t" + std::to_string(i++), s, DType::F32});
  return g;
}

TEST(GroupLayout, AlignsTensorsAndPadsToWholeAlignedShards) {
  const auto spec = group_of({{3, 5}, {7}, {100, 33}});
  for (int shards : {1, 2, 3, 4, 8}) {
    GroupLayout layout(spec, shards);
    EXPECT_EQ(layout.payload_elems(), 15u + 7u + 3300u);
    ASSERT_EQ(layout.slots().size(), 3u);
    EXPECT_EQ(layout.slots()[0].offset_elems, 0u);
    EXPECT_EQ(layout.slots()[1].offset_elems, 64u);
    EXPECT_EQ(layout.slots()[2].offset_elems, 128u);
    EXPECT_EQ(layout.slots()[2].elems, 3300u);
    EXPECT_EQ(layout.total_elems() % (kShardAlignElems * static_cast<std::size_t>(shards)), 0u);
    EXPECT_GE(layout.total_elems(), 128u + 3300u);
    EXPECT_EQ(layout.shard_elems() * static_cast<std::size_t>(shards), layout.total_elems());
    EXPECT_EQ(layout.shard_begin(shards - 1) + layout.shard_elems(), layout.total_elems());
    // Every shard is whole 4 KiB blocks in 16-bit and in fp32.
    EXPECT_EQ(layout.shard_elems() * 2 % 4096, 0u);
    EXPECT_EQ(layout.shard_elems() * 4 % 4096, 0u);
  }
}

TEST(GroupLayout, SlotsDoNotOverlap) {
  const auto spec = group_of({{64}, {1}, {65}, {128, 2}, {1}});
  GroupLayout layout(spec, 4);
  for (std::size_t i = 1; i < layout.slots().size(); ++i) {
    const auto& prev = layout.slots()[i - 1];
    EXPECT_GE(layout.slots()[i].offset_elems, prev.offset_elems + prev.elems);
    EXPECT_EQ(layout.slots()[i].offset_elems % kTensorAlignElems, 0u);
  }
}

TEST(ShardTopology, HybridShardingGroups) {
  const auto t = make_shard_topology(4, 3, 3, 2);
  EXPECT_EQ(t.sharding_factor, 2);
  EXPECT_EQ(t.shard_index(), 1);
  EXPECT_EQ(t.shard_group(), 1);
  EXPECT_EQ(t.replica_count(), 2);
  EXPECT_EQ(make_shard_topology(4, 2, 3, 0).sharding_factor, 4);
  EXPECT_EQ(make_shard_topology(4, 2, 0, 0).sharding_factor, 1);
}

TEST(ShardTopology, FactorMustDivideWorld) {
  try {
    make_shard_topology(4, 0, 3, 3);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("mics_shard_size"), std::string::npos);
  }
  EXPECT_THROW(make_shard_topology(2, 0, 2, 4), ConfigError);
}

}  // namespace
}  // namespace strata
