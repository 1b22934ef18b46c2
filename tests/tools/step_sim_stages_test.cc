// The pipelined step simulator (Note [Pipelined step simulation], sim/step_sim_stages.cc): cases
// whose answer is known exactly. With only compute taking time and equal stages, each stage's
// bubble is (P - 1) / (A + P - 1) under either schedule, the two schedules take the same time and
// differ in the micro-batches in flight; with only the link taking time, the messages' chain;
// every boundary carries batch x seq x d_model x dtype bytes per micro-batch each way. No timings
// are measured.
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "sim/step_sim.h"
#include "train/trainer.h"

namespace strata::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string config_path(const char* name) { return std::string(STRATA_CONFIGS_DIR) + "/" + name; }

// The LLaMA-style model of tools/pipeline-measure.sh: 8 equal blocks, an untied head.
const char* kEightBlocks =
    R"(strata.model={"name": "m8", "arch": "llama", "vocab_size": 256, "max_seq_len": 128, "n_layers": 8, )"
    R"("d_model": 256, "n_heads": 8, "n_kv_heads": 4, "ffn_hidden": 512})";

// Every figure infinite but the GPUs' compute (1 GFLOP/s): model ops alone take time.
SimMachine compute_only_machine(int gpus) {
  SimMachine m;
  m.spec.name = "test";
  m.spec.gpus = MachineGpus{gpus, std::uint64_t{80} << 30, 1e-3, kInf, kInf, kInf};
  m.spec.host.memory_bytes = std::uint64_t{1} << 40;
  m.spec.host.memory_gbps = kInf;
  m.spec.host.adam_params_per_s = kInf;
  m.device_memory_gbps = kInf;
  m.block_efficiency = 1;
  // The head and the embedding take no time: the stages are the blocks', equal when P divides them.
  m.head_efficiency = kInf;
  return m;
}

std::vector<StepWorkload> stage_workloads(int P, int A, const std::string& schedule,
                                          std::vector<std::string> extra = {}) {
  std::vector<std::string> sets{kEightBlocks,
                                "strata.data.seq_len=128",
                                "train_micro_batch_size_per_gpu=1",
                                "zero_optimization.stage=1",
                                "gradient_clipping=0",
                                "gradient_accumulation_steps=" + std::to_string(A),
                                "strata.parallel.pipeline=" + std::to_string(P),
                                "strata.parallel.schedule=\"" + schedule + "\""};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return make_stage_workloads(load_train_config(config_path("tiny.json"), sets), P, std::uint64_t{1} << 30);
}

double compute_flops(std::span<const SimAction> actions, ComputeClass cls) {
  double flops = 0;
  for (const SimAction& a : actions) flops += a.kind == SimAction::Compute && a.cls == cls ? a.flops : 0;
  return flops;
}

TEST(PipelinedStepSim, StagesAreThePlannersSplit) {
  const std::vector<StepWorkload> w = stage_workloads(4, 8, "1f1b");
  ASSERT_EQ(w.size(), 4u);
  const std::vector<std::int64_t> bounds = {0, 2, 4, 6, 8};
  for (std::size_t p = 0; p < w.size(); ++p) {
    EXPECT_EQ(w[p].stage.first_layer, bounds[p]);
    EXPECT_EQ(w[p].stage.end_layer, bounds[p + 1]);
    EXPECT_EQ(w[p].tokens_per_step, 8 * 128);
    // Each stage's engine holds its groups only: its blocks, the embedding on the first, the head on the last.
    const std::size_t expected = 2 + (p == 0 ? 1 : 0) + (p == 3 ? 1 : 0);
    EXPECT_EQ(w[p].plan.groups.size(), expected) << "stage " << p;
  }
}

