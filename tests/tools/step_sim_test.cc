// The step simulator (sim/step_sim.h, Note [Step simulator] in sim/step_sim.h): cases whose answer is known
// exactly (one finite queue, a pipeline with one slot), the pipeline's slot bound, monotonicity in
// the drives' speed, and the trace file. No timings are measured.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/tensor_parallel.h"
#include "sim/step_sim.h"
#include "sim/step_sim_timeline.h"
#include "train/trainer.h"

namespace strata::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string config_path(const char* name) { return std::string(STRATA_CONFIGS_DIR) + "/" + name; }

// Every figure infinite: each operation takes no time until a test makes one queue finite.
SimMachine instant_machine() {
  SimMachine m;
  m.spec.name = "test";
  m.spec.gpus = MachineGpus{1, std::uint64_t{80} << 30, kInf, kInf, kInf, kInf};
  m.spec.host.memory_bytes = std::uint64_t{1} << 40;
  m.spec.host.memory_gbps = kInf;
  m.spec.host.adam_params_per_s = kInf;
  m.spec.drives.count = 2;
  m.spec.drives.read_gbps = m.spec.drives.write_gbps = kInf;
  m.device_memory_gbps = kInf;
  m.block_efficiency = m.head_efficiency = 1;
  return m;
}

StepWorkload demo_workload() {
  return make_step_workload(load_train_config(config_path("demo.json"), {}), 1, std::uint64_t{6} << 20);
}

double queue(const SimResult& r, SimQueue q) { return r.busy_seconds[static_cast<std::size_t>(q)]; }

TEST(Timeline, FillsGapsAndKeepsLaneOrder) {
  Timeline t;
  EXPECT_DOUBLE_EQ(t.add("a", SimLane::Io, SimQueue::Nvme, 1, 0), 1);
  EXPECT_DOUBLE_EQ(t.add("b", SimLane::Io, SimQueue::Nvme, 1, 3), 4);
  EXPECT_DOUBLE_EQ(t.add("c", SimLane::Io, SimQueue::Nvme, 1.5, 0.5), 2.5);  // the gap [1, 3) holds it
  EXPECT_DOUBLE_EQ(t.add("d", SimLane::Io, SimQueue::Nvme, 1, 2), 5);        // [2.5, 3) is too short
  EXPECT_DOUBLE_EQ(t.add("e", SimLane::Comm, SimQueue::H2D, 1, 0), 1);
  EXPECT_DOUBLE_EQ(t.add("f", SimLane::Comm, SimQueue::Collective, 1, 0), 2);  // after e on its lane
  EXPECT_DOUBLE_EQ(t.busy_seconds(SimQueue::Nvme, 0, 10), 4.5);
}

TEST(Timeline, SharedQueuesSerialize) {
  Timeline t({SimQueue::Compute, SimQueue::H2D, SimQueue::D2H, SimQueue::Collective, SimQueue::Nvme,
              SimQueue::Compute});
  t.add("model op", SimLane::Compute, SimQueue::Compute, 2, 0);
  EXPECT_DOUBLE_EQ(t.add("adam", SimLane::Worker, SimQueue::Cpu, 1, 0), 3);
}

std::vector<PipelineJob> jobs(int n) {
  std::vector<PipelineJob> j(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    j[static_cast<std::size_t>(i)] = PipelineJob{"job" + std::to_string(i), 100, 100, 0, 0, 1.0};
  }
  return j;
}

const PipelineRates kHundredBytesPerSecond{100, 100, kInf, kInf, {}};

TEST(Pipeline, OneSlotSerializesReadRunWrite) {
  Timeline t;
  EXPECT_DOUBLE_EQ(simulate_pipeline(t, SimLane::Worker, 0, jobs(5), 1, kHundredBytesPerSecond), 5 * 3.0);
  EXPECT_DOUBLE_EQ(t.lane_end(SimLane::Worker), 15);  // the thread returns when the writes completed
}

TEST(Pipeline, MoreSlotsOverlapUpToTheDrive) {
  for (std::size_t slots : {2, 3, 4, 8}) {
    Timeline t;
    const double end = simulate_pipeline(t, SimLane::Worker, 0, jobs(6), slots, kHundredBytesPerSecond);
    // The drive serves 12 transfers of 1 s: that bound is reached once reads run ahead of writes.
    EXPECT_DOUBLE_EQ(end, 12) << slots << " slots";
  }
}

