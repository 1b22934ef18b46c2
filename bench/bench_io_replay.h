// `strata bench io --replay CONFIG`: the NVMe traffic of one ZeRO-Infinity step of a training
// config, replayed through the engine's own swap store, chunk pipeline and pinned pools on the
// drive of the config's nvme_path, beside the simulated compute of that step.
//
// Note [Step replay]: nothing of the step's I/O is described a second time here. The run plan
// (plan/run_plan.h) gives the chunks, their tiers, the pinned slots (count and size), the swap
// file's capacity and the I/O engine's options; the jobs' fields (which keys each chunk job reads,
// updates and writes, exact mode's counter levels, the overlapped update) are the engine's own
// (engine/chunk_fields.h); the jobs run through ChunkPipeline, so read-ahead, write-behind and the
// slot bound are the engine's (Note [Chunk pipeline] in engine/offload_tier.h); the swap store cuts, stripes and
// checksums the requests as in training (offload/swap_store.h). The order is the engine's: the gradient
// combines follow the decoder's GradsReady order (the step simulator's workload, from
// models::Decoder), and the parameter fetches are the ones the step simulator's model of the
// ParamFetcher issues in a steady-state step (its prefetch window and keep rule). The fetches run
// on one thread (the trainer's: a group's reads, waited for, per pinned parameter slot) while the
// combines run on another (the offload worker's), as in the engine; the non-overlapped update runs
// after both. What is left out is compute: every job's work is empty, so the replay measures the
// step's I/O alone, the time the drive needs for it with the engine's queueing, and the step
// simulator then places that beside the step's compute (the drive's measured rate as its NVMe
// figure). One rank's traffic is replayed.
#pragma once

#include <string>
#include <vector>

namespace strata::bench::bench_io {

struct ReplayArgs {
  std::string config;  // a config file, or "demo" for the built-in configs/demo.json
  std::vector<std::string> overrides;
  std::string machine = "measure";  // the compute side: a machine file, or this host as the sim device
  int steps = 3;                    // replayed steps measured, after one untimed
  double drive_tbw = 0;             // rated TB written of one drive (0: unknown)
  bool json = false;
};

int run_replay(const ReplayArgs& args);

}  // namespace strata::bench::bench_io
