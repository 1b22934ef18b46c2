// The index maps of the tensor-core attention kernels (models/kernels/attention_tc_layout.h,
// used by models/kernels/cuda_attention_tc.cuh), checked on the host: each mma.m16n8k16 fragment
// map covers its matrix exactly once; a score tile's C fragments are the A fragment of the next
// product; ldmatrix, modelled from the PTX ISA's description, fed the kernels' lane addresses over
// the swizzled shared tiles, delivers exactly the fragments mma expects (A; B from [n][k] rows; B
// from [k][n] rows with .trans); the swizzle is a bijection that keeps 16-byte chunks whole; and no
// ldmatrix matrix read and no 8 consecutive cp.async writes share a bank. Plain host code: runs in
// every build, with or without a GPU.
#include <gtest/gtest.h>

#include <array>
#include <set>
#include <string>
#include <vector>

#include "models/kernels/attention_tc_layout.h"

namespace strata::models::attention_tc {
namespace {

constexpr int kLanes = 32;
constexpr int kBlockThreads = 256;  // the kernels' 8 warps
constexpr int kTileRows = 128;      // the largest shared tile (kBM rows)

bool same(RowCol a, RowCol b) { return a.row == b.row && a.col == b.col; }
std::string str(RowCol a) { return "(" + std::to_string(a.row) + ", " + std::to_string(a.col) + ")"; }

// A rows x D tile of 16-bit elements as the kernels store it: element (r, c) at tile_offset(r, c).
// Each slot holds its logical (row, col), so a load's result names what it read.
template <int D>
std::vector<RowCol> swizzled_tile(int rows) {
  std::vector<RowCol> mem(static_cast<std::size_t>(rows * D), RowCol{-1, -1});
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < D; ++c) mem.at(static_cast<std::size_t>(tile_offset<D>(r, c))) = {r, c};
  }
  return mem;
}

// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 as the PTX ISA describes it: lanes 8q..8q+7
// give the element offsets of rows 0..7 of matrix q (8 consecutive 16-bit elements each); without
// .trans, register q of lane l holds elements (l/4, 2(l%4)) and (l/4, 2(l%4)+1) of matrix q, the
// first in the low half; with .trans, elements (2(l%4), l/4) and (2(l%4)+1, l/4).
struct Regs {
  RowCol half[4][2];  // [register][low, high]
};
std::array<Regs, kLanes> ldmatrix_x4(const std::vector<RowCol>& mem, const std::array<int, kLanes>& addr, bool trans) {
  std::array<Regs, kLanes> out{};
  for (int l = 0; l < kLanes; ++l) {
    for (int q = 0; q < 4; ++q) {
      for (int h = 0; h < 2; ++h) {
        const int row = trans ? 2 * (l % 4) + h : l / 4;
        const int col = trans ? l / 4 : 2 * (l % 4) + h;
        out[static_cast<std::size_t>(l)].half[q][h] =
            mem.at(static_cast<std::size_t>(addr[static_cast<std::size_t>(8 * q + row)] + col));
      }
    }
  }
  return out;
}

// The 16-byte bank group (of 8: 32 banks of 4 bytes) of a 16-bit element offset.
int bank_group(int elem_offset) { return (elem_offset * 2 / 16) % 8; }

// Each of the four matrices' 8 row addresses: 16-byte aligned and in 8 different bank groups (one
// wavefront each).
void expect_conflict_free(const std::array<int, kLanes>& addr, const std::string& what) {
  for (int q = 0; q < 4; ++q) {
    std::set<int> groups;
    for (int r = 0; r < 8; ++r) {
      const int a = addr[static_cast<std::size_t>(8 * q + r)];
      EXPECT_EQ(a % 8, 0) << what << ": lane " << 8 * q + r << " address not 16-byte aligned";
      groups.insert(bank_group(a));
    }
    EXPECT_EQ(groups.size(), 8u) << what << ": matrix " << q << " has a bank conflict";
  }
}

TEST(AttentionTcLayout, MmaFragmentsCoverEachElementOnce) {
  int a[16][16] = {}, b[16][8] = {}, c[16][8] = {};
  for (int l = 0; l < kLanes; ++l) {
    for (int i = 0; i < 8; ++i) {
      const RowCol e = mma_a_elem(l, i);
      ASSERT_TRUE(e.row >= 0 && e.row < 16 && e.col >= 0 && e.col < 16) << "A lane " << l << " elem " << i;
      ++a[e.row][e.col];
    }
    for (int i = 0; i < 4; ++i) {
      const RowCol eb = mma_b_elem(l, i), ec = mma_c_elem(l, i);
      ASSERT_TRUE(eb.row >= 0 && eb.row < 16 && eb.col >= 0 && eb.col < 8) << "B lane " << l << " elem " << i;
      ASSERT_TRUE(ec.row >= 0 && ec.row < 16 && ec.col >= 0 && ec.col < 8) << "C lane " << l << " elem " << i;
      ++b[eb.row][eb.col];
      ++c[ec.row][ec.col];
    }
  }
  for (int r = 0; r < 16; ++r) {
    for (int col = 0; col < 16; ++col) EXPECT_EQ(a[r][col], 1) << "A " << r << "," << col;
    for (int col = 0; col < 8; ++col) {
      EXPECT_EQ(b[r][col], 1) << "B " << r << "," << col;
      EXPECT_EQ(c[r][col], 1) << "C " << r << "," << col;
    }
  }
  // Spot values straight from the PTX ISA's tables (lane 5: groupID 1, threadID_in_group 1).
  EXPECT_TRUE(same(mma_a_elem(5, 0), {1, 2}) && same(mma_a_elem(5, 3), {9, 3}) && same(mma_a_elem(5, 6), {9, 10}));
  EXPECT_TRUE(same(mma_b_elem(5, 1), {3, 1}) && same(mma_b_elem(5, 2), {10, 1}));
  EXPECT_TRUE(same(mma_c_elem(5, 1), {1, 3}) && same(mma_c_elem(5, 2), {9, 2}));
}

