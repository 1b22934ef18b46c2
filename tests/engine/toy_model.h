// A toy model for the engine tests, written against ParamProvider exactly as the real decoders
// are: a tied embedding E [V, D] used at the input and the output, L residual blocks
// x <- x + tanh(W x + b), and a squared-error loss on the tied output logits E x. Its forward and
// backward run as sim kernels on the compute stream, and it exercises what matters to the
// engine: many groups, a group acquired twice per pass (tied weights, gradients accumulated from two
// places), forward then reverse order. Unit u of step s reads tokens derived from (s, u) only, so
// any split of units over ranks and micro-batches sees the same data (Note [Exact gradient sums] in
// engine/zero_engine.h).
#pragma once

#include <cmath>
#include <cstring>
#include <string>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/device/device.h"
#include "core/device/sim_kernel.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "plan/param_provider.h"
#include "engine/zero_engine.h"

namespace strata::testing_toy {

struct ToyShape {
  int vocab = 16;
  int dim = 24;
  int layers = 3;
  int tokens = 6;  // per unit
};

// With `declare_ready` the groups declare their grads_ready calls per backward (the tied embedding
// gets two), so the engine reduces each group as soon as it is final from the first micro-batch on.
inline std::vector<ParamGroupSpec> toy_groups(const ToyShape& s, DType dtype, bool declare_ready = false) {
  std::vector<ParamGroupSpec> groups;
  groups.push_back({"embed", {{"embed.weight", {s.vocab, s.dim}, dtype}}, declare_ready ? 2 : 0});
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "blocks." + std::to_string(l);
    groups.push_back({p, {{p + ".w", {s.dim, s.dim}, dtype}, {p + ".b", {s.dim}, dtype}}, declare_ready ? 1 : 0});
  }
  return groups;
}

// The engine config the toy tests train with: exact mode, clipping on (so the global norm matters).
inline TrainConfig toy_train_config(int stage, int accumulation) {
  TrainConfig c = parse_train_config(nlohmann::json::object(), "test");
  c.strata.exact = true;
  c.zero.stage = stage;
  c.gradient_accumulation_steps = accumulation;
  c.gradient_clipping = 0.5;
  c.optimizer.lr = 2e-2;
  c.optimizer.weight_decay = 0.01;
  return c;
}

// Deterministic init: the same on every rank.
inline void toy_init(std::size_t group, std::size_t tensor, std::span<float> out) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull * (group * 7 + tensor + 1);
  for (auto& v : out) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 29;
    v = (static_cast<float>(h % 2001) / 1000.0f - 1.0f) * (tensor == 1 ? 0.05f : 0.3f);
  }
}

inline int toy_token(std::int64_t step, std::int64_t unit, int t, int vocab) {
  std::uint64_t h = static_cast<std::uint64_t>(step * 1000003 + unit * 7919 + t * 104729 + 17);
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  return static_cast<int>(h % static_cast<std::uint64_t>(vocab));
}

// The activations of one unit, shared by the sim kernels its passes launch on the stream.
struct ToyActs {
  std::vector<std::vector<float>> x;  // [T][(L+1)*D]
  std::vector<std::vector<float>> a;  // tanh outputs [T][L*D]
  std::vector<std::vector<float>> dx;  // [T][D]
  float loss = 0;
};

// Forward: the embedding lookup of tokens 0..T-1, then the blocks in order.
inline void toy_forward(ParamProvider& provider, Stream& stream, const ToyShape& s,
                        const std::shared_ptr<ToyActs>& acts, const std::vector<int>& tok) {
  const int D = s.dim, L = s.layers, T = s.tokens;
  auto E = provider.acquire_params(0, ParamPhase::Forward, &stream);
  launch_sim_kernel(stream, [acts, tok, E = static_cast<const float*>(E[0]), T, D, L] {
    for (int t = 0; t < T; ++t) {
      for (int d = 0; d < D; ++d) acts->x[t][d] = E[tok[static_cast<std::size_t>(t)] * D + d];
    }
    (void)L;
  });
  provider.release_params(0, &stream);
  for (int l = 0; l < L; ++l) {
    auto P = provider.acquire_params(static_cast<std::size_t>(1 + l), ParamPhase::Forward, &stream);
    launch_sim_kernel(stream, [acts, W = static_cast<const float*>(P[0]), b = static_cast<const float*>(P[1]), T, D, l] {
      for (int t = 0; t < T; ++t) {
        const float* x = &acts->x[t][static_cast<std::size_t>(l * D)];
        float* xn = &acts->x[t][static_cast<std::size_t>((l + 1) * D)];
        for (int i = 0; i < D; ++i) {
          float h = b[i];
          for (int j = 0; j < D; ++j) h += W[i * D + j] * x[j];
          const float a = std::tanh(h);
          acts->a[t][static_cast<std::size_t>(l * D + i)] = a;
          xn[i] = x[i] + a;
        }
      }
    });
    provider.release_params(static_cast<std::size_t>(1 + l), &stream);
  }
}

