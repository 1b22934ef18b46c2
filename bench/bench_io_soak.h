// `strata bench io --soak DURATION`: the swap store (offload/swap_store.h) under a ZeRO-Infinity
// optimizer step's traffic for as long as asked, every byte read back checked, with optional fault
// injection (offload/fault.h) to show what a failing drive looks like.
//
// Note [Bench soak]
// The working set (--size) is cut into optimizer chunks of --soak-chunk bytes of fp32 state (master,
// m and v: 12 bytes a parameter), and each chunk is three named tensors in one swap store on the
// --dir/--paths drives: "chunk<i>.state", "chunk<i>.grad" (fp32, 4 bytes a parameter) and
// "chunk<i>.param" (bf16 working weights, 2 bytes), every fourth chunk a group's shorter tail whose
// tensors are not a multiple of 4 KiB (the padded extent). The chunks are visited in order, step after
// step, as the engine's chunk pipeline visits them (Note [Chunk pipeline] in engine/offload_tier.h):
// a visit's three tensors are read two visits ahead, and its new generation written behind while the
// next visits' reads run, at most two visits' writes in flight, so reads and writes are on the drive
// at once, as fast as it takes them (the rate of a step bound by NVMe). Every read is checked twice:
// the swap store's XXH3 of every extent (Verify::On, what training relies on), and the contents
// against the generation the soak wrote (a value of the right shape but from another tensor or an
// older generation). A mismatch, a checksum failure or an I/O error ends the run naming the tensor,
// the extent and the file offset; a fault the engine retries (EAGAIN, EINTR, a short transfer) is
// counted and the run goes on.
#pragma once

#include <string>

#include "bench/bench_io_plan.h"

namespace strata::bench::bench_io {

struct SoakArgs {
  std::string duration;       // --soak: how long (30s, 10m, 1h)
  std::string chunk = "16M";  // --soak-chunk: one chunk's fp32 optimizer state
  std::string faults;         // --soak-fault: KIND:OP:N[,...] (eio, enospc, eagain, eintr, short, corrupt)
};

// Runs the soak with the drives, --size, --engine, --qd, --interval, --interval-log, --seed and
// --json of `a`; prints intervals and a summary. Throws (exit 1) on the first mismatch or I/O error.
int run_soak(const SoakArgs& soak, const BenchIoArgs& a);

}  // namespace strata::bench::bench_io
