// models/pipeline.h: the stages' block ranges (balanced by parameters, or given), the GPipe and 1F1B
// schedules (every micro-batch's forward before its backward, backwards ascending, the in-flight
// bound of each), the groups each stage holds (a tied embedding with the first stage), and the
// refusals. The stages' arithmetic is tested
// end to end under mpirun (tests/tools/train_pipeline_parallel_test.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/decoder.h"
#include "models/pipeline.h"

namespace strata::models {
namespace {

std::string refusal(const ModelConfig& m, int stages, std::vector<std::int64_t> layers) {
  try {
    pipeline_boundaries(m, stages, layers, "run.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

ModelConfig llama(std::int64_t layers, std::int64_t vocab) {
  ModelConfig m = model_config_by_name("tiny-llama");
  m.n_layers = layers;
  m.vocab_size = vocab;
  return m;
}

TEST(Pipeline, BalancedStagesMinimizeTheLargestStage) {
  // Small embedding and head: equal blocks per stage, spare blocks to the later stages.
  const ModelConfig small = llama(8, 256);
  EXPECT_EQ(pipeline_boundaries(small, 4, {}, "run.json"), (std::vector<std::int64_t>{0, 2, 4, 6, 8}));
  EXPECT_EQ(pipeline_boundaries(small, 3, {}, "run.json").size(), 4u);
  EXPECT_EQ(pipeline_boundaries(small, 1, {}, "run.json"), (std::vector<std::int64_t>{0, 8}));
  // A vocabulary as large as several blocks: the first and last stages get fewer blocks.
  const ModelConfig big = llama(8, 8192);
  const std::vector<std::int64_t> b = pipeline_boundaries(big, 4, {}, "run.json");
  const std::vector<std::int64_t> params = pipeline_stage_params(big, b);
  EXPECT_LT(b[1] - b[0], b[2] - b[1]) << "the embedding's stage holds fewer blocks";
  EXPECT_LT(b[4] - b[3], b[3] - b[2]) << "the head's stage holds fewer blocks";
  // No other split of 8 blocks into 4 non-empty stages has a smaller largest stage.
  const std::int64_t best = *std::max_element(params.begin(), params.end());
  for (std::int64_t x = 1; x < 8; ++x) {
    for (std::int64_t y = x + 1; y < 8; ++y) {
      for (std::int64_t z = y + 1; z < 8; ++z) {
        const std::vector<std::int64_t> s = pipeline_stage_params(big, std::vector<std::int64_t>{0, x, y, z, 8});
        EXPECT_GE(*std::max_element(s.begin(), s.end()), best) << x << " " << y << " " << z;
      }
    }
  }
  std::int64_t total = 0;
  for (std::int64_t p : params) total += p;
  EXPECT_EQ(total, param_count(big));
}

TEST(Pipeline, GivenStageSizesAreCheckedAndKept) {
  const ModelConfig m = llama(8, 256);
  EXPECT_EQ(pipeline_boundaries(m, 3, std::vector<std::int64_t>{1, 5, 2}, "run.json"), (std::vector<std::int64_t>{0, 1, 6, 8}));
  const std::string sum = refusal(m, 2, {3, 3});
  EXPECT_NE(sum.find("run.json: strata.parallel.pipeline_layers = [3, 3] must give 2 stages"), std::string::npos) << sum;
  EXPECT_NE(sum.find("summing to model 'tiny-llama''s 8 layers"), std::string::npos) << sum;
  EXPECT_NE(refusal(m, 3, {4, 4}), "") << "two counts for three stages";
  EXPECT_NE(refusal(m, 2, {8, 0}), "") << "an empty stage";
  const std::string many = refusal(m, 9, {});
  EXPECT_NE(many.find("strata.parallel.pipeline = 9 stages for model 'tiny-llama' of 8 layers"), std::string::npos)
      << many;
}

TEST(Pipeline, SchedulesRunEachBackwardAfterItsForwardInAscendingOrder) {
  for (PipelineSchedule schedule : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB}) {
    for (int P : {1, 2, 4, 8}) {
      for (int m : {1, 3, 8}) {
        for (int p = 0; p < P; ++p) {
          const std::vector<PipelineOp> ops = pipeline_schedule(schedule, P, p, m);
          ASSERT_EQ(ops.size(), static_cast<std::size_t>(2 * m));
          std::set<int> forwarded;
          int next_forward = 0, next_backward = 0;
          for (const PipelineOp& op : ops) {
            if (op.forward) {
              EXPECT_EQ(op.micro, next_forward++);
              forwarded.insert(op.micro);
            } else {
              EXPECT_EQ(op.micro, next_backward++);
              EXPECT_TRUE(forwarded.count(op.micro)) << "backward of " << op.micro << " before its forward";
            }
          }
          const int want = schedule == PipelineSchedule::GPipe ? m : std::min(m, P - p);
          EXPECT_EQ(pipeline_in_flight(ops), want) << pipeline_schedule_name(schedule) << " P " << P << " p " << p;
        }
      }
    }
  }
  // PipeDream-Flush's order on the first of 4 stages over 6 micro-batches: 3 warm-up forwards, then
  // one forward and one backward in turn, then the remaining backwards.
  const std::vector<PipelineOp> ops = pipeline_schedule(PipelineSchedule::OneFOneB, 4, 0, 6);
  const std::vector<PipelineOp> want = {{true, 0},  {true, 1},  {true, 2},  {true, 3},  {false, 0}, {true, 4},
                                        {false, 1}, {true, 5},  {false, 2}, {false, 3}, {false, 4}, {false, 5}};
  EXPECT_EQ(ops, want);
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(4, 8), 3.0 / 11.0);
}

TEST(Pipeline, EachGroupBelongsToTheStageOfItsBlocks) {
  ModelConfig m = llama(4, 256);
  TilingSpec tiling;  // untiled
  const DecoderLayout layout = decoder_layout(m, tiling);
  const std::vector<int> stages = pipeline_group_stages(layout, std::vector<std::int64_t>{0, 1, 4});
  ASSERT_EQ(stages.size(), layout.groups.size());
  EXPECT_EQ(stages[layout.embedding], 0);
  EXPECT_EQ(stages[layout.blocks[0].base], 0);
  for (int l = 1; l < 4; ++l) EXPECT_EQ(stages[layout.blocks[static_cast<std::size_t>(l)].base], 1);
  EXPECT_EQ(stages[layout.head], 1);

  // A decoder built for a stage declares that stage's groups only, in model order.
  DecoderOptions opt;
  opt.pipeline = pipeline_stage(std::vector<std::int64_t>{0, 1, 4}, 1, nullptr);
  opt.pipeline.size = 2;
  const Decoder stage1(m, opt);
  std::vector<std::string> names;
  for (const auto& g : stage1.param_groups()) names.push_back(g.name);
  EXPECT_EQ(names, (std::vector<std::string>{"blocks.1", "blocks.2", "blocks.3", layout.groups[layout.head].name}));
  EXPECT_LT(stage1.activation_bytes(1, 32, true), Decoder(m, DecoderOptions{}).activation_bytes(1, 32, true));
}

TEST(Pipeline, ATiedEmbeddingStaysWithTheFirstStage) {
  // See Note [Tied embedding across stages] in models/pipeline.h.
  // The first stage holds the embedding (and the head's
  // buffers, to recompute the logits), the last stage the final norm only.
  const ModelConfig gpt = model_config_by_name("tiny");  // 2 layers, vocabulary 256, d_model 32
  const std::vector<std::int64_t> bounds{0, 1, 2};
  std::vector<std::vector<std::string>> names(2);
  for (int p = 0; p < 2; ++p) {
    DecoderOptions opt;
    opt.pipeline = pipeline_stage(bounds, p, nullptr);
    const Decoder d(gpt, opt);
    EXPECT_TRUE(d.tied_across_stages());
    EXPECT_EQ(d.tied_embedding_elems(), 256u * 32u);
    for (const auto& g : d.param_groups()) names[static_cast<std::size_t>(p)].push_back(g.name);
  }
  EXPECT_EQ(names[0], (std::vector<std::string>{"embedding", "blocks.0"}));
  EXPECT_EQ(names[1], (std::vector<std::string>{"blocks.1", "head"}));
  EXPECT_FALSE(Decoder(gpt, DecoderOptions{}).tied_across_stages());
  DecoderOptions untied;
  untied.pipeline = pipeline_stage(bounds, 0, nullptr);
  EXPECT_FALSE(Decoder(llama(2, 256), untied).tied_across_stages());
}

}  // namespace
}  // namespace strata::models
