// Fuzzes the swap store's read path: the on-disk bytes of a stored key (striped over two files,
// with a padded tail) are replaced by a mutant behind the store's back; a read must then fail with
// a FormatError exactly when the key's meaningful bytes changed, and return the original bytes
// otherwise (changes confined to the padding are harmless). Changed data is never returned.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

#include "core/host_buffer.h"
#include "offload/io_engine.h"
#include "offload/swap_store.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/offload/offload_test_util.h"

namespace strata::fuzz {
namespace {

using offload::SwapExtent;
using offload::SwapStore;

// O_DIRECT, like the store's own I/O, so that no page cache stands between the mutant and the read.
struct DirectFd {
  explicit DirectFd(const std::string& path) : fd(::open(path.c_str(), O_RDWR | O_DIRECT)) {}
  ~DirectFd() {
    if (fd >= 0) ::close(fd);
  }
  int fd;
};

TEST(FuzzSwapStore, FlippedBytesAreCaughtOnRead) {
  offload::testing::TempDir dir;
  STRATA_SKIP_WITHOUT_DIRECT_IO(dir.path());
  offload::IoEngineOptions eo;
  eo.queue_depth = 8;
  const auto engine = offload::make_io_engine(eo);
  offload::SwapStoreOptions so;
  so.dirs = {dir.sub("d0"), dir.sub("d1")};
  so.capacity_bytes = 1 << 20;
  so.stripe_min_bytes = 4096;
  SwapStore store(*engine, so);

  const std::size_t bytes = 3 * 4096 + 1234;
  HostBuffer value = offload::testing::aligned_buffer(SwapStore::padded(bytes));
  offload::testing::fill_pattern(static_cast<std::byte*>(value.data()), bytes, 42);
  store.write("k", value.as<std::byte>(), bytes).wait();
  const std::vector<SwapExtent> extents = store.extents("k");
  ASSERT_GE(extents.size(), 2u) << "the key should be striped over both files";

  std::vector<std::unique_ptr<DirectFd>> fds;
  for (unsigned f = 0; f < store.file_count(); ++f) {
    fds.push_back(std::make_unique<DirectFd>(store.file_path(f)));
    ASSERT_GE(fds.back()->fd, 0);
  }
  std::size_t disk_bytes = 0;
  for (const SwapExtent& e : extents) disk_bytes += e.length_bytes;
  HostBuffer io = offload::testing::aligned_buffer(disk_bytes);
  auto transfer = [&](bool write) {
    std::size_t at = 0;
    for (const SwapExtent& e : extents) {
      auto* p = static_cast<char*>(io.data()) + at;
      const auto off = static_cast<off_t>(e.file_offset_bytes);
      const ssize_t n = write ? ::pwrite(fds[e.file]->fd, p, e.length_bytes, off) : ::pread(fds[e.file]->fd, p, e.length_bytes, off);
      if (n != static_cast<ssize_t>(e.length_bytes)) throw std::runtime_error("direct I/O on the swap file failed");
      at += e.length_bytes;
    }
  };
  transfer(false);
  const std::string original(static_cast<const char*>(io.data()), disk_bytes);
  // The meaningful bytes of the on-disk image, in key order.
  auto meaningful = [&](const std::string& image) {
    std::string out;
    std::size_t at = 0;
    for (const SwapExtent& e : extents) {
      out += image.substr(at, e.data_bytes);
      at += e.length_bytes;
    }
    return out;
  };
  const std::string original_meaning = meaningful(original);
  HostBuffer back = offload::testing::aligned_buffer(SwapStore::padded(bytes));

  const FuzzStats s = fuzz_loop("swap", {original}, mutate_bytes, [&](std::string input) {
    input.resize(disk_bytes, '\0');  // inserts, deletes and truncation shift the data; the length stays
    std::memcpy(io.data(), input.data(), disk_bytes);
    transfer(true);
    const bool changed = meaningful(input) != original_meaning;
    std::exception_ptr error = store.read("k", back.as<std::byte>()).wait_error();
    std::memcpy(io.data(), original.data(), disk_bytes);
    transfer(true);
    if (error != nullptr) {
      try {
        std::rethrow_exception(error);
      } catch (const FormatError&) {
        if (!changed) throw InsaneResult("a read of unchanged data failed its checksum");
        throw;
      }
    }
    if (changed) throw InsaneResult("changed swap data was returned without an error");
    if (std::memcmp(back.data(), value.data(), bytes) != 0) throw InsaneResult("the read returned other bytes");
  });
  EXPECT_GT(s.refused, 0u);
  // The store is intact afterwards.
  store.read("k", back.as<std::byte>()).wait();
  EXPECT_EQ(std::memcmp(back.data(), value.data(), bytes), 0);
}

}  // namespace
}  // namespace strata::fuzz