// On a drive curve each NVMe transfer takes the curve's figure at its own requests and depth (Note
// [Drive curves] in plan/machine_curve.h): a parameter fetch, waited for, at its chunks' reads; a
// gradient combine's read of the partial sum at one request per chunk, its group's chunks in flight.
TEST(StepSim, EachTransferReadsTheCurveAtItsRequestsAndDepth) {
  SimMachine m = instant_machine();
  m.spec.drives.count = 1;
  m.spec.drives.read_gbps = m.spec.drives.write_gbps = 100;  // not used: the curve is
  // 64 KiB .. 4 MiB (six octaves), depths 1 .. 16 (four octaves); reads rise with both.
  m.spec.drives.curve = DriveCurve{{64 << 10, 4 << 20}, {1, 16}, {{1, 2}, {4, 8}}, {{1, 1}, {1, 1}}};
  const StepWorkload w = demo_workload();
  ASSERT_FALSE(w.exact);  // fast mode: unit 1 of a combine reads the partial sum, 4 bytes an element
  ASSERT_EQ(w.plan.offload.nvme_dirs.size(), 1u);
  const SimResult r = simulate_step(w, m);
  const auto gbps = [&](double request, double depth) {
    const double s = std::clamp(std::log2(request / (64 << 10)) / 6, 0.0, 1.0);
    const double q = std::clamp(std::log2(depth) / 4, 0.0, 1.0);
    return (1 + q) * (1 - s) + (4 + 4 * q) * s;
  };
  const auto pages = [](double bytes) { return std::ceil(bytes / 4096) * 4096; };
  const double limit = 4 << 20;  // the engine's default largest read
  int fetches = 0, sums = 0;
  for (std::size_t g = 0; g < w.plan.groups.size(); ++g) {
    const GroupPlan& P = w.plan.groups[g];
    double fetch_bytes = 0, fetch_requests = 0;
    for (const StateChunk& c : P.chunks) {
      if (c.params != Home::Nvme) continue;
      fetch_bytes += static_cast<double>(c.elems * w.plan.working_bytes());
      fetch_requests += std::ceil(pages(static_cast<double>(c.elems * w.plan.working_bytes())) / limit);
    }
    const double streams = static_cast<double>(std::min(w.plan.offload.slot_count, P.chunks.size()));
    for (const SimOp& op : r.ops) {
      if (op.name == "nvme read params " + w.group_names[g] && op.begin > 0 && op.end < r.step_seconds) {
        ++fetches;
        EXPECT_NEAR(op.end - op.begin, fetch_bytes / (gbps(std::round(fetch_bytes / fetch_requests), fetch_requests) * 1e9), 1e-12)
            << op.name;
      }
      for (std::size_t k = 0; k < P.chunks.size(); ++k) {
        if (op.name != fmt::format("nvme read sum {}.{} unit 1", w.group_names[g], k)) continue;
        ++sums;
        const double bytes = 4.0 * static_cast<double>(P.chunks[k].elems);
        const double requests = std::ceil(pages(bytes) / limit);
        EXPECT_EQ(static_cast<double>(op.bytes), bytes) << op.name;
        EXPECT_NEAR(op.end - op.begin, bytes / (gbps(std::round(bytes / requests), requests * streams) * 1e9), 1e-12) << op.name;
      }
    }
  }
  EXPECT_GT(fetches, 10);
  EXPECT_GT(sums, 10);
}

// See Note [Wake-ups] in sim/step_sim.h.
// Each copy of a job costs its bytes and two wake-ups (the transfer stream's
// worker, then the thread waiting for it); the CPU work between them none.
TEST(Pipeline, EachCopyWakesTheStreamAndTheThread) {
  Timeline t({SimQueue::Compute, SimQueue::H2D, SimQueue::D2H, SimQueue::Collective, SimQueue::Nvme, SimQueue::Cpu},
             0.25);
  const std::vector<PipelineJob> js(3, PipelineJob{"job", 0, 0, 100, 100, 1.0});
  // Per job: a wake-up, 1 s down, a wake-up, 1 s of CPU, a wake-up, 1 s up, a wake-up.
  EXPECT_DOUBLE_EQ(simulate_pipeline(t, SimLane::Worker, 0, js, 2, PipelineRates{kInf, kInf, 100, 100, {}}), 3 * 4.0);
}