// The A fragment over product columns 16kk..16kk+15 taken from C blocks 2kk and 2kk+1 of the same
// lane holds the same (row, column) elements: P and dS go from one mma to the next in registers.
TEST(AttentionTcLayout, ScoreFragmentsAreTheNextProductsAFragment) {
  for (int l = 0; l < kLanes; ++l) {
    for (int kk = 0; kk < 4; ++kk) {
      for (int i = 0; i < 8; ++i) {
        const RowCol from = mma_c_elem(l, a_source_elem(i));
        const RowCol have{from.row, 8 * (2 * kk + a_source_block(i)) + from.col};
        const RowCol want = mma_a_elem(l, i);
        EXPECT_TRUE(same(have, {want.row, 16 * kk + want.col}))
            << "lane " << l << " kk " << kk << " A elem " << i << ": C gives " << str(have);
      }
      // A register r packs elements 2r (low) and 2r + 1 of one C block, in C's order.
      for (int r = 0; r < 4; ++r) {
        EXPECT_EQ(a_source_block(2 * r), a_source_block(2 * r + 1));
        EXPECT_EQ(a_source_elem(2 * r) + 1, a_source_elem(2 * r + 1));
      }
    }
  }
}

template <int D>
void check_ldmatrix_maps() {
  const std::vector<RowCol> mem = swizzled_tile<D>(kTileRows);
  const std::string dim = "D=" + std::to_string(D);
  // A fragments of the warp's 16 rows (row0 = 16 warp) of a [row][D] tile: mma_rows_rows_t.
  for (int row0 = 0; row0 < kTileRows; row0 += 16) {
    for (int kk = 0; kk < D / 16; ++kk) {
      std::array<int, kLanes> addr{};
      for (int l = 0; l < kLanes; ++l) {
        const RowCol p = ldsm_a_addr(l);
        addr[static_cast<std::size_t>(l)] = tile_offset<D>(row0 + p.row, kk * 16 + p.col);
      }
      const std::string what = dim + " A row0 " + std::to_string(row0) + " kk " + std::to_string(kk);
      expect_conflict_free(addr, what);
      const auto regs = ldmatrix_x4(mem, addr, false);
      for (int l = 0; l < kLanes; ++l) {
        for (int i = 0; i < 8; ++i) {
          const RowCol e = mma_a_elem(l, i);
          const RowCol got = regs[static_cast<std::size_t>(l)].half[i / 2][i % 2];
          EXPECT_TRUE(same(got, {row0 + e.row, kk * 16 + e.col}))
              << what << " lane " << l << " elem " << i << " got " << str(got);
        }
      }
    }
  }
  // B fragments of 8-column blocks 2np, 2np+1 from a tile of [n][k] rows (K, V, Q, dO read as
  // B = M^T), no .trans: registers 0, 1 are block 2np, 2, 3 block 2np+1. B(k, n) = tile(n, k).
  for (int np = 0; np < kTileRows / 16; ++np) {
    for (int kk = 0; kk < D / 16; ++kk) {
      std::array<int, kLanes> addr{};
      for (int l = 0; l < kLanes; ++l) {
        const RowCol p = ldsm_b_addr(l);
        addr[static_cast<std::size_t>(l)] = tile_offset<D>(np * 16 + p.row, kk * 16 + p.col);
      }
      const std::string what = dim + " B np " + std::to_string(np) + " kk " + std::to_string(kk);
      expect_conflict_free(addr, what);
      const auto regs = ldmatrix_x4(mem, addr, false);
      for (int l = 0; l < kLanes; ++l) {
        for (int blk = 0; blk < 2; ++blk) {
          for (int i = 0; i < 4; ++i) {
            const RowCol e = mma_b_elem(l, i);  // (k, n)
            const RowCol got = regs[static_cast<std::size_t>(l)].half[2 * blk + i / 2][i % 2];
            EXPECT_TRUE(same(got, {np * 16 + blk * 8 + e.col, kk * 16 + e.row}))
                << what << " lane " << l << " block " << blk << " elem " << i << " got " << str(got);
          }
        }
      }
    }
  }
  // B fragments of 8-column blocks 2dp, 2dp+1 from a tile of [k][n] rows (V, K, dO, Q read as
  // B = M), .trans: registers 0, 1 are block 2dp, 2, 3 block 2dp+1. B(k, n) = tile(k, n).
  for (int kk = 0; kk < kTileRows / 16; ++kk) {
    for (int dp = 0; dp < D / 16; ++dp) {
      std::array<int, kLanes> addr{};
      for (int l = 0; l < kLanes; ++l) {
        const RowCol p = ldsm_bt_addr(l);
        addr[static_cast<std::size_t>(l)] = tile_offset<D>(kk * 16 + p.row, dp * 16 + p.col);
      }
      const std::string what = dim + " B.trans kk " + std::to_string(kk) + " dp " + std::to_string(dp);
      expect_conflict_free(addr, what);
      const auto regs = ldmatrix_x4(mem, addr, true);
      for (int l = 0; l < kLanes; ++l) {
        for (int blk = 0; blk < 2; ++blk) {
          for (int i = 0; i < 4; ++i) {
            const RowCol e = mma_b_elem(l, i);  // (k, n)
            const RowCol got = regs[static_cast<std::size_t>(l)].half[2 * blk + i / 2][i % 2];
            EXPECT_TRUE(same(got, {kk * 16 + e.row, dp * 16 + blk * 8 + e.col}))
                << what << " lane " << l << " block " << blk << " elem " << i << " got " << str(got);
          }
        }
      }
    }
  }
}

