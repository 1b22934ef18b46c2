// Happens-before edges ThreadSanitizer cannot see by itself. Debian's libtbb is not built with
// TSan, so the hand-over of a tbb::parallel_for body to a worker thread and the join after it are
// invisible to it: the caller's writes before the loop and reads after it then look like races
// with the body's accesses (seen in CI: a memcmp after convert_parallel against a worker's store,
// reported with the worker's stack lost, so no suppression could match it). Code around such a
// loop releases a token where it hands data on and acquires it where it takes data up, with one
// token for the hand-over and another for the join, so the bodies stay unordered among themselves
// (a race between two bodies is still reported):
//
//   int start = 0, done = 0;
//   tsan_release(&start);                        // the caller's writes happen before the bodies
//   tbb::parallel_for(range, [&](auto r) {
//     tsan_acquire(&start); ... ; tsan_release(&done);
//   });
//   tsan_acquire(&done);                         // every body happens before what follows
//
// Releases join (they do not overwrite), so every body's release reaches the final acquire.
// Without TSan both calls are nothing.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define STRATA_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STRATA_TSAN 1
#endif
#endif

#ifdef STRATA_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace strata {

inline void tsan_acquire([[maybe_unused]] void* token) {
#ifdef STRATA_TSAN
  __tsan_acquire(token);
#endif
}

inline void tsan_release([[maybe_unused]] void* token) {
#ifdef STRATA_TSAN
  __tsan_release(token);
#endif
}

}  // namespace strata