TEST(Pipeline, NeverMoreJobsInFlightThanSlots) {
  for (std::size_t slots : {1, 2, 3}) {
    Timeline t;
    const std::vector<PipelineJob> js = jobs(9);
    simulate_pipeline(t, SimLane::Worker, 0, js, slots, PipelineRates{400, 50, kInf, kInf, {}});
    // A job holds its slot from its read's start to its write's end.
    std::vector<std::pair<double, double>> held(js.size(), {kInf, 0});
    for (const SimOp& op : t.ops()) {
      for (std::size_t i = 0; i < js.size(); ++i) {
        if (op.name.find(js[i].name) == std::string::npos || op.name.size() > js[i].name.size() + 11) continue;
        held[i].first = std::min(held[i].first, op.begin);
        held[i].second = std::max(held[i].second, op.end);
      }
    }
    for (const auto& [begin, end] : held) {
      const auto overlapping = std::count_if(held.begin(), held.end(), [&](const auto& h) {
        return h.first <= begin + 1e-12 && h.second > begin + 1e-12;
      });
      EXPECT_LE(static_cast<std::size_t>(overlapping), slots) << "at " << begin;
    }
  }
}

TEST(StepSim, OnlyTheDrivesTakeTimeSoTheStepIsTheirTime) {
  SimMachine m = instant_machine();
  m.spec.drives.read_gbps = 2;
  m.spec.drives.write_gbps = 1;
  const SimResult r = simulate_step(demo_workload(), m);
  ASSERT_GT(r.step_seconds, 0);
  EXPECT_NEAR(r.step_seconds, queue(r, SimQueue::Nvme), 1e-12);
  EXPECT_NEAR(r.lower_bound_seconds, r.step_seconds, 1e-12);
  EXPECT_EQ(r.slowest, SimQueue::Nvme);
  const double expected = static_cast<double>(r.nvme_read_bytes) / 4e9 + static_cast<double>(r.nvme_written_bytes) / 2e9;
  EXPECT_NEAR(r.step_seconds, expected, 1e-9);
}

// Two ranks share the node's drives: the simulated rank gets half their bandwidth.
TEST(StepSim, RanksShareTheDrives) {
  SimMachine m = instant_machine();
  m.spec.gpus.count = 2;
  m.spec.drives.read_gbps = 2;
  m.spec.drives.write_gbps = 1;
  const StepWorkload w = make_step_workload(load_train_config(config_path("demo.json"), {}), 2, std::uint64_t{6} << 20);
  ASSERT_EQ(w.plan.topo.world_size, 2);
  const SimResult r = simulate_step(w, m);
  ASSERT_GT(r.nvme_written_bytes, 0u);
  const double expected = static_cast<double>(r.nvme_read_bytes) / 2e9 + static_cast<double>(r.nvme_written_bytes) / 1e9;
  EXPECT_NEAR(r.step_seconds, expected, 1e-9);
}

// See Note [Wake-ups] in sim/step_sim.h.
// A lane idle when its operation becomes ready starts it a wake-up late; a lane
// still busy, or the I/O lane (no thread of its own), does not.
TEST(Timeline, AnIdleLaneStartsAWakeUpLate) {
  Timeline t({SimQueue::Compute, SimQueue::H2D, SimQueue::D2H, SimQueue::Collective, SimQueue::Nvme, SimQueue::Cpu},
             0.5);
  EXPECT_DOUBLE_EQ(t.add("a", SimLane::Comm, SimQueue::Collective, 1, 0), 1);    // never ran before: ready at 0
  EXPECT_DOUBLE_EQ(t.add("b", SimLane::Comm, SimQueue::Collective, 1, 0.5), 2);  // queued behind a
  EXPECT_DOUBLE_EQ(t.add("c", SimLane::Comm, SimQueue::Collective, 1, 3), 4.5);  // idle from 2: woken at 3
  EXPECT_DOUBLE_EQ(t.add("d", SimLane::Io, SimQueue::Nvme, 1, 3), 4);
}