// Output through the tied embedding, loss (next tokens 1..T are the targets) and its gradient,
// backward of the output use.
inline void toy_output_and_loss(ParamProvider& provider, Stream& stream, const ToyShape& s,
                                const std::shared_ptr<ToyActs>& acts, const std::vector<int>& tok) {
  const int V = s.vocab, D = s.dim, L = s.layers, T = s.tokens;
  auto E2 = provider.acquire_params(0, ParamPhase::Forward, &stream);
  auto dE = provider.acquire_grads(0, &stream);
  launch_sim_kernel(stream, [acts, tok, E = static_cast<const float*>(E2[0]), dEp = static_cast<float*>(dE[0]), T, D, V, L] {
    float loss = 0;
    for (int t = 0; t < T; ++t) {
      const float* x = &acts->x[t][static_cast<std::size_t>(L * D)];
      for (int v = 0; v < V; ++v) {
        float y = 0;
        for (int d = 0; d < D; ++d) y += E[v * D + d] * x[d];
        const float target = v == tok[static_cast<std::size_t>(t + 1)] ? 1.0f : 0.0f;
        const float dy = (y - target) / static_cast<float>(T);
        loss += 0.5f * (y - target) * (y - target) / static_cast<float>(T);
        for (int d = 0; d < D; ++d) {
          dEp[v * D + d] += dy * x[d];
          acts->dx[t][d] += E[v * D + d] * dy;
        }
      }
    }
    acts->loss = loss;
  });
  provider.grads_ready(0, &stream);
  provider.release_params(0, &stream);
}

// Backward through the blocks, in reverse, then of the input embedding use: the embedding's
// gradients acquired a second time.
inline void toy_backward(ParamProvider& provider, Stream& stream, const ToyShape& s,
                         const std::shared_ptr<ToyActs>& acts, const std::vector<int>& tok) {
  const int D = s.dim, L = s.layers, T = s.tokens;
  for (int l = L - 1; l >= 0; --l) {
    auto P = provider.acquire_params(static_cast<std::size_t>(1 + l), ParamPhase::Backward, &stream);
    auto G = provider.acquire_grads(static_cast<std::size_t>(1 + l), &stream);
    launch_sim_kernel(stream, [acts, W = static_cast<const float*>(P[0]), dW = static_cast<float*>(G[0]),
                        db = static_cast<float*>(G[1]), T, D, l] {
      for (int t = 0; t < T; ++t) {
        const float* x = &acts->x[t][static_cast<std::size_t>(l * D)];
        std::vector<float> dh(static_cast<std::size_t>(D));
        for (int i = 0; i < D; ++i) {
          const float a = acts->a[t][static_cast<std::size_t>(l * D + i)];
          dh[static_cast<std::size_t>(i)] = acts->dx[t][i] * (1.0f - a * a);
        }
        std::vector<float> dxn(acts->dx[t]);
        for (int i = 0; i < D; ++i) {
          db[i] += dh[static_cast<std::size_t>(i)];
          for (int j = 0; j < D; ++j) {
            dW[i * D + j] += dh[static_cast<std::size_t>(i)] * x[j];
            dxn[static_cast<std::size_t>(j)] += W[i * D + j] * dh[static_cast<std::size_t>(i)];
          }
        }
        acts->dx[t] = dxn;
      }
    });
    provider.grads_ready(static_cast<std::size_t>(1 + l), &stream);
    provider.release_params(static_cast<std::size_t>(1 + l), &stream);
  }
  auto dE2 = provider.acquire_grads(0, &stream);
  launch_sim_kernel(stream, [acts, tok, dEp = static_cast<float*>(dE2[0]), T, D] {
    for (int t = 0; t < T; ++t) {
      for (int d = 0; d < D; ++d) dEp[tok[static_cast<std::size_t>(t)] * D + d] += acts->dx[t][d];
    }
  });
  provider.grads_ready(0, &stream);
}

// Runs forward and backward of one unit through `provider` on `stream`; returns the loss (after
// synchronizing the stream). Weights and gradients are fp32 here (exact mode).
inline float toy_forward_backward(ParamProvider& provider, Stream& stream, const ToyShape& s, std::int64_t step,
                                  std::int64_t unit) {
  const int V = s.vocab, D = s.dim, L = s.layers, T = s.tokens;
  auto acts = std::make_shared<ToyActs>();
  acts->x.assign(static_cast<std::size_t>(T), std::vector<float>(static_cast<std::size_t>((L + 1) * D)));
  acts->a.assign(static_cast<std::size_t>(T), std::vector<float>(static_cast<std::size_t>(L * D)));
  acts->dx.assign(static_cast<std::size_t>(T), std::vector<float>(static_cast<std::size_t>(D)));
  std::vector<int> tok(static_cast<std::size_t>(T + 1));
  for (int t = 0; t <= T; ++t) tok[static_cast<std::size_t>(t)] = toy_token(step, unit, t, V);
  toy_forward(provider, stream, s, acts, tok);
  toy_output_and_loss(provider, stream, s, acts, tok);
  toy_backward(provider, stream, s, acts, tok);
  stream.synchronize();
  return acts->loss;
}