TEST(PipelinedStepSim, EqualStagesGiveTheIdealBubbleUnderBothSchedules) {
  for (const int P : {2, 4}) {
    for (const int A : {4, 8}) {
      SCOPED_TRACE(testing::Message() << "P = " << P << ", A = " << A);
      const SimMachine m = compute_only_machine(P);
      const std::vector<StepWorkload> f1b = stage_workloads(P, A, "1f1b");
      const std::vector<StepWorkload> gp = stage_workloads(P, A, "gpipe");
      const PipelineSimResult r1 = simulate_pipelined_step(f1b, m);
      const PipelineSimResult rg = simulate_pipelined_step(gp, m);
      const double ideal = static_cast<double>(P - 1) / (A + P - 1);
      EXPECT_DOUBLE_EQ(r1.ideal_bubble_fraction, ideal);
      // One stage's micro-batch: its forward f and backward b; the step is (A + P - 1)(f + b).
      const double per_micro = (compute_flops(f1b[0].micro_batch, ComputeClass::Block)) / 1e9;
      EXPECT_NEAR(r1.step_seconds, (A + P - 1) * per_micro, 1e-9 * r1.step_seconds);
      EXPECT_NEAR(rg.step_seconds, r1.step_seconds, 1e-9 * r1.step_seconds);
      ASSERT_EQ(r1.stages.size(), static_cast<std::size_t>(P));
      for (int p = 0; p < P; ++p) {
        const StageSimResult& a = r1.stages[static_cast<std::size_t>(p)];
        const StageSimResult& g = rg.stages[static_cast<std::size_t>(p)];
        EXPECT_NEAR(a.bubble_fraction, ideal, 1e-9) << "1f1b stage " << p;
        EXPECT_NEAR(g.bubble_fraction, ideal, 1e-9) << "gpipe stage " << p;
        EXPECT_NEAR(a.busy_seconds, A * per_micro, 1e-9 * a.busy_seconds);
        // 1F1B keeps P - p micro-batches in flight on stage p, GPipe all of them.
        EXPECT_EQ(a.peak_in_flight, std::min(P - p, A)) << "1f1b stage " << p;
        EXPECT_EQ(g.peak_in_flight, A) << "gpipe stage " << p;
      }
    }
  }
}

TEST(PipelinedStepSim, RematerializedStagesRunOneMoreForwardPerMicroBatch) {
  const int P = 4, A = 8;
  const SimMachine m = compute_only_machine(P);
  const std::vector<StepWorkload> kept = stage_workloads(P, A, "1f1b");
  const std::vector<StepWorkload> remat = stage_workloads(P, A, "1f1b", {"strata.parallel.stage_recompute=true"});
  const PipelineSimResult rk = simulate_pipelined_step(kept, m);
  const PipelineSimResult rr = simulate_pipelined_step(remat, m);
  for (int p = 0; p < P; ++p) {
    const auto i = static_cast<std::size_t>(p);
    const double forward = compute_flops(kept[i].stage.forward(kept[i]), ComputeClass::Block) / 1e9;
    ASSERT_GT(forward, 0);
    EXPECT_EQ(remat[i].stage.activation_sets, 0);
    // The last stage's forward moves into its backward; every other stage runs it twice.
    const double extra = p == P - 1 ? 0 : A * forward;
    EXPECT_NEAR(rr.stages[i].busy_seconds - rk.stages[i].busy_seconds, extra, 1e-9 * rr.stages[i].busy_seconds)
        << "stage " << p;
  }
  EXPECT_TRUE(remat.back().stage.forward(remat.back()).empty());
  EXPECT_GT(rr.step_seconds, rk.step_seconds);
}

// Only the link takes time (1e6 bytes/s): P = 2, one message of t seconds per micro-batch each way.
// GPipe sends every activation, then every gradient back: 2 A t. 1F1B overlaps the two directions
// (each GPU's outgoing link is its own): the gradient of micro-batch a arrives at (a + 2) t.
TEST(PipelinedStepSim, OnlyTheLinkTakesTimeSoTheStepIsTheMessagesChain) {
  const int A = 6;
  SimMachine m = compute_only_machine(2);
  m.spec.gpus.bf16_tflops = kInf;
  m.spec.gpus.link_gbps = 1e-3;
  const std::vector<StepWorkload> gp = stage_workloads(2, A, "gpipe");
  const std::vector<StepWorkload> f1b = stage_workloads(2, A, "1f1b");
  const double t = gp[0].stage.boundary_bytes / 1e6;
  EXPECT_NEAR(simulate_pipelined_step(gp, m).step_seconds, 2 * A * t, 1e-9);
  EXPECT_NEAR(simulate_pipelined_step(f1b, m).step_seconds, (A + 1) * t, 1e-9);
}

