// The arithmetic of `strata bench io` without a disk: latency percentiles from the log-bucket
// histogram against the exact ones, slat and clat adding up to lat, the steady-state test on series with known answers, and the
// block headers of --verify (Note [Bench verify] in bench/bench_io_verify.h) against each kind of
// damage, including a torn write the header alone would not show; --jobs' slices of a group and
// the buffer memory --vs-fio gives each side when told (Note [Bench equal memory] in bench/bench_io_runs.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_io_runs.h"
#include "bench/bench_io_stats.h"
#include "bench/bench_io_verify.h"
#include "bench/bench_io_workload.h"

namespace strata::bench::bench_io {
namespace {

TEST(BenchIoStats, PercentilesWithinThreePercentOfExact) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(11.0, 1.0);  // ~60 us median, a long tail
  std::vector<std::uint64_t> ns(200000);
  LatencyHistogram h;
  for (auto& v : ns) {
    v = static_cast<std::uint64_t>(dist(rng));
    h.record(v);
  }
  std::sort(ns.begin(), ns.end());
  for (double p : {50.0, 90.0, 99.0, 99.9, 99.99}) {
    const auto rank = static_cast<std::size_t>(std::ceil(p / 100 * static_cast<double>(ns.size()))) - 1;
    const double exact_us = static_cast<double>(ns[rank]) / 1e3;
    EXPECT_NEAR(h.percentile_us(p), exact_us, 0.032 * exact_us) << "p" << p;
  }
  EXPECT_DOUBLE_EQ(h.max_us(), static_cast<double>(ns.back()) / 1e3);
  EXPECT_EQ(h.count(), ns.size());
}

TEST(BenchIoStats, SmallValuesAreExactAndMergeAdds) {
  LatencyHistogram a, b;
  for (std::uint64_t v = 1; v <= 10; ++v) a.record(v * 1000);
  b.record(5);
  a.merge(b);
  EXPECT_EQ(a.count(), 11u);
  EXPECT_DOUBLE_EQ(a.percentile_us(0.001), 0.005);  // values under 32 ns have a bucket each
  EXPECT_DOUBLE_EQ(a.max_us(), 10.0);
  EXPECT_DOUBLE_EQ(LatencyHistogram().percentile_us(99), 0.0);
}

// slat + clat = lat for every request, so each part's percentiles sit at or under lat's, the
// whole's max under the parts' maxima added, and the means add up exactly.
TEST(BenchIoStats, SubmitAndCompletionLatencyAddUpToTheWhole) {
  std::mt19937_64 rng(11);
  std::lognormal_distribution<double> slat(8.0, 1.5), clat(11.0, 0.8);
  OpStats s;
  for (int i = 0; i < 50000; ++i) {
    s.record(4096, RequestLatency{static_cast<std::uint64_t>(slat(rng)), static_cast<std::uint64_t>(clat(rng))});
  }
  const nlohmann::json j = s.json(1.0);
  for (const char* part : {"slat", "clat"}) {
    for (const char* key : {"p50_us", "p90_us", "p99_us", "p99_9_us", "p99_99_us", "max_us", "mean_us"}) {
      ASSERT_TRUE(j.at(part).contains(key)) << part << " " << key;
      EXPECT_LE(j.at(part).at(key).get<double>(), j.at(key).get<double>()) << part << " " << key;
    }
  }
  EXPECT_LE(j.at("max_us").get<double>(), j.at("slat").at("max_us").get<double>() + j.at("clat").at("max_us").get<double>());
  EXPECT_NEAR(j.at("mean_us").get<double>(),
              j.at("slat").at("mean_us").get<double>() + j.at("clat").at("mean_us").get<double>(), 1e-9);
  OpStats merged = s;
  merged.merge(s);
  EXPECT_DOUBLE_EQ(merged.json(1.0).at("clat").at("mean_us").get<double>(), j.at("clat").at("mean_us").get<double>());
  EXPECT_EQ(merged.completion_latency.count(), 100000u);
}

TEST(BenchIoStats, SteadyStateNeedsRangeAndDriftWithinBound) {
  SteadyState flat(0.05, 5);
  bool steady = false;
  for (double v : {3.0, 1.0, 2.0, 2.01, 1.99, 2.0, 2.02}) steady = flat.add(v);
  EXPECT_TRUE(steady);  // the last five are within 5 %
  SteadyState rising(0.05, 5);
  for (int i = 0; i < 20; ++i) steady = rising.add(2.0 + 0.02 * i);  // 1 % per interval: range 4 %, drift 4 %
  EXPECT_TRUE(steady);
  SteadyState climbing(0.05, 5);
  for (int i = 0; i < 20; ++i) steady = climbing.add(2.0 + 0.05 * i);  // drift ~10 % over the window
  EXPECT_FALSE(steady);
  EXPECT_GT(climbing.drift_fraction(), 0.05);
  SteadyState noisy(0.05, 5);
  for (int i = 0; i < 20; ++i) steady = noisy.add(i % 2 == 0 ? 1.8 : 2.2);  // no drift, range 20 %
  EXPECT_FALSE(steady);
  EXPECT_LT(noisy.drift_fraction(), 0.05);
}

class BenchIoVerify : public ::testing::Test {
 protected:
  static constexpr std::size_t kBlock = 16384;
  static constexpr std::uint64_t kSeed = 42;
  std::vector<std::byte> block_ = std::vector<std::byte>(kBlock, std::byte{0x5C});