// With compute the only figure that takes time, wake-ups add to the step at least one of
// themselves per host wait that blocks (each micro-batch's loss, step()'s wait for the
// reductions and its wait for the norm, Note [One wait for the norm] in
// engine/state_home_device.cc). The device home's norm is one pass on the comm stream; the tiered
// home's is in its chunk jobs.
TEST(StepSim, EveryWaitCostsAWakeUp) {
  const StepWorkload w = make_step_workload(load_train_config(config_path("tiny.json"), {}), 1, std::uint64_t{64} << 20);
  ASSERT_EQ(w.micro_batches, 2);
  SimMachine m = instant_machine();
  m.spec.gpus.bf16_tflops = 1e-3;
  m.device_memory_gbps = 1;  // so that the norm's pass has a length
  const double plain = simulate_step(w, m).step_seconds;
  EXPECT_GT(plain, 0);
  m.wake_seconds = 1e-3;
  const SimResult r = simulate_step(w, m);
  // The lanes' wake-ups partly overlap each other, so the sum need not be a whole number of them.
  EXPECT_GE((r.step_seconds - plain) / m.wake_seconds, w.micro_batches + 2 - 1e-9) << r.step_seconds;
  const auto norms = [](const SimResult& res) {
    return std::count_if(res.ops.begin(), res.ops.end(), [](const SimOp& op) {
      return op.lane == SimLane::Comm && op.name == "gradient norm";
    });
  };
  EXPECT_EQ(norms(r), 1);
  const StepWorkload offloaded = make_step_workload(
      load_train_config(config_path("tiny.json"), {"zero_optimization.offload_optimizer.device=cpu"}), 1,
      std::uint64_t{64} << 20);
  EXPECT_EQ(norms(simulate_step(offloaded, m)), 0);
}

// See Note [Reductions in flight] in engine/grad_reducer.cc.
// With instant compute and a slow GPU link, the host would enqueue the
// whole backward at time 0; the engine lets at most two reductions stay queued, so the last group's
// backward starts only after the third-to-last reduction ended.
TEST(StepSim, AtMostTwoReductionsStayQueued) {
  SimMachine m = instant_machine();
  m.spec.gpus.count = 2;
  m.spec.gpus.link_gbps = 1;
  const StepWorkload w = make_step_workload(
      load_train_config(config_path("tiny.json"), {"zero_optimization.stage=0", "gradient_accumulation_steps=1"}), 2,
      std::uint64_t{64} << 20);
  const SimResult r = simulate_step(w, m);
  std::vector<double> reduced;  // when each reduction ended, in comm order
  double last_compute = -1;
  for (const SimOp& op : r.ops) {
    if (op.lane == SimLane::Comm && op.name.rfind("all_reduce ", 0) == 0) reduced.push_back(op.end);
    if (op.lane == SimLane::Compute) last_compute = std::max(last_compute, op.begin);
  }
  ASSERT_GE(reduced.size(), 3u);
  std::sort(reduced.begin(), reduced.end());
  EXPECT_GT(reduced.front(), 0);
  EXPECT_GE(last_compute, reduced[reduced.size() - 3]);
}

TEST(StepSim, OnlyComputeTakesTimeSoTheStepIsTheFlops) {
  SimMachine m = instant_machine();
  m.spec.gpus.bf16_tflops = 1e-3;  // 1e9 FLOP/s
  m.block_efficiency = m.head_efficiency = 0.5;
  const StepWorkload w = demo_workload();
  double flops = 0;
  for (const SimAction& a : w.micro_batch) flops += a.flops;
  const SimResult r = simulate_step(w, m);
  EXPECT_NEAR(r.step_seconds, flops * w.micro_batches / 0.5e9, 1e-9);
  EXPECT_NEAR(queue(r, SimQueue::Compute), r.step_seconds, 1e-9);
  // The demo checkpoints activations: 8 blocks forward, recomputed and backward per micro-batch.
  EXPECT_EQ(std::count_if(w.micro_batch.begin(), w.micro_batch.end(),
                          [](const SimAction& a) { return a.name.rfind("recompute blocks.", 0) == 0; }),
            8);
}

TEST(StepSim, FasterDrivesNeverSlowTheStep) {
  const StepWorkload w = demo_workload();
  SimMachine m = instant_machine();
  m.spec.gpus.bf16_tflops = 0.05;
  m.spec.gpus.pcie_h2d_gbps = m.spec.gpus.pcie_d2h_gbps = 4;
  m.spec.host.adam_params_per_s = 2e8;
  m.spec.host.memory_gbps = 10;
  m.device_memory_gbps = 10;
  double previous = kInf;
  for (double gbps : {0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0}) {
    m.spec.drives.read_gbps = m.spec.drives.write_gbps = gbps;
    const SimResult r = simulate_step(w, m);
    EXPECT_LE(r.step_seconds, previous + 1e-12) << gbps << " GB/s";
    EXPECT_GE(r.step_seconds, r.lower_bound_seconds - 1e-12);
    previous = r.step_seconds;
  }
}

