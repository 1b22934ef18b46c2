// Tests of core/host_buffer.h: alignment (the 4 KiB O_DIRECT needs and larger), zero-size
// buffers, move semantics, huge-page options that must never fail (explicit pages fall back), the
// pinning hook (called once per buffer, undone once, never for empty buffers), a pinner that throws
// (the mapping is returned, nothing is left pinned), and refused alignments.
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/host_buffer.h"
#include "core/topology.h"
#include "core/units.h"

namespace strata {
namespace {

bool aligned(const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

// True if any page of [p, p+bytes) is still mapped in this process.
bool any_page_mapped(const void* p, std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  auto addr = reinterpret_cast<std::uintptr_t>(p) / page * page;
  const auto end = reinterpret_cast<std::uintptr_t>(p) + bytes;
  unsigned char vec = 0;
  for (; addr < end; addr += page) {
    if (mincore(reinterpret_cast<void*>(addr), page, &vec) == 0) return true;  // ENOMEM: unmapped
  }
  return false;
}

// Records what the buffer asks of its device; can be told to fail.
class FakePinner : public HostMemoryPinner {
 public:
  void pin_host(void* ptr, std::size_t bytes) override {
    pin_calls.emplace_back(ptr, bytes);
    if (fail) throw DeviceError("fake pinner: cannot page-lock (test)");
    pinned_bytes += bytes;
  }
  void unpin_host(void* ptr) noexcept override {
    unpin_calls.push_back(ptr);
    for (const auto& [p, b] : pin_calls) {
      if (p == ptr) pinned_bytes -= b;
    }
  }
  bool fail = false;
  std::size_t pinned_bytes = 0;
  std::vector<std::pair<void*, std::size_t>> pin_calls;
  std::vector<void*> unpin_calls;
};

TEST(HostBuffer, DefaultIsPageAlignedAndWritable) {
  HostBuffer buf = HostBuffer::allocate(10000);
  ASSERT_FALSE(buf.empty());
  EXPECT_EQ(buf.size_bytes(), 10000u);
  EXPECT_TRUE(aligned(buf.data(), 4096));
  EXPECT_FALSE(buf.pinned());
  std::memset(buf.data(), 0x5A, buf.size_bytes());
  EXPECT_EQ(buf.as<std::uint8_t>()[9999], 0x5A);
  EXPECT_EQ(buf.as<float>().size(), 2500u);
}

TEST(HostBuffer, LargerAlignments) {
  for (std::size_t align : {std::size_t{64}, std::size_t{4096}, std::size_t{8192}, 64 * KiB, 2 * MiB, 16 * MiB}) {
    HostBuffer buf = HostBuffer::allocate(3 * 4096 + 17, HostBufferOptions{.alignment_bytes = align});
    EXPECT_TRUE(aligned(buf.data(), std::max<std::size_t>(align, 4096))) << "alignment " << align;
    std::memset(buf.data(), 1, buf.size_bytes());  // the whole range is usable
  }
}

TEST(HostBuffer, BadAlignmentIsRefused) {
  for (std::size_t align : {std::size_t{0}, std::size_t{3}, std::size_t{4097}, std::size_t{6144}}) {
    try {
      HostBuffer::allocate(4096, HostBufferOptions{.alignment_bytes = align});
      FAIL() << "alignment " << align << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(align)), std::string::npos) << e.what();
    }
  }
}

TEST(HostBuffer, ZeroSizeIsEmptyAndNeverPinned) {
  FakePinner pinner;
  HostBuffer buf = HostBuffer::allocate(0, HostBufferOptions{.pinner = &pinner});
  EXPECT_TRUE(buf.empty());
  EXPECT_EQ(buf.data(), nullptr);
  EXPECT_EQ(buf.size_bytes(), 0u);
  EXPECT_FALSE(buf.pinned());
  EXPECT_TRUE(buf.as<float>().empty());
  buf = HostBuffer();
  EXPECT_TRUE(pinner.pin_calls.empty());
  EXPECT_TRUE(pinner.unpin_calls.empty());
}

TEST(HostBuffer, MoveTransfersOwnershipOnce) {
  FakePinner pinner;
  HostBuffer a = HostBuffer::allocate(8192, HostBufferOptions{.pinner = &pinner});
  void* const p = a.data();
  HostBuffer b(std::move(a));
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_FALSE(a.pinned());
  EXPECT_EQ(b.data(), p);
  EXPECT_TRUE(b.pinned());

  HostBuffer c = HostBuffer::allocate(4096, HostBufferOptions{.pinner = &pinner});
  void* const q = c.data();
  c = std::move(b);  // releases c's old buffer (unpins q), takes p
  EXPECT_EQ(c.data(), p);
  ASSERT_EQ(pinner.unpin_calls.size(), 1u);
  EXPECT_EQ(pinner.unpin_calls[0], q);
  EXPECT_FALSE(any_page_mapped(q, 4096));

  HostBuffer& alias = c;
  c = std::move(alias);  // self-move leaves it intact
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(pinner.unpin_calls.size(), 1u);
}

TEST(HostBuffer, PinnerCalledOnceAndUndoneOnDestruction) {
  FakePinner pinner;
  void* p = nullptr;
  {
    HostBuffer buf = HostBuffer::allocate(MiB, HostBufferOptions{.alignment_bytes = 64 * KiB, .pinner = &pinner});
    p = buf.data();
    EXPECT_TRUE(buf.pinned());
    ASSERT_EQ(pinner.pin_calls.size(), 1u);
    EXPECT_EQ(pinner.pin_calls[0].first, p);       // the aligned data pointer, not the mapping base
    EXPECT_EQ(pinner.pin_calls[0].second, MiB);    // the requested size
    EXPECT_EQ(pinner.pinned_bytes, MiB);
    EXPECT_TRUE(pinner.unpin_calls.empty());
  }
  ASSERT_EQ(pinner.unpin_calls.size(), 1u);
  EXPECT_EQ(pinner.unpin_calls[0], p);
  EXPECT_EQ(pinner.pinned_bytes, 0u);
  EXPECT_FALSE(any_page_mapped(p, MiB));
}

TEST(HostBuffer, UnpinnedBufferNeverCallsThePinner) {
  FakePinner pinner;
  { HostBuffer buf = HostBuffer::allocate(MiB); }
  EXPECT_TRUE(pinner.pin_calls.empty());
  EXPECT_TRUE(pinner.unpin_calls.empty());
}

TEST(HostBuffer, ThrowingPinnerLeavesNoMappingAndNoUnpin) {
  FakePinner pinner;
  pinner.fail = true;
  const std::size_t bytes = 8 * MiB;
  EXPECT_THROW(HostBuffer::allocate(bytes, HostBufferOptions{.pinner = &pinner}), DeviceError);
  ASSERT_EQ(pinner.pin_calls.size(), 1u);
  EXPECT_TRUE(pinner.unpin_calls.empty());  // never pinned, so never unpinned
  EXPECT_FALSE(any_page_mapped(pinner.pin_calls[0].first, bytes)) << "the mapping leaked";
}

TEST(HostBuffer, HugePageOptionsNeverFail) {
  for (HugePages hp : {HugePages::Off, HugePages::Transparent, HugePages::Explicit}) {
    HostBuffer buf = HostBuffer::allocate(4 * MiB + 100, HostBufferOptions{.huge_pages = hp});
    ASSERT_FALSE(buf.empty());
    EXPECT_TRUE(aligned(buf.data(), 4096));
    if (hp != HugePages::Explicit) {
      EXPECT_FALSE(buf.explicit_huge_pages());
    }
    if (buf.explicit_huge_pages()) {
      EXPECT_TRUE(aligned(buf.data(), 2 * MiB));
    }
    std::memset(buf.data(), 7, buf.size_bytes());
    EXPECT_EQ(buf.as<std::uint8_t>()[4 * MiB + 99], 7);
  }
}

TEST(HostBuffer, NumaPlacementIsBestEffort) {
  Topology topo;
  HostBuffer buf = HostBuffer::allocate(MiB, HostBufferOptions{.topology = &topo, .numa_node = 0});
  EXPECT_FALSE(buf.empty());
  // A node that does not exist must not fail the allocation either (placement is an optimization).
  HostBuffer other = HostBuffer::allocate(MiB, HostBufferOptions{.topology = &topo, .numa_node = 999});
  std::memset(other.data(), 0, other.size_bytes());
}

}  // namespace
}  // namespace strata