  // The VerifyError's message for checking block_ as generation `gen` at `offset`; "" when good.
  std::string check(std::uint64_t offset, std::uint64_t gen, std::uint64_t seed = kSeed) {
    try {
      check_block(block_, offset, gen, seed, "/d/f");
    } catch (const VerifyError& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(BenchIoVerify, AStampedBlockPasses) {
  stamp_block(block_, 3 * kBlock, 2, kSeed);
  EXPECT_EQ(check(3 * kBlock, 2), "");
}

TEST_F(BenchIoVerify, AFlippedByteIsAChecksumMismatchNamingTheOffset) {
  stamp_block(block_, 3 * kBlock, 2, kSeed);
  block_[kBlock - 1] ^= std::byte{1};
  const std::string m = check(3 * kBlock, 2);
  EXPECT_NE(m.find("block at offset 49152 of /d/f"), std::string::npos) << m;
  EXPECT_NE(m.find("flipped or torn"), std::string::npos) << m;
}

TEST_F(BenchIoVerify, ATornWriteIsCaughtByTheSectorTags) {
  // Generation 2's header over sectors that still hold generation 1: same payload bytes but the
  // sector tags differ, so the checksum does.
  std::vector<std::byte> old(kBlock, std::byte{0x5C});
  stamp_block(old, 0, 1, kSeed);
  stamp_block(block_, 0, 2, kSeed);
  std::memcpy(block_.data() + 4096, old.data() + 4096, kBlock - 4096);
  EXPECT_NE(check(0, 2).find("flipped or torn"), std::string::npos);
}

TEST_F(BenchIoVerify, StaleMisdirectedForeignAndUnwrittenBlocksAreToldApart) {
  stamp_block(block_, 5 * kBlock, 1, kSeed);
  EXPECT_NE(check(5 * kBlock, 2).find("stale block: generation 1 where 2 was written"), std::string::npos);
  stamp_block(block_, 8 * kBlock, 2, kSeed);
  EXPECT_NE(check(7 * kBlock, 2).find("misdirected write: the block written for offset 131072"), std::string::npos);
  EXPECT_NE(check(8 * kBlock, 2, kSeed + 1).find("another run"), std::string::npos);
  std::fill(block_.begin(), block_.end(), std::byte{0});
  const std::string m = check(0, 1);
  EXPECT_NE(m.find("no block header"), std::string::npos);
  EXPECT_NE(m.find("expected {offset 0, generation 1, seed 0x2a}"), std::string::npos) << m;
}

TEST(BenchIoJobs, SharesCoverTheGroupOnceInContiguousSlices) {
  for (const std::uint64_t blocks : {1ull, 7ull, 64ull, 1001ull}) {
    for (const unsigned shares : {1u, 2u, 3u, 8u}) {
      const Group g{70, Pattern::Random, 4, 10, blocks};
      std::uint64_t next = g.first_block;
      for (unsigned j = 0; j < shares; ++j) {
        const Group s = job_share(g, j, shares);
        EXPECT_EQ(s.first_block, next) << blocks << " blocks, share " << j << " of " << shares;
        EXPECT_EQ(s.qd, g.qd);
        EXPECT_EQ(s.read_percent, g.read_percent);
        EXPECT_LE(s.blocks, blocks / shares + 1);
        next += s.blocks;
      }
      EXPECT_EQ(next, g.first_block + blocks) << blocks << " blocks in " << shares << " shares";
    }
  }
}

TEST(BenchIoJobs, BufferHoldsOneSlotPerRequestOfEveryJob) {
  WorkloadSpec spec;
  spec.groups = {Group{100, Pattern::Sequential, 4, 0, 10}, Group{0, Pattern::Sequential, 2, 10, 10}};
  spec.bs_bytes = 4096;
  EXPECT_EQ(workload_buffer_bytes(spec, 1), 6u * 4096);
  EXPECT_EQ(workload_buffer_bytes(spec, 2 * 3), 36u * 4096);  // 2 paths x 3 jobs
}

TEST(BenchIoFioMemory, AGivenKindIsFiosAndSaysWhetherThePagesMatch) {
  const FioMemory malloc_huge = choose_fio_memory("malloc", true, 0);
  EXPECT_EQ(malloc_huge.fio_mem, "malloc");
  EXPECT_TRUE(malloc_huge.strata_huge);
  EXPECT_FALSE(malloc_huge.equal);
  const FioMemory shm_huge = choose_fio_memory("shmhuge", true, 0);
  EXPECT_TRUE(shm_huge.equal);
  const FioMemory malloc_small = choose_fio_memory("malloc", false, 0);
  EXPECT_TRUE(malloc_small.equal);
  // "same" on 4 KiB pages needs no huge pages from anyone.
  const FioMemory same_small = choose_fio_memory("same", false, std::size_t{1} << 40);
  EXPECT_EQ(same_small.fio_mem, "malloc");
  EXPECT_TRUE(same_small.equal);
  // "same" on huge pages with more hugetlb memory asked than any machine has: both on 4 KiB pages.
  const FioMemory same_huge = choose_fio_memory("same", true, std::size_t{1} << 60);
  EXPECT_EQ(same_huge.fio_mem, "malloc");
  EXPECT_FALSE(same_huge.strata_huge);
  EXPECT_TRUE(same_huge.equal);
  EXPECT_NE(same_huge.note.find("nr_hugepages"), std::string::npos) << same_huge.note;
}

}  // namespace
}  // namespace strata::bench::bench_io
