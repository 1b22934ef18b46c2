// Tests of the buffer pool and the async swapper: staged (unaligned) and direct (aligned) swaps,
// the in-flight bound, corrupt data never reaching the caller's memory, and the streaming helper
// with read-ahead and write-behind.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "core/error.h"
#include "offload/buffer_pool.h"
#include "offload/fault.h"
#include "offload/io_engine.h"
#include "offload/swap_store.h"
#include "offload/swapper.h"
#include "tests/offload/offload_test_util.h"

namespace strata::offload {
namespace {

using testing::TempDir;
constexpr std::size_t MiB = 1024 * 1024;

TEST(BufferPool, LendsFixedSlotsAndTakesThemBack) {
  BufferPoolOptions o;
  o.slot_count = 2;
  o.slot_bytes = 1;  // rounded up to 2 MiB
  BufferPool pool(o);
  EXPECT_EQ(pool.slot_bytes(), 2 * MiB);
  BufferLease a = pool.acquire();
  BufferLease b = pool.acquire();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % 4096, 0u);
  EXPECT_NE(a.data(), b.data());
  BufferLease c;
  EXPECT_FALSE(pool.try_acquire(&c));
  a.reset();
  EXPECT_TRUE(pool.try_acquire(&c));
  EXPECT_EQ(pool.free_slots(), 0u);
}

class SwapperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_SKIP_WITHOUT_DIRECT_IO(dir_.path());
    IoEngineOptions eo;
    eo.faults = &faults_;
    engine_ = make_io_engine(eo);
    SwapStoreOptions so;
    so.dirs = {dir_.path()};
    so.capacity_bytes = 48 * MiB;
    store_ = std::make_unique<SwapStore>(*engine_, so);
    BufferPoolOptions po;
    po.slot_count = 3;
    po.slot_bytes = 4 * MiB;
    pool_ = std::make_unique<BufferPool>(po, engine_.get());
  }
  void TearDown() override {
    pool_.reset();
    store_.reset();
  }
  TempDir dir_;
  FaultInjector faults_;
  std::unique_ptr<IoEngine> engine_;
  std::unique_ptr<SwapStore> store_;
  std::unique_ptr<BufferPool> pool_;
};

TEST_F(SwapperTest, StagedAndDirectRoundTrips) {
  Swapper swapper(*store_, *pool_, SwapperOptions{8 * MiB});
  // Unaligned, odd-sized tensors in ordinary vectors (staged) ...
  std::vector<std::vector<std::byte>> tensors;
  std::vector<IoHandle> outs;
  for (int i = 0; i < 6; ++i) {
    tensors.emplace_back(100'000 + static_cast<std::size_t>(i) * 333'331);
    testing::fill_pattern(tensors.back().data(), tensors.back().size(), static_cast<std::uint64_t>(i));
    outs.push_back(swapper.swap_out("t" + std::to_string(i), std::span<const std::byte>(tensors.back())));
  }
  // ... and an aligned one written straight from its memory.
  HostBuffer direct = testing::aligned_buffer(6 * MiB);
  testing::fill_pattern(static_cast<std::byte*>(direct.data()), 6 * MiB, 99);
  outs.push_back(swapper.swap_out("direct", direct.as<std::byte>()));
  wait_all(outs);
  EXPECT_LE(swapper.peak_inflight_bytes(), 8 * MiB);
  EXPECT_EQ(swapper.inflight_bytes(), 0u);
  EXPECT_EQ(pool_->free_slots(), 3u);

  std::vector<std::vector<std::byte>> back;
  std::vector<IoHandle> ins;
  for (int i = 0; i < 6; ++i) {
    back.emplace_back(tensors[static_cast<std::size_t>(i)].size());
    ins.push_back(swapper.swap_in("t" + std::to_string(i), back.back()));
  }
  HostBuffer direct_back = testing::aligned_buffer(6 * MiB);
  ins.push_back(swapper.swap_in("direct", direct_back.as<std::byte>()));
  wait_all(ins);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(back[static_cast<std::size_t>(i)], tensors[static_cast<std::size_t>(i)]) << "tensor " << i;
  }
  EXPECT_EQ(testing::first_mismatch(static_cast<std::byte*>(direct_back.data()), 6 * MiB, 99), -1);
  std::vector<std::byte> wrong(10);
  EXPECT_THROW(swapper.swap_in("t0", wrong), ConfigError);
  std::vector<std::byte> huge(5 * MiB + 1);
  EXPECT_THROW(swapper.swap_out("huge", huge), ConfigError);  // unaligned and larger than a slot
}

TEST_F(SwapperTest, FailedReadLeavesCallerMemoryUntouched) {
  Swapper swapper(*store_, *pool_);
  std::vector<std::byte> t(50'000);
  testing::fill_pattern(t.data(), t.size(), 4);
  swapper.swap_out("t", t).wait();
  faults_.add(FaultRule{FaultKind::Eio, faults_.operations(IoOp::Read) + 1, IoOp::Read, 1});
  std::vector<std::byte> dst(50'000, std::byte{0x33});
  EXPECT_THROW(swapper.swap_in("t", dst).wait(), IoError);
  for (std::byte b : dst) ASSERT_EQ(b, std::byte{0x33});
  EXPECT_EQ(pool_->free_slots(), 3u);
  swapper.swap_in("t", dst).wait();  // the fault was transient
  EXPECT_EQ(dst, t);
}

TEST_F(SwapperTest, StreamsWithReadAheadAndWriteBehind) {
  Swapper swapper(*store_, *pool_);
  constexpr int kKeys = 7;
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back("group" + std::to_string(i));
    std::vector<std::byte> t(1 * MiB + static_cast<std::size_t>(i) * 4099);
    testing::fill_pattern(t.data(), t.size(), static_cast<std::uint64_t>(i));
    swapper.swap_out(keys.back(), t).wait();
  }
  // The "optimizer" checks it got key i's bytes and rewrites them with pattern i + 100.
  std::atomic<int> seen{0};
  swapper.stream_keys(keys, WriteBack::On, [&](std::size_t i, std::span<std::byte> bytes) {
    EXPECT_EQ(bytes.size(), store_->size_bytes(keys[i]));
    EXPECT_EQ(testing::first_mismatch(bytes.data(), bytes.size(), i), -1) << "key " << i;
    testing::fill_pattern(bytes.data(), bytes.size(), i + 100);
    ++seen;
  });
  EXPECT_EQ(seen.load(), kKeys);
  EXPECT_EQ(pool_->free_slots(), 3u);
  swapper.stream_keys(keys, WriteBack::Off, [&](std::size_t i, std::span<std::byte> bytes) {
    EXPECT_EQ(testing::first_mismatch(bytes.data(), bytes.size(), i + 100), -1) << "write-behind lost key " << i;
  });
  // An error in the work function surfaces after in-flight I/O settled.
  EXPECT_THROW(swapper.stream_keys(keys, WriteBack::On,
                                   [&](std::size_t i, std::span<std::byte>) {
                                     if (i == 3) throw ConfigError("work failed");
                                   }),
               ConfigError);
  EXPECT_EQ(pool_->free_slots(), 3u);
}

}  // namespace
}  // namespace strata::offload
