// Tests of the swap store and its pieces: the extent allocator, the striping plan, round trips
// over 1 and 3 directories, checksums catching a flipped byte (key, file and offset named),
// 0600 files, refused path escapes, bad directories, a full store, and ENOSPC in the middle of a
// write leaving earlier tensors readable.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "offload/extent_allocator.h"
#include "offload/fault.h"
#include "offload/io_engine.h"
#include "offload/striping.h"
#include "offload/swap_store.h"
#include "tests/offload/offload_test_util.h"

namespace strata::offload {
namespace {

using testing::TempDir;
constexpr std::uint64_t MiB = 1024 * 1024;

TEST(ExtentAllocator, SplitsMergesAndFillsFragmentedSpace) {
  ExtentAllocator a(64 * 4096);
  auto x = a.allocate(10 * 4096);
  auto y = a.allocate(1);  // rounds up to one block
  auto z = a.allocate(20 * 4096);
  ASSERT_EQ(x.size(), 1u);
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].length_bytes, 4096u);
  EXPECT_EQ(a.free_bytes(), (64 - 31) * 4096u);
  a.release(x[0]);
  a.release(z[0]);
  // Free: [0,10) and [11,64) blocks; 60 blocks fit in no single range but fit in two.
  auto big = a.allocate(60 * 4096);
  ASSERT_EQ(big.size(), 2u);
  EXPECT_EQ(big[0].length_bytes + big[1].length_bytes, 60 * 4096u);
  EXPECT_TRUE(a.allocate(4 * 4096).empty());  // only 3 blocks left
  for (auto& r : big) a.release(r);
  a.release(y[0]);
  EXPECT_EQ(a.free_bytes(), 64 * 4096u);
  EXPECT_EQ(a.fragments(), 1u);  // everything merged back
  EXPECT_THROW(a.release(ByteRange{0, 4096}), InternalError);  // double release
}

TEST(Striping, SplitsLargeTensorsEvenlyAndKeepsSmallOnesWhole) {
  const std::uint64_t free[] = {100 * MiB, 300 * MiB, 200 * MiB};
  auto small = plan_stripes(64 * 1024, free, MiB);
  EXPECT_EQ(small, (std::vector<std::uint64_t>{0, 64 * 1024, 0}));
  auto big = plan_stripes(30 * MiB + 4096, free, MiB);
  EXPECT_EQ(big[0] + big[1] + big[2], 30 * MiB + 4096);
  for (auto b : big) EXPECT_EQ(b % 4096, 0u);
  EXPECT_EQ(big[1], 10 * MiB + 4096);  // the remainder block goes to the file with most space
}

class SwapStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_SKIP_WITHOUT_DIRECT_IO(dir_.path());
    IoEngineOptions o;
    o.kind = EngineKind::Auto;
    o.queue_depth = 16;
    o.faults = &faults_;
    engine_ = make_io_engine(o);
  }
  SwapStoreOptions options(std::vector<std::string> dirs, std::uint64_t capacity) {
    SwapStoreOptions s;
    s.dirs = std::move(dirs);
    s.capacity_bytes = capacity;
    return s;
  }
  // Writes `bytes` of pattern `seed` under key; returns the handle's error.
  std::exception_ptr put(SwapStore& store, const std::string& key, std::size_t bytes, std::uint64_t seed) {
    HostBuffer b = testing::aligned_buffer(SwapStore::padded(bytes));
    testing::fill_pattern(static_cast<std::byte*>(b.data()), bytes, seed);
    return store.write(key, b.as<std::byte>(), bytes).wait_error();
  }
  // Reads key back and returns the first wrong byte (-1: all right); rethrows read errors.
  long long check(SwapStore& store, const std::string& key, std::uint64_t seed) {
    const std::size_t bytes = store.size_bytes(key);
    HostBuffer b = testing::aligned_buffer(SwapStore::padded(bytes));
    store.read(key, b.as<std::byte>()).wait();
    return testing::first_mismatch(static_cast<std::byte*>(b.data()), bytes, seed);
  }

  TempDir dir_;
  FaultInjector faults_;
  std::unique_ptr<IoEngine> engine_;
};