// What a toy training run leaves behind.
struct ToyRun {
  std::vector<std::vector<float>> weights;  // every tensor's fp32 master, gathered
  std::vector<float> losses;                // per step, mean over this rank's micro-batches
  std::uint64_t gathers = 0;
  std::uint64_t prefetched = 0;
  std::size_t state_bytes = 0;  // device bytes of model state after the last step
  TierIoStats tiers;
  std::uint64_t chunk_updates = 0;
  std::uint64_t overlapped_updates = 0;
  std::size_t pinned_pool_bytes = 0;
  int skipped_steps = 0;
};

struct ToyRunOptions {
  int steps = 6;
  ToyShape shape;
  bool prepare_step = false;  // announce each step's lr first (lets an offloaded update overlap)
  bool declare_ready = false;  // groups declare their grads_ready calls (see toy_groups)
  std::function<void()> before_gather;  // if set: called after the last step, before the gathers
};

// Trains the toy model for `o.steps` steps on `comm`; this rank runs units a * world + rank.
inline ToyRun run_toy_engine(const TrainConfig& config, Device& device, Communicator& comm, const ToyRunOptions& o) {
  auto groups = toy_groups(o.shape, DType::F32, o.declare_ready);
  ToyRun r;
  ZeroEngine engine(config, device, comm, groups, toy_init);
  auto stream = device.create_stream("compute");
  for (int s = 0; s < o.steps; ++s) {
    if (o.prepare_step) engine.prepare_step(config.optimizer.lr);
    float loss = 0;
    for (int a = 0; a < config.gradient_accumulation_steps; ++a) {
      engine.begin_micro_batch();
      loss += toy_forward_backward(engine, *stream, o.shape, s, static_cast<std::int64_t>(a) * comm.world_size() + comm.rank());
      engine.end_micro_batch();
    }
    if (!engine.step(config.optimizer.lr).applied) ++r.skipped_steps;
    r.losses.push_back(loss / static_cast<float>(config.gradient_accumulation_steps));
  }
  stream->synchronize();  // the step's releases on the compute stream have run
  r.state_bytes = engine.model_state_device_bytes();
  if (o.before_gather) o.before_gather();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (std::size_t t = 0; t < groups[g].tensors.size(); ++t) r.weights.push_back(engine.gather_master(g, t));
  }
  r.gathers = engine.gathers();
  r.prefetched = engine.prefetched_gathers();
  r.tiers = engine.tier_stats();
  r.chunk_updates = engine.chunk_updates();
  r.overlapped_updates = engine.overlapped_chunk_updates();
  r.pinned_pool_bytes = engine.pinned_pool_bytes();
  stream->synchronize();
  return r;
}

// run_toy_engine in one process: a 64 MiB sim device and the local communicator.
inline ToyRun run_toy_local(const TrainConfig& config, const ToyRunOptions& o) {
  SimDeviceOptions d;
  d.capacity_bytes = 64 << 20;
  auto device = make_sim_device(d);
  auto comm = make_local_communicator();
  return run_toy_engine(config, *device, *comm, o);
}

// Weights that differ bit-wise between two runs (a different shape counts as one).
inline std::size_t count_weight_differences(const ToyRun& a, const ToyRun& b) {
  std::size_t bad = 0;
  if (a.weights.size() != b.weights.size()) return 1;
  for (std::size_t i = 0; i < a.weights.size(); ++i) {
    if (a.weights[i].size() != b.weights[i].size()) return 1;
    for (std::size_t k = 0; k < a.weights[i].size(); ++k) {
      bad += std::memcmp(&a.weights[i][k], &b.weights[i][k], sizeof(float)) != 0;
    }
  }
  return bad;
}

// Offloads the optimizer state (and the stage-3 parameters) of `c`; NVMe state goes to `dir`.
inline void toy_offload(TrainConfig& c, OffloadDevice optimizer, OffloadDevice params, const std::string& dir) {
  c.zero.offload_optimizer.device = optimizer;
  c.zero.offload_param.device = params;
  c.zero.offload_optimizer.nvme_paths = {dir};
  c.zero.offload_param.nvme_paths = {dir};
  c.strata.offload.pinned_buffer_bytes = 4u << 20;  // small slots: several chunks per group
  c.zero.offload_optimizer.buffer_count = 4;
}

}  // namespace strata::testing_toy