TEST(AttentionTcLayout, LdmatrixWithTheKernelsAddressesGivesTheMmaFragments) {
  check_ldmatrix_maps<64>();
  check_ldmatrix_maps<128>();
}

template <int D>
void check_swizzle() {
  const std::string dim = "D=" + std::to_string(D);
  std::vector<int> hits(static_cast<std::size_t>(kTileRows * D), 0);
  for (int r = 0; r < kTileRows; ++r) {
    for (int c = 0; c < D; ++c) {
      const int off = tile_offset<D>(r, c);
      ASSERT_TRUE(off >= 0 && off < kTileRows * D) << dim << " (" << r << ", " << c << ")";
      ++hits[static_cast<std::size_t>(off)];
      EXPECT_EQ(off / D, r) << dim << ": an element leaves its row";
      EXPECT_EQ(off % 8, c % 8) << dim << ": a 16-byte chunk is split";
      if (r + 8 < kTileRows) {
        EXPECT_EQ(tile_offset<D>(r + 8, c), off + 8 * D) << dim << ": rows 8 apart";
      }
    }
  }
  for (int off = 0; off < kTileRows * D; ++off) EXPECT_EQ(hits[static_cast<std::size_t>(off)], 1) << dim << " " << off;
}

TEST(AttentionTcLayout, SwizzleIsABijectionKeepingChunksWhole) {
  check_swizzle<64>();
  check_swizzle<128>();
}

// load_tile_async: thread t copies chunk copy_chunk(t) of rows copy_row(t) + n (threads / (D/8));
// the block's copies of a tile cover every chunk once, and every 8 consecutive threads (a 128-byte
// wavefront of cp.async writes) hit 8 different bank groups.
template <int D>
void check_copies(int rows) {
  const std::string what = "D=" + std::to_string(D) + " rows " + std::to_string(rows);
  constexpr int kChunks = D / 8;
  constexpr int kRowsPerPass = kBlockThreads / kChunks;
  ASSERT_EQ(kRowsPerPass % 8, 0) << what;
  ASSERT_EQ(rows % kRowsPerPass, 0) << what;
  std::vector<int> hits(static_cast<std::size_t>(rows * kChunks), 0);
  for (int n = 0; n < rows / kRowsPerPass; ++n) {
    for (int t0 = 0; t0 < kBlockThreads; t0 += 8) {
      std::set<int> groups;
      for (int t = t0; t < t0 + 8; ++t) {
        const int r = copy_row<D>(t) + n * kRowsPerPass, c = copy_chunk<D>(t);
        ASSERT_TRUE(r < rows && c < kChunks) << what;
        ++hits[static_cast<std::size_t>(r * kChunks + c)];
        const int off = tile_offset<D>(r, c * 8);
        EXPECT_EQ(off, tile_offset<D>(copy_row<D>(t), c * 8) + n * kRowsPerPass * D) << what << " thread " << t;
        groups.insert(bank_group(off));
      }
      EXPECT_EQ(groups.size(), 8u) << what << " threads " << t0 << ".." << t0 + 7 << " pass " << n;
    }
  }
  for (std::size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i], 1) << what << " chunk " << i;
}

TEST(AttentionTcLayout, TileCopiesCoverEachChunkOnceWithoutBankConflicts) {
  // The kernels' tiles: K/V steps of 64 rows, Q/dO/K/V blocks of 128, dK/dV query chunks of 64
  // (head_dim 64) and 32 (head_dim 128).
  check_copies<64>(64);
  check_copies<64>(128);
  check_copies<128>(32);
  check_copies<128>(64);
  check_copies<128>(128);
}

}  // namespace
}  // namespace strata::models::attention_tc
