// The data x tensor x pipeline layout (plan/parallel_layout.h): for every factorization of 1, 2, 4
// and 8 ranks, coordinates and ranks are a bijection, tensor groups are consecutive ranks, pipeline
// groups stride by T and data groups by T x P, every rank is in exactly one group of each axis; a
// layout that does not divide the world is refused naming the keys and the valid choices.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/error.h"
#include "config/config.h"
#include "plan/parallel_layout.h"

namespace strata {
namespace {

ParallelConfig config(int t, int p) {
  ParallelConfig c;
  c.tensor = t;
  c.pipeline = p;
  return c;
}

TEST(ParallelLayout, EveryFactorizationIsABijectionWithTheDocumentedGroups) {
  int layouts = 0;
  for (int world : {1, 2, 4, 8}) {
    for (int t = 1; t <= world; t *= 2) {
      for (int p = 1; t * p <= world; p *= 2) {
        const ParallelLayout L(config(t, p), world, "test");
        ++layouts;
        SCOPED_TRACE(L.describe());
        EXPECT_EQ(L.data() * L.tensor() * L.pipeline(), world);
        std::set<std::vector<int>> tensor_groups, pipeline_groups, data_groups;
        for (int r = 0; r < world; ++r) {
          const RankCoords c = L.coords(r);
          EXPECT_EQ(L.rank_of(c), r);
          EXPECT_EQ(r, c.tensor + t * (c.pipeline + p * c.data));
          const std::vector<int> tg = L.tensor_group(r);
          ASSERT_EQ(tg.size(), static_cast<std::size_t>(t));
          for (int i = 0; i < t; ++i) EXPECT_EQ(tg[i], tg[0] + i) << "tensor groups are consecutive ranks";
          const std::vector<int> pg = L.pipeline_group(r);
          ASSERT_EQ(pg.size(), static_cast<std::size_t>(p));
          for (int i = 0; i < p; ++i) EXPECT_EQ(pg[i], pg[0] + i * t);
          const std::vector<int> dg = L.data_group(r);
          ASSERT_EQ(dg.size(), static_cast<std::size_t>(world / (t * p)));
          for (std::size_t i = 0; i < dg.size(); ++i) EXPECT_EQ(dg[i], dg[0] + static_cast<int>(i) * t * p);
          for (const auto* g : {&tg, &pg, &dg}) EXPECT_NE(std::find(g->begin(), g->end(), r), g->end());
          tensor_groups.insert(tg);
          pipeline_groups.insert(pg);
          data_groups.insert(dg);
        }
        EXPECT_EQ(tensor_groups.size(), static_cast<std::size_t>(world / t));
        EXPECT_EQ(pipeline_groups.size(), static_cast<std::size_t>(world / p));
        EXPECT_EQ(data_groups.size(), static_cast<std::size_t>(t * p));
      }
    }
  }
  EXPECT_EQ(layouts, 1 + 3 + 6 + 10);
}

TEST(ParallelLayout, ALayoutThatDoesNotDivideTheWorldNamesTheKeysAndTheChoices) {
  try {
    ParallelLayout(config(4, 1), 6, "run.json");
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("run.json: strata.parallel.tensor 4 x strata.parallel.pipeline 1 = 4 ranks"), std::string::npos) << m;
    EXPECT_NE(m.find("(tensor 2, pipeline 3)"), std::string::npos) << m;
    EXPECT_NE(m.find("(tensor 6, pipeline 1)"), std::string::npos) << m;
  }
  EXPECT_THROW(ParallelLayout(config(1, 3), 4, "x"), ConfigError);
}

}  // namespace
}  // namespace strata
