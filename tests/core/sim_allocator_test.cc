// Tests of the sim device's arena allocator (core/device/sim_allocator.h): best-fit placement,
// split and merge, alignment, statistics (fragmentation, peak, per tag), out-of-memory reports,
// zero-size requests, page release / poisoning of freed memory, and concurrent use.
#include "core/device/sim_allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/units.h"

namespace strata {
namespace {

SimAllocatorOptions options_with(std::size_t capacity_bytes, std::size_t alignment_bytes = 256) {
  SimAllocatorOptions o;
  o.device_name = "sim:7";
  o.capacity_bytes = capacity_bytes;
  o.alignment_bytes = alignment_bytes;
  return o;
}

std::size_t offset_of(const SimAllocator& a, const void* p) {
  return static_cast<std::size_t>(static_cast<const std::byte*>(p) - a.arena_base());
}

void expect_one_free_block(const SimAllocator& a) {
  const MemoryStats s = a.stats();
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.live_allocations, 0u);
  EXPECT_EQ(s.free_bytes, a.capacity_bytes());
  EXPECT_EQ(s.largest_free_block_bytes, a.capacity_bytes());
  EXPECT_EQ(s.fragmentation(), 0.0);
}

TEST(SimAllocator, FirstAllocationsAreContiguousAndAligned) {
  SimAllocator a(options_with(1 * MiB));
  void* p0 = a.allocate(100, "x");
  void* p1 = a.allocate(300, "x");
  void* p2 = a.allocate(256, "x");
  EXPECT_EQ(offset_of(a, p0), 0u);
  EXPECT_EQ(offset_of(a, p1), 256u);  // 100 rounded up to 256
  EXPECT_EQ(offset_of(a, p2), 768u);  // 300 rounded up to 512
  EXPECT_EQ(a.allocation_bytes(p1), 512u);
  EXPECT_EQ(a.stats().allocated_bytes, 256u + 512u + 256u);
  for (void* p : {p0, p1, p2}) a.release(p);
  expect_one_free_block(a);
}

TEST(SimAllocator, BestFitPicksTheSmallestHoleThatFits) {
  SimAllocator a(options_with(1 * MiB));
  // Holes of 4 KiB, 1 KiB and 2 KiB separated by live 256-byte guards, then the big tail.
  void* h4 = a.allocate(4 * KiB, "hole");
  void* g0 = a.allocate(256, "guard");
  void* h1 = a.allocate(1 * KiB, "hole");
  void* g1 = a.allocate(256, "guard");
  void* h2 = a.allocate(2 * KiB, "hole");
  void* g2 = a.allocate(256, "guard");
  const std::size_t off4 = offset_of(a, h4), off1 = offset_of(a, h1), off2 = offset_of(a, h2);
  a.release(h4);
  a.release(h1);
  a.release(h2);

  void* p = a.allocate(900, "t");  // fits all three holes and the tail: 1 KiB is smallest
  EXPECT_EQ(offset_of(a, p), off1);
  void* q = a.allocate(1500, "t");  // 1 KiB hole is taken: 2 KiB is next
  EXPECT_EQ(offset_of(a, q), off2);
  void* r = a.allocate(3 * KiB, "t");  // only the 4 KiB hole (or the tail): the hole, split
  EXPECT_EQ(offset_of(a, r), off4);
  void* s = a.allocate(1 * KiB, "t");  // the 1 KiB remainder of the split 4 KiB hole
  EXPECT_EQ(offset_of(a, s), off4 + 3 * KiB);

  for (void* x : {p, q, r, s, g0, g1, g2}) a.release(x);
  expect_one_free_block(a);
}

TEST(SimAllocator, FreeingInAnyOrderMergesBackIntoOneBlock) {
  SimAllocator a(options_with(64 * KiB));
  const std::array<std::size_t, 5> sizes{256, 1000, 4096, 300, 7 * KiB};
  std::array<int, 5> order{0, 1, 2, 3, 4};
  int permutations = 0;
  do {
    std::array<void*, 5> ptrs{};
    for (std::size_t i = 0; i < sizes.size(); ++i) ptrs[i] = a.allocate(sizes[i], "perm");
    for (int i : order) a.release(ptrs[static_cast<std::size_t>(i)]);
    expect_one_free_block(a);
    // Merged space is usable as one block again: all of it in one allocation.
    void* whole = a.allocate(a.capacity_bytes(), "whole");
    EXPECT_EQ(whole, a.arena_base());
    a.release(whole);
    ++permutations;
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(permutations, 120);
}

TEST(SimAllocator, AlignmentIsHonouredAndAtLeast256) {
  for (std::size_t align : {std::size_t{64}, std::size_t{256}, std::size_t{4096}, std::size_t{64 * KiB}}) {
    SimAllocator a(options_with(4 * MiB, align));
    const std::size_t expected = std::max<std::size_t>(align, 256);
    EXPECT_EQ(a.alignment_bytes(), expected);
    std::vector<void*> ptrs;
    for (std::size_t bytes : {1, 255, 257, 4097, 70000, 3}) {
      void* p = a.allocate(bytes, "align");
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % expected, 0u) << "align " << align << " bytes " << bytes;
      EXPECT_EQ(a.allocation_bytes(p) % expected, 0u);
      EXPECT_GE(a.allocation_bytes(p), bytes);
      ptrs.push_back(p);
    }
    for (void* p : ptrs) a.release(p);
    expect_one_free_block(a);
  }
  EXPECT_THROW(SimAllocator(options_with(1 * MiB, 384)), ConfigError);
  EXPECT_THROW(SimAllocator(options_with(100)), ConfigError);  // below one aligned block
}

TEST(SimAllocator, FragmentationAndPeakStatistics) {
  SimAllocator a(options_with(4 * MiB));
  std::array<void*, 4> blocks{};
  for (auto& b : blocks) b = a.allocate(1 * MiB, "frag");
  MemoryStats s = a.stats();
  EXPECT_EQ(s.allocated_bytes, 4 * MiB);
  EXPECT_EQ(s.peak_allocated_bytes, 4 * MiB);
  EXPECT_EQ(s.free_bytes, 0u);
  EXPECT_EQ(s.largest_free_block_bytes, 0u);
  EXPECT_EQ(s.fragmentation(), 0.0);
  EXPECT_EQ(s.total_allocations, 4u);

  a.release(blocks[0]);
  a.release(blocks[2]);  // two separate 1 MiB holes
  s = a.stats();
  EXPECT_EQ(s.free_bytes, 2 * MiB);
  // The capacity is counted, as on cuda (Note [Sim arena] in core/device/sim_allocator.h): the two
  // holes are one 2 MiB request's worth, placed in the arena's headroom.
  EXPECT_EQ(s.largest_free_block_bytes, 2 * MiB);
  EXPECT_DOUBLE_EQ(s.fragmentation(), 0.0);
  EXPECT_EQ(s.peak_allocated_bytes, 4 * MiB);
  EXPECT_EQ(s.live_allocations, 2u);

  void* big = a.allocate(2 * MiB, "big");
  EXPECT_TRUE(a.contains(big, 2 * MiB));
  EXPECT_EQ(a.allocation_bytes(big), 2 * MiB);
  EXPECT_EQ(a.stats().free_bytes, 0u);
  // Full by count, though the arena has room: one more byte fails and says how much is free.
  try {
    (void)a.allocate(1, "one byte");
    ADD_FAILURE() << "an allocation past the counted capacity succeeded";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("only 0 B of the capacity is free"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.stats().failed_allocations, 1u);
  a.release(big);

  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated_bytes, 2 * MiB);
  a.release(blocks[1]);  // merges holes 0, 1, 2 into 3 MiB
  s = a.stats();
  EXPECT_EQ(s.largest_free_block_bytes, 3 * MiB);
  EXPECT_DOUBLE_EQ(s.fragmentation(), 0.0);
  EXPECT_EQ(s.peak_allocated_bytes, 2 * MiB);
  a.release(blocks[3]);
  expect_one_free_block(a);
}

TEST(SimAllocator, PerTagLiveAndPeakBytes) {
  SimAllocator a(options_with(1 * MiB));
  void* w1 = a.allocate(1000, "param.full");   // 1024
  void* w2 = a.allocate(2048, "param.full");   // 2048
  void* g = a.allocate(100, "grad.shard");     // 256
  MemoryStats s = a.stats();
  EXPECT_EQ(s.bytes_by_tag.at("param.full"), 3072u);
  EXPECT_EQ(s.bytes_by_tag.at("grad.shard"), 256u);
  a.release(w1);
  s = a.stats();
  EXPECT_EQ(s.bytes_by_tag.at("param.full"), 2048u);
  EXPECT_EQ(s.peak_bytes_by_tag.at("param.full"), 3072u);
  a.release(g);
  a.reset_peak();
  s = a.stats();
  EXPECT_EQ(s.peak_bytes_by_tag.at("param.full"), 2048u);
  EXPECT_EQ(s.bytes_by_tag.count("grad.shard"), 0u);  // nothing live: forgotten at reset
  EXPECT_EQ(s.peak_bytes_by_tag.count("grad.shard"), 0u);
  const std::string report = format_memory_report("sim:7", s);
  EXPECT_NE(report.find("param.full"), std::string::npos) << report;
  a.release(w2);
  expect_one_free_block(a);
}

TEST(SimAllocator, OverCapacityFailsWithReportAndStaysUsable) {
  SimAllocator a(options_with(1 * MiB));
  void* live = a.allocate(768 * KiB, "activations");
  try {
    (void)a.allocate(512 * KiB, "param.full");
    FAIL() << "allocation past the cap succeeded";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    const MemoryStats s = a.stats();
    EXPECT_EQ(s.failed_allocations, 1u);
    // The message is the usage report (as of the failure) plus the request.
    EXPECT_EQ(msg.rfind(format_memory_report("sim:7", s), 0), 0u) << msg;
    EXPECT_NE(msg.find("activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'param.full'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("524288 bytes"), std::string::npos) << msg;
  }
  // Larger than the whole arena, and near SIZE_MAX (rounding must not overflow).
  EXPECT_THROW(a.allocate(2 * MiB, "x"), OutOfMemoryError);
  EXPECT_THROW(a.allocate(SIZE_MAX, "x"), OutOfMemoryError);
  EXPECT_THROW(a.allocate(SIZE_MAX - 10, "x"), OutOfMemoryError);
  MemoryStats s = a.stats();
  EXPECT_EQ(s.failed_allocations, 4u);
  EXPECT_EQ(s.live_allocations, 1u);
  EXPECT_EQ(s.allocated_bytes, 768 * KiB);
  void* rest = a.allocate(256 * KiB, "param.full");  // exactly what is left
  EXPECT_EQ(a.stats().free_bytes, 0u);
  a.release(rest);
  a.release(live);
  expect_one_free_block(a);
}

TEST(SimAllocator, ZeroBytesIsRejected) {
  SimAllocator a(options_with(1 * MiB));
  EXPECT_THROW(a.allocate(0, "empty"), DeviceError);
  EXPECT_EQ(a.stats().total_allocations, 0u);
  EXPECT_EQ(a.stats().failed_allocations, 0u);
}

TEST(SimAllocator, UnknownReleaseIsIgnored) {
  SimAllocator a(options_with(1 * MiB));
  void* p = a.allocate(1000, "x");
  int outside = 0;
  a.release(&outside);                       // not in the arena
  a.release(static_cast<std::byte*>(p) + 256);  // inside, but not a block start
  a.release(nullptr);
  EXPECT_EQ(a.stats().live_allocations, 1u);
  a.release(p);
  a.release(p);  // double free: reported, ignored
  expect_one_free_block(a);
}

TEST(SimAllocator, ContainsChecksArenaBounds) {
  SimAllocator a(options_with(1 * MiB));
  std::byte* base = a.arena_base();
  const std::size_t arena = a.arena_bytes();  // the capacity's headroom (Note [Sim arena] in core/device/sim_allocator.h)
  EXPECT_EQ(arena, kSimArenaHeadroom * 1 * MiB);
  EXPECT_TRUE(a.contains(base, arena));
  EXPECT_TRUE(a.contains(base + arena - 1, 1));
  EXPECT_FALSE(a.contains(base + arena - 1, 2));
  EXPECT_FALSE(a.contains(base - 1, 1));
  EXPECT_FALSE(a.contains(base + 10, SIZE_MAX));
  int local = 0;
  EXPECT_FALSE(a.contains(&local, sizeof(local)));
}

// See Note [Sim arena] in core/device/sim_allocator.h.
// The reservation is address space only.
TEST(SimAllocator, LargeCapacityIsReservedLazily) {
  SimAllocator a(options_with(16 * GiB));
  void* p = a.allocate(8 * GiB, "huge");
  const long page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> resident(64);
  ASSERT_EQ(::mincore(p, 64 * static_cast<std::size_t>(page), resident.data()), 0);
  EXPECT_EQ(std::count_if(resident.begin(), resident.end(), [](unsigned char c) { return (c & 1) != 0; }), 0);
  static_cast<unsigned char*>(p)[0] = 1;  // one resident page
  a.release(p);  // neither page release nor poisoning may touch the untouched pages
  auto* last = static_cast<unsigned char*>(p) + 8 * GiB - 64 * static_cast<std::size_t>(page);
  ASSERT_EQ(::mincore(last, 64 * static_cast<std::size_t>(page), resident.data()), 0);
  EXPECT_EQ(std::count_if(resident.begin(), resident.end(), [](unsigned char c) { return (c & 1) != 0; }), 0);
}

// See Note [Freed pages] in core/device/sim_allocator.h.
// Release builds hand freed pages back; Debug builds poison them.
TEST(SimAllocator, FreedLargeBlocksAreReleasedOrPoisoned) {
  SimAllocator a(options_with(16 * MiB));
  const std::size_t bytes = 4 * MiB;
  auto* p = static_cast<unsigned char*>(a.allocate(bytes, "big"));
  std::memset(p, 0x5A, bytes);
  a.release(p);
#if defined(STRATA_DEBUG_POISON)
  for (std::size_t i = 0; i < bytes; i += 4099) ASSERT_EQ(p[i], kSimPoisonByte) << "offset " << i;
#else
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident(bytes / page);
  ASSERT_EQ(::mincore(p, bytes, resident.data()), 0);
  EXPECT_EQ(std::count_if(resident.begin(), resident.end(), [](unsigned char c) { return (c & 1) != 0; }), 0);
  EXPECT_EQ(p[12345], 0);  // MADV_DONTNEED on private anonymous memory reads back as zeros
#endif
}

TEST(SimAllocator, ConcurrentAllocationsNeverOverlap) {
  SimAllocator a(options_with(8 * MiB));
  constexpr int kThreads = 4;
  constexpr int kIterations = 2000;
  std::vector<std::thread> threads;
  std::atomic<int> corrupted{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t + 1));
      std::vector<std::pair<unsigned char*, std::size_t>> live;
      const auto mark = static_cast<unsigned char>(t + 1);
      for (int i = 0; i < kIterations; ++i) {
        if (live.size() < 8 && (rng() % 3 != 0 || live.empty())) {
          const std::size_t bytes = 1 + rng() % (64 * KiB);
          auto* p = static_cast<unsigned char*>(a.allocate(bytes, t % 2 == 0 ? "even" : "odd"));
          std::memset(p, mark, bytes);
          live.emplace_back(p, bytes);
        } else {
          const std::size_t k = rng() % live.size();
          auto [p, bytes] = live[k];
          if (p[0] != mark || p[bytes / 2] != mark || p[bytes - 1] != mark) corrupted.fetch_add(1);
          a.release(p);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
      for (auto [p, bytes] : live) a.release(p);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(corrupted.load(), 0);
  expect_one_free_block(a);
  EXPECT_EQ(a.stats().failed_allocations, 0u);
}

}  // namespace
}  // namespace strata
