// Creating the io_uring engine's ring (offload/uring_engine.cc): the ring flags requested
// best-first and dropped one by one where the kernel refuses them, SQPOLL and IOPOLL as the
// options ask, the sparse fixed-file table; and pinning the engine thread. Internal to offload/.
#pragma once

#include <string>

#include "offload/io_engine.h"

struct io_uring;

namespace strata::offload::detail {

// What the kernel took: the flags for IoEngineInfo::features ("SUBMIT_ALL|COOP_TASKRUN|..."),
// whether SQPOLL survived (it is dropped with a warning where refused) and whether the ring has
// `sparse_files` registered-file slots.
struct RingSetup {
  std::string flags_text;
  SqPoll sqpoll = SqPoll::Off;
  bool fixed_files = false;
};

// Initialises `ring` with `entries` SQ entries for `options`; throws IoError saying why io_uring
// cannot be used (disabled by sysctl, refused by the kernel or a seccomp filter).
RingSetup setup_uring(io_uring& ring, const IoEngineOptions& options, unsigned entries, unsigned sparse_files);

// Pins the calling thread to `cpu`; -1 leaves it where the scheduler puts it. Throws IoError.
void pin_engine_thread(int cpu);

}  // namespace strata::offload::detail
