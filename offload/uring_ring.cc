// Creating the io_uring engine's ring (see offload/uring_ring.h).
#include "offload/uring_ring.h"

#include <liburing.h>
#include <pthread.h>
#include <sched.h>

#include <cerrno>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "offload/io_engine_impl.h"

namespace strata::offload::detail {
namespace {

struct FlagName {
  unsigned flag;
  const char* name;
};
// Requested best-first; on -EINVAL the last remaining one is dropped and the setup retried.
constexpr FlagName kRingFlags[] = {
    {IORING_SETUP_SUBMIT_ALL, "SUBMIT_ALL"},
    {IORING_SETUP_COOP_TASKRUN, "COOP_TASKRUN"},
    {IORING_SETUP_SINGLE_ISSUER, "SINGLE_ISSUER"},
    {IORING_SETUP_DEFER_TASKRUN, "DEFER_TASKRUN"},
};

std::string flags_text(const std::vector<FlagName>& flags, SqPoll sqpoll, IoPoll iopoll) {
  std::string text;
  for (const FlagName& f : flags) text += (text.empty() ? "" : "|") + std::string(f.name);
  if (sqpoll == SqPoll::On) text += text.empty() ? "SQPOLL" : "|SQPOLL";
  if (iopoll == IoPoll::On) text += text.empty() ? "IOPOLL" : "|IOPOLL";
  return text.empty() ? "no-flags" : text;
}

}  // namespace

RingSetup setup_uring(io_uring& ring, const IoEngineOptions& options, unsigned entries, unsigned sparse_files) {
  if (io_uring_disabled_setting() == 2) {
    throw IoError("io_uring is disabled on this machine (/proc/sys/kernel/io_uring_disabled = 2)", EPERM);
  }
  SqPoll sqpoll = options.sqpoll;
  std::vector<FlagName> flags;
  for (const FlagName& f : kRingFlags) {
    if (sqpoll == SqPoll::On && f.flag == IORING_SETUP_DEFER_TASKRUN) continue;
    flags.push_back(f);
  }
  for (;;) {
    io_uring_params p{};
    for (const FlagName& f : flags) p.flags |= f.flag;
    if (options.iopoll == IoPoll::On) p.flags |= IORING_SETUP_IOPOLL;
    if (sqpoll == SqPoll::On) {
      p.flags |= IORING_SETUP_SQPOLL;
      p.sq_thread_idle = 50;  // ms before the kernel poller sleeps
    }
    int r = io_uring_queue_init_params(entries, &ring, &p);
    if (r == 0) break;
    if (r == -EINVAL && !flags.empty()) {
      spdlog::debug("io_uring: setup flag {} refused; retrying without it", flags.back().name);
      flags.pop_back();
      continue;
    }
    if (r == -EINVAL && sqpoll == SqPoll::On) {
      spdlog::warn("io_uring: SQPOLL refused; continuing without it");
      sqpoll = SqPoll::Off;
      continue;
    }
    throw IoError(fmt::format("io_uring_queue_init({} entries) failed: {}{}", entries, errno_text(-r),
                              r == -EPERM || r == -ENOSYS ? " (io_uring refused by the kernel or a seccomp filter)" : ""),
                  -r);
  }
  RingSetup setup{flags_text(flags, sqpoll, options.iopoll), sqpoll, false};
  const int r = io_uring_register_files_sparse(&ring, sparse_files);
  setup.fixed_files = r >= 0;
  if (r < 0) spdlog::debug("io_uring: no registered files ({})", errno_text(-r));
  return setup;
}

void pin_engine_thread(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (const int r = pthread_setaffinity_np(pthread_self(), sizeof set, &set); r != 0) {
    throw IoError(fmt::format("pinning the io_uring engine thread to CPU {} failed: {}", cpu, errno_text(r)), r);
  }
}

}  // namespace strata::offload::detail