TEST_F(SwapStoreTest, RoundTripsOddSizes) {
  SwapStore store(*engine_, options({dir_.path()}, 16 * MiB));
  const std::size_t sizes[] = {1, 4095, 4096, 4097, 123'457, 3 * MiB + 17};
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    ASSERT_FALSE(put(store, "t" + std::to_string(i), sizes[i], i));
  }
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    EXPECT_EQ(store.size_bytes("t" + std::to_string(i)), sizes[i]);
    EXPECT_EQ(check(store, "t" + std::to_string(i), i), -1) << "size " << sizes[i];
  }
  // Overwrite with a different size, remove, and reuse the space.
  ASSERT_FALSE(put(store, "t1", 50'000, 77));
  EXPECT_EQ(check(store, "t1", 77), -1);
  const auto before = store.free_bytes();
  store.remove("t5");
  EXPECT_GT(store.free_bytes(), before);
  EXPECT_FALSE(store.contains("t5"));
  HostBuffer b = testing::aligned_buffer(4096);
  EXPECT_THROW(store.read("t5", b.as<std::byte>()), ConfigError);
}

TEST_F(SwapStoreTest, StripesOverThreeDirectories) {
  const std::vector<std::string> dirs = {dir_.sub("d0"), dir_.sub("d1"), dir_.sub("d2")};
  SwapStore store(*engine_, options(dirs, 24 * MiB));
  ASSERT_EQ(store.file_count(), 3u);
  ASSERT_FALSE(put(store, "big", 9 * MiB + 12'345, 5));
  ASSERT_FALSE(put(store, "small", 10'000, 6));
  std::set<unsigned> files;
  for (const auto& e : store.extents("big")) files.insert(e.file);
  EXPECT_EQ(files.size(), 3u) << "a 9 MiB tensor should be spread over all three drives";
  EXPECT_EQ(store.extents("small").size(), 1u);
  EXPECT_EQ(check(store, "big", 5), -1);
  EXPECT_EQ(check(store, "small", 6), -1);
  for (unsigned i = 0; i < 3; ++i) {
    EXPECT_EQ(std::filesystem::path(store.file_path(i)).parent_path(), std::filesystem::canonical(dirs[i]));
  }
}

TEST_F(SwapStoreTest, FlippedByteIsCaughtWithKeyFileAndOffset) {
  SwapStoreOptions o = options({dir_.path()}, 8 * MiB);
  SwapStore store(*engine_, o);
  ASSERT_FALSE(put(store, "layer3.w", 300'000, 8));
  const SwapExtent e = store.extents("layer3.w").at(0);
  {
    // Flip one byte in the middle of the extent behind the store's back.
    const int fd = ::open(store.file_path(e.file).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char c = 0;
    const off_t at = static_cast<off_t>(e.file_offset_bytes + 150'001);
    ASSERT_EQ(::pread(fd, &c, 1, at), 1);
    c ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
    ::fsync(fd);
    ::close(fd);
  }
  HostBuffer b = testing::aligned_buffer(SwapStore::padded(300'000));
  try {
    store.read("layer3.w", b.as<std::byte>()).wait();
    FAIL() << "a flipped byte went unnoticed";
  } catch (const FormatError& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("layer3.w"), std::string::npos) << msg;
    EXPECT_NE(msg.find(store.file_path(e.file)), std::string::npos) << msg;
    EXPECT_NE(msg.find("offset " + std::to_string(e.file_offset_bytes)), std::string::npos) << msg;
  }
}

TEST_F(SwapStoreTest, ChecksumsCanBeSwitchedOff) {
  SwapStoreOptions o = options({dir_.path()}, 4 * MiB);
  o.verify = Verify::Off;
  SwapStore store(*engine_, o);
  ASSERT_FALSE(put(store, "k", 8192, 1));
  const SwapExtent e = store.extents("k").at(0);
  const int fd = ::open(store.file_path(0).c_str(), O_RDWR);
  const unsigned char zero = 0xFF;
  ASSERT_EQ(::pwrite(fd, &zero, 1, static_cast<off_t>(e.file_offset_bytes)), 1);
  ::close(fd);
  EXPECT_EQ(check(store, "k", 1), 0);  // unchecked: the changed byte comes back as is
}

TEST_F(SwapStoreTest, SwapFilesAre0600) {
  ::umask(0);  // even with a permissive umask
  SwapStore store(*engine_, options({dir_.path()}, MiB));
  ::umask(022);
  struct stat st {};
  ASSERT_EQ(::stat(store.file_path(0).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(SwapStoreTest, PathEscapesAreRefused) {
  const std::string outside = dir_.sub("outside");
  const std::string inside = dir_.sub("inside");
  // A symlink planted where the swap file goes, pointing out of the directory.
  ASSERT_EQ(::symlink((outside + "/victim").c_str(), (inside + "/strata-swap.bin").c_str()), 0);
  try {
    SwapStore store(*engine_, options({inside}, MiB));
    FAIL() << "a symlinked swap file was followed";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic link"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(outside + "/victim"));
  for (const char* bad : {"../escape.bin", "sub/x.bin", "..", ""}) {
    SwapStoreOptions o = options({inside}, MiB);
    o.file_name = bad;
    EXPECT_THROW(SwapStore(*engine_, o), ConfigError) << bad;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/escape.bin"));
}

TEST_F(SwapStoreTest, BadDirectoriesSayWhatIsWrong) {
  auto message = [&](const SwapStoreOptions& o) -> std::string {
    try {
      SwapStore store(*engine_, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(options({dir_.path() + "/missing"}, MiB)).find("does not exist"), std::string::npos);
  const std::string file = dir_.path() + "/plainfile";
  { UniqueFd fd(::open(file.c_str(), O_CREAT | O_WRONLY, 0600)); }
  EXPECT_NE(message(options({file}, MiB)).find("not a directory"), std::string::npos);
  const std::string too_small = message(options({dir_.path()}, std::uint64_t{1} << 60));
  EXPECT_NE(too_small.find("free but its swap file needs"), std::string::npos) << too_small;
}

TEST_F(SwapStoreTest, FullStoreNamesTheNumbers) {
  SwapStore store(*engine_, options({dir_.path()}, MiB));
  ASSERT_FALSE(put(store, "a", 768 * 1024, 1));
  HostBuffer b = testing::aligned_buffer(512 * 1024);
  try {
    store.write("b", b.as<std::byte>(), 512 * 1024);
    FAIL() << "an overfull store accepted a tensor";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("256.00 KiB of 1.00 MiB are free"), std::string::npos) << e.what();
  }
  EXPECT_EQ(check(store, "a", 1), -1);
}

TEST_F(SwapStoreTest, EnospcMidWriteLeavesEarlierTensorsReadable) {
  SwapStore store(*engine_, options({dir_.path()}, 32 * MiB));
  ASSERT_FALSE(put(store, "early0", 2 * MiB, 10));
  ASSERT_FALSE(put(store, "early1", 3 * MiB + 5, 11));
  const auto free_before = store.free_bytes();
  // The drive fills up during the third tensor: its second kernel write fails with ENOSPC.
  faults_.add(FaultRule{FaultKind::Enospc, faults_.operations(IoOp::Write) + 2, IoOp::Write, 1});
  std::exception_ptr err = put(store, "late", 12 * MiB, 12);
  ASSERT_TRUE(err);
  try {
    std::rethrow_exception(err);
  } catch (const IoError& e) {
    EXPECT_EQ(e.errno_value(), ENOSPC);
    EXPECT_NE(std::string(e.what()).find(store.file_path(0)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("full"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(store.contains("late"));
  EXPECT_EQ(store.free_bytes(), free_before) << "the failed tensor's space was not given back";
  EXPECT_EQ(check(store, "early0", 10), -1);
  EXPECT_EQ(check(store, "early1", 11), -1);
  ASSERT_FALSE(put(store, "late", 12 * MiB, 12));  // space back: a retry succeeds
  EXPECT_EQ(check(store, "late", 12), -1);
}

TEST_F(SwapStoreTest, UnalignedBuffersAreRefusedClearly) {
  SwapStore store(*engine_, options({dir_.path()}, MiB));
  HostBuffer b = testing::aligned_buffer(16384);
  auto odd = b.as<std::byte>().subspan(8, 8192);
  EXPECT_THROW(store.write("k", odd, 100), ConfigError);
  EXPECT_THROW(store.write("k", b.as<std::byte>().first(4096), 5000), ConfigError);  // too short for the padding
}

}  // namespace
}  // namespace strata::offload