// A stage's outputs are a ring of two buffers, each reused after its send completed, and a send
// completes once the next stage's exchange holding the receive has started (Note [Grouped
// transfers]; a message above MPI's eager limit). GPipe, stage 0 one block, stage 1 seven (f: one block's forward): stage 0's
// forwards 0-2 run back to back; forward 3 reuses micro-batch 1's buffer, whose receive stage 1
// posts after its forward 0, [f, 8f].
TEST(PipelinedStepSim, AnOutputBufferIsReusedOnlyOnceTheNextStageReceivedIt) {
  const SimMachine m = compute_only_machine(2);
  const std::vector<StepWorkload> w =
      stage_workloads(2, 6, "gpipe", {"strata.parallel.pipeline_layers=[1, 7]"});
  ASSERT_EQ(w[0].stage.end_layer, 1);
  const double f = compute_flops(w[0].stage.forward(w[0]), ComputeClass::Block) / 1e9;
  const PipelineSimResult r = simulate_pipelined_step(w, m);
  std::vector<double> starts;
  for (const SimOp& op : r.stages[0].sim.ops) {
    if (op.name.rfind("forward blocks.0", 0) == 0) starts.push_back(op.begin);
  }
  ASSERT_EQ(starts.size(), 6u);
  EXPECT_NEAR(starts[1], 1 * f, 1e-9);
  EXPECT_NEAR(starts[2], 2 * f, 1e-9);
  EXPECT_NEAR(starts[3], 8 * f, 1e-9);
  EXPECT_NEAR(starts[4], 15 * f, 1e-9);  // micro-batch 2's receive: after stage 1's forward 1, [8f, 15f]
}

TEST(PipelinedStepSim, EveryBoundaryCarriesBatchSeqWidthPerMicroBatchEachWay) {
  const int P = 4, A = 8;
  SimMachine m = compute_only_machine(P);
  m.spec.gpus.link_gbps = 100;
  const std::vector<StepWorkload> w = stage_workloads(P, A, "1f1b", {"train_micro_batch_size_per_gpu=2"});
  const double boundary = 2.0 * 128 * 256 * 4;  // batch x seq x d_model x fp32
  EXPECT_DOUBLE_EQ(w[0].stage.boundary_bytes, boundary);
  EXPECT_EQ(w[0].stage.tied_bytes, 0);  // LLaMA: no tied embedding
  const PipelineSimResult r = simulate_pipelined_step(w, m);
  for (int p = 0; p < P; ++p) {
    const StageSimResult& s = r.stages[static_cast<std::size_t>(p)];
    const int neighbours = (p > 0 ? 1 : 0) + (p + 1 < P ? 1 : 0);
    EXPECT_EQ(s.sent_bytes, static_cast<std::uint64_t>(neighbours * A * boundary)) << "stage " << p;
    EXPECT_EQ(s.received_bytes, static_cast<std::uint64_t>(neighbours * A * boundary)) << "stage " << p;
    int sends = 0;
    for (const SimOp& op : s.sim.ops) {
      if (op.lane != SimLane::SendNext && op.lane != SimLane::SendPrev) continue;
      EXPECT_EQ(op.bytes, static_cast<std::uint64_t>(boundary)) << op.name;
      EXPECT_EQ(op.queue, SimQueue::Collective);
      EXPECT_NEAR(op.end - op.begin, boundary / 100e9, 1e-12);  // times of a step of seconds
      ++sends;
    }
    EXPECT_EQ(sends, neighbours * A) << "stage " << p;
  }
}

// GPT-2's tied embedding (Note [Tied embedding across stages] in models/pipeline.h): the first stage sends the weights
// to the last once per step, the last sends its final-norm output back per micro-batch, and the
// first recomputes the logits from it (one more vocabulary matmul per micro-batch).
TEST(PipelinedStepSim, TiedEmbeddingTrafficAndTheFirstStagesHeadRecompute) {
  const int A = 4;
  const TrainConfig cfg = load_train_config(
      config_path("tiny.json"),
      {"strata.parallel.pipeline=2", "gradient_accumulation_steps=" + std::to_string(A), "gradient_clipping=0"});
  const std::vector<StepWorkload> w = make_stage_workloads(cfg, 2, std::uint64_t{64} << 20);
  const double B = 2.0 * 32 * 32 * 4, tied = 256.0 * 32 * 4;  // tiny: 2 x 32 tokens, d_model 32, vocabulary 256
  EXPECT_DOUBLE_EQ(w[0].stage.boundary_bytes, B);
  EXPECT_DOUBLE_EQ(w[0].stage.tied_bytes, tied);
  SimMachine m = compute_only_machine(2);
  m.spec.gpus.link_gbps = 1;
  const PipelineSimResult r = simulate_pipelined_step(w, m);
  EXPECT_EQ(r.stages[0].sent_bytes, static_cast<std::uint64_t>(A * B + tied));
  EXPECT_EQ(r.stages[0].received_bytes, static_cast<std::uint64_t>(2 * A * B));
  EXPECT_EQ(r.stages[1].sent_bytes, static_cast<std::uint64_t>(2 * A * B));
  EXPECT_EQ(r.stages[1].received_bytes, static_cast<std::uint64_t>(A * B + tied));
  // The head's FLOPs: the last stage's logits and their input gradient (2 vocabulary matmuls), the
  // first stage's recomputed logits and the tied weight's gradient (2 more).
  const double vocab_matmul = 2.0 * 256 * 32 * 64;
  EXPECT_DOUBLE_EQ(compute_flops(w[1].stage.backward(w[1]), ComputeClass::Head), 2 * vocab_matmul);
  EXPECT_DOUBLE_EQ(compute_flops(w[0].stage.backward(w[0]), ComputeClass::Head), 2 * vocab_matmul);
  const StepWorkload one = make_step_workload(load_train_config(config_path("tiny.json"), {"gradient_clipping=0"}), 1,
                                              std::uint64_t{64} << 20);
  // Without stages: logits, input gradient, the tied weight's gradient, and the logits of the
  // micro-batch's second sequence recomputed for it (Note [Head one sequence at a time] in models/decoder.h).
  EXPECT_DOUBLE_EQ(compute_flops(one.micro_batch, ComputeClass::Head), 3.5 * vocab_matmul);
}