TEST(StepSim, MissingFiguresAreNamed) {
  SimMachine m = instant_machine();
  m.spec.drives.count = 0;
  try {
    simulate_step(demo_workload(), m);
    FAIL() << "no drives accepted for a config on NVMe";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("drives.count"), std::string::npos) << e.what();
  }
  m = instant_machine();
  m.spec.gpus.count = 2;
  m.spec.gpus.link_gbps = 0;
  const StepWorkload two = make_step_workload(load_train_config(config_path("tiny.json"), {}), 2, std::uint64_t{64} << 20);
  EXPECT_THROW(simulate_step(two, m), ConfigError);
}

TEST(StepSim, TraceIsChromeJsonWithTheEnginesStreams) {
  SimMachine m = instant_machine();
  m.spec.gpus.bf16_tflops = 0.05;
  m.spec.drives.read_gbps = m.spec.drives.write_gbps = 1;
  const SimResult r = simulate_step(demo_workload(), m);
  const std::string path = ::testing::TempDir() + "/step_sim_trace.json";
  write_sim_trace(r.ops, path);
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::set<std::string> names, threads;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "M") threads.insert(e.at("args").at("name").get<std::string>());
    if (e.at("ph") != "X") continue;
    EXPECT_GE(e.at("dur").get<double>(), 0);
    const std::string name = e.at("name").get<std::string>();
    names.insert(name.substr(0, name.find(' ')));
  }
  for (const char* n : {"forward", "recompute", "backward", "head", "nvme", "h2d", "sum"}) {
    EXPECT_TRUE(names.count(n)) << n;
  }
  for (const char* s : {"compute", "zero.comm", "zero.offload", "nvme"}) EXPECT_TRUE(threads.count(s)) << s;
  std::remove(path.c_str());
}

// Tensor parallelism: the tensor group's collectives of one micro-batch are Megatron's count
// (models::tensor_parallel_traffic, what `strata train` counts at the communicator), each rank's
// compute is its slices', and with only the GPU link finite the step is the link time of those
// collectives plus the data-parallel ones.
TEST(StepSim, TensorParallelCollectivesAreMegatronsCount) {
  // tiny at T = 2; tiny-llama at T = 4, its 2 KV heads each on 2 ranks (Note [Replicated KV heads] in
  // models/tensor_parallel.h: one more all-gather per block backward).
  for (const auto& [name, T] : {std::pair<std::string, int>{"tiny", 2}, {"tiny-llama", 4}}) {
    SCOPED_TRACE(name);
    const std::string model_set = "strata.model=\"" + name + "\"";
    TrainConfig cfg = load_train_config(config_path("tiny.json"), {"gradient_clipping=0", model_set,
                                                                   "strata.parallel.tensor=" + std::to_string(T)});
    const StepWorkload one = make_step_workload(
        load_train_config(config_path("tiny.json"), {"gradient_clipping=0", model_set}), 1, std::uint64_t{64} << 20);
    const StepWorkload w = make_step_workload(cfg, T, std::uint64_t{64} << 20);
    EXPECT_EQ(w.tensor_ranks, T);
    EXPECT_EQ(w.plan.topo.world_size, 1);  // the data ranks
    EXPECT_EQ(w.tokens_per_step, one.tokens_per_step);
    bool checkpointing = false;
    const models::ModelConfig model = train::training_model_config(cfg, &checkpointing);
    const models::TensorParallelTraffic want = models::tensor_parallel_traffic(
        model, models::TensorParallel{T, T - 1, T, nullptr}, cfg.micro_batch_size * cfg.strata.data.seq_len, true,
        checkpointing);
    double reduce_bytes = 0, gather_bytes = 0, flops = 0, flops_one = 0;
    int reduces = 0, gathers = 0;
    for (const SimAction& a : w.micro_batch) {
      if (a.kind == SimAction::Compute) flops += a.flops;
      if (a.kind != SimAction::TensorCollective) continue;
      (a.passes == 2 ? reduce_bytes : gather_bytes) += a.bytes;
      ++(a.passes == 2 ? reduces : gathers);
    }
    for (const SimAction& a : one.micro_batch) flops_one += a.kind == SimAction::Compute ? a.flops : 0;
    EXPECT_EQ(reduces, static_cast<int>(want.all_reduce_calls));
    EXPECT_EQ(gathers, static_cast<int>(want.all_gather_calls));
    EXPECT_EQ(gathers, T == 4 ? 1 + model.n_layers : 1);
    EXPECT_DOUBLE_EQ(reduce_bytes, static_cast<double>(want.all_reduce_bytes));
    EXPECT_DOUBLE_EQ(gather_bytes, static_cast<double>(want.all_gather_bytes));
    if (T == 2) {
      EXPECT_GT(flops, 0.45 * flops_one);  // each rank's slices: about half (norms are not matmuls)
      EXPECT_LT(flops, 0.55 * flops_one);
    }

    SimMachine m = instant_machine();
    m.spec.gpus.count = T;
    m.spec.gpus.link_gbps = 1;  // 1e9 bytes/s: the only finite figure
    const SimResult r = simulate_step(w, m);
    // Every collective of the step goes over the link: the tensor group's on the compute stream
    // (a ring over T ranks moves (T - 1) / T of the buffer per pass) and none of the data axis.
    const double share = (T - 1.0) / T;
    const double tensor_seconds = w.micro_batches * (reduce_bytes * 2 + gather_bytes) * share / 1e9;
    EXPECT_NEAR(queue(r, SimQueue::Collective), tensor_seconds, 1e-12);
    EXPECT_NEAR(r.step_seconds, tensor_seconds, 1e-12);
  }
}