TEST(PipelinedStepSim, MoreStagesThanLayersGetThePlannersMessage) {
  const TrainConfig cfg = load_train_config(config_path("tiny.json"), {"strata.parallel.pipeline=4"});
  try {
    make_stage_workloads(cfg, 4, std::uint64_t{64} << 20);
    FAIL() << "4 stages of a 2-layer model accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("each stage needs at least one layer: valid choices 1..2"), std::string::npos)
        << e.what();
  }
}

TEST(PipelinedStepSim, StagesNeedTheGpuLink) {
  SimMachine m = compute_only_machine(2);
  m.spec.gpus.link_gbps = 0;
  try {
    simulate_pipelined_step(stage_workloads(2, 4, "1f1b"), m);
    FAIL() << "no GPU link accepted for 2 stages";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("gpus.link_gbps"), std::string::npos) << e.what();
  }
}

TEST(PipelinedStepSim, TraceHasOneProcessPerStage) {
  SimMachine m = compute_only_machine(4);
  m.spec.gpus.link_gbps = 1;
  const PipelineSimResult r = simulate_pipelined_step(stage_workloads(4, 4, "gpipe"), m);
  const std::string path = ::testing::TempDir() + "/step_sim_stages_trace.json";
  write_stage_trace(r, path);
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::set<int> pids;
  std::set<std::string> threads;
  for (const auto& e : j.at("traceEvents")) {
    pids.insert(e.at("pid").get<int>());
    if (e.at("ph") == "M" && e.at("name") == "thread_name") {
      threads.insert(std::to_string(e.at("pid").get<int>()) + ": " + e.at("args").at("name").get<std::string>());
    }
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2, 3}));
  for (const char* t : {"0: compute", "0: link to stage 1", "2: link to stage 1",
                        "2: link to stage 3", "3: link to stage 2"}) {
    EXPECT_TRUE(threads.count(t)) << t;
  }
  std::remove(path.c_str());
}

// Tensor parallelism inside each stage: the stage's rank holds its slices, and its tensor group's
// collectives run on its compute stream.
TEST(PipelinedStepSim, TensorRanksInsideStages) {
  const TrainConfig cfg = load_train_config(
      config_path("tiny.json"), {"strata.parallel.pipeline=2", "strata.parallel.tensor=2", "gradient_clipping=0"});
  const std::vector<StepWorkload> w = make_stage_workloads(cfg, 4, std::uint64_t{64} << 20);
  ASSERT_EQ(w.size(), 2u);
  SimMachine m = compute_only_machine(4);
  m.spec.gpus.bf16_tflops = kInf;
  m.spec.gpus.link_gbps = 1;
  const PipelineSimResult r = simulate_pipelined_step(w, m);
  for (const StageSimResult& s : r.stages) {
    EXPECT_GT(s.sim.busy_seconds[static_cast<std::size_t>(SimQueue::Collective)], 0);
  }
  EXPECT_EQ(w[0].tensor_ranks, 2);
  EXPECT_EQ(w[0].plan.topo.world_size, 1);
  EXPECT_GT(r.step_seconds, 0);
}

}  // namespace
}  // namespace strata::sim