// Sequence parallelism (Note [Sequence parallelism] in models/tensor_parallel.h): the decoder's reduce-scatters and
// all-gathers of the rank's rows pair up into what ring all-reduces move, which the simulator charges; the
// backward's 2 extra all-gathers per block (the norms' outputs again) are charged one pass each.
// The activation bytes are the decoder's (fewer than without it).
TEST(StepSim, SequenceParallelCollectivesPairIntoAllReduces) {
  const int T = 2;
  const std::vector<std::string> sets{"gradient_clipping=0", "strata.parallel.tensor=2"};
  std::vector<std::string> with = sets;
  with.push_back("strata.parallel.sequence=true");
  const TrainConfig cfg = load_train_config(config_path("tiny.json"), with);
  const StepWorkload plain = make_step_workload(load_train_config(config_path("tiny.json"), sets), T,
                                                std::uint64_t{64} << 20);
  const StepWorkload w = make_step_workload(cfg, T, std::uint64_t{64} << 20);
  bool checkpointing = false;
  const models::ModelConfig model = train::training_model_config(cfg, &checkpointing);
  models::TensorParallel tp{T, T - 1, T, nullptr};
  tp.sequence = true;
  const models::TensorParallelTraffic want =
      models::tensor_parallel_traffic(model, tp, cfg.micro_batch_size * cfg.strata.data.seq_len, true, checkpointing);
  double reduce_bytes = 0, gather_bytes = 0;
  int reduces = 0, gathers = 0;
  for (const SimAction& a : w.micro_batch) {
    if (a.kind != SimAction::TensorCollective) continue;
    (a.passes == 2 ? reduce_bytes : gather_bytes) += a.bytes;
    ++(a.passes == 2 ? reduces : gathers);
  }
  const auto L = static_cast<int>(model.n_layers);
  // Every reduce-scatter with an all-gather of the rank's rows: a ring all-reduce of its bytes.
  EXPECT_EQ(reduces, static_cast<int>(want.reduce_scatter_calls + want.all_reduce_calls));
  EXPECT_DOUBLE_EQ(reduce_bytes, static_cast<double>(want.reduce_scatter_bytes + want.all_reduce_bytes));
  // The other all-gathers: the loss's slice sums and the norms' outputs again in backward.
  EXPECT_EQ(static_cast<int>(want.all_gather_calls), static_cast<int>(want.reduce_scatter_calls) + 1 + 2 * L);
  EXPECT_EQ(gathers, 1 + 2 * L);
  const double rows_bytes = static_cast<double>(want.reduce_scatter_bytes) / static_cast<double>(want.reduce_scatter_calls);
  EXPECT_DOUBLE_EQ(gather_bytes - 2 * L * rows_bytes,
                   static_cast<double>(want.all_gather_bytes) -
                       static_cast<double>(want.reduce_scatter_calls + 2 * L) * rows_bytes / T);
  EXPECT_LT(w.activation_bytes, plain.activation_bytes);
}

}  // namespace
}  // namespace strata::sim
