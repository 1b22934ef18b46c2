// The index maps of the tensor-core attention kernels (cuda_attention_tc.cuh), as STRATA_HD
// constexpr functions so the host test tests/models/attention_tc_layout_test.cc checks the very
// code the kernels run: which matrix element each lane holds in an mma.m16n8k16 fragment, which
// shared-memory row each lane hands ldmatrix, and the XOR swizzle of the shared tiles.
//
// Sources (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" and "Warp-level
// matrix load instruction: ldmatrix"), with g = lane >> 2 (groupID) and t = lane % 4
// (threadID_in_group):
//  * A (16 x 16, .f16/.bf16, four .b32 registers a0a1, a2a3, a4a5, a6a7, lower element in the low
//    half): row g for a0, a1, a4, a5 and g + 8 for the others; column 2t + (i & 1), plus 8 for
//    a4..a7.
//  * B (16 x 8 as K x N, two registers b0b1, b2b3): row (k) 2t + (i & 1), plus 8 for b2, b3;
//    column (n) g.
//  * C/D (16 x 8, four .f32 registers): row g for c0, c1 and g + 8 for c2, c3; column 2t + (i & 1).
//  * ldmatrix .m8n8 .x4 .b16: lanes 8q .. 8q+7 give the addresses of rows 0..7 of matrix q (16
//    bytes each, 16-byte aligned); destination register q of lane l holds row l / 4, elements
//    2 (l % 4) and 2 (l % 4) + 1 of matrix q (lower column in the low half). With .trans it holds
//    elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4) (row, column) instead: the matrix is
//    read column-major.
// Hence the three ldmatrix uses below (each returns four registers):
//  * an A fragment from a row-major [m][k] tile: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7),
//    (rows 0-7, k 8-15), (rows 8-15, k 8-15) are exactly a0a1, a2a3, a4a5, a6a7;
//  * B fragments of two 8-column blocks from a tile stored [n][k] (k contiguous: K or V rows read
//    as B = K^T), no .trans: matrix (n 0-7, k 0-7) is b0b1 of block 0, (n 0-7, k 8-15) its b2b3,
//    then the same for n 8-15 (block 1);
//  * B fragments of two 8-column blocks from a tile stored [k][n] (n contiguous: V, dO, Q, K read
//    as B = V), with .trans: matrix (k 0-7, n 0-7) is b0b1 of block 0, (k 8-15, n 0-7) its b2b3,
//    then (k 0-7, n 8-15) and (k 8-15, n 8-15) for block 1.
// A score tile's C fragments become the A fragment of the next product in registers: the A
// fragment over k columns 16 kk .. 16 kk + 15 is C blocks 2 kk and 2 kk + 1, element i of A being
// element i % 4 of block 2 kk + i / 4 (a_source_block / a_source_elem).
//
// Shared tiles are rows of D 16-bit elements (D = 64 or 128: 8 or 16 chunks of 16 bytes); chunk c
// of row r is stored at chunk c ^ (r % 8) of that row. An ldmatrix matrix reads one chunk from each
// of 8 consecutive rows; the XOR sends them to 8 different 16-byte bank groups (a row is a multiple
// of 128 bytes), so no load has a bank conflict, and a cp.async of 8 consecutive chunks of a row
// writes 8 different bank groups.
#pragma once

#include "core/hd.h"

namespace strata::models::attention_tc {

struct RowCol {
  int row, col;
};

// mma.m16n8k16 (.f16/.bf16 operands): element i (0..7) of lane's A fragment, 16 x 16 [m][k].
STRATA_HD constexpr RowCol mma_a_elem(int lane, int i) {
  return {lane / 4 + ((i / 2) % 2) * 8, (lane % 4) * 2 + (i % 2) + (i / 4) * 8};
}
// Element i (0..3) of lane's B fragment, 16 x 8 [k][n].
STRATA_HD constexpr RowCol mma_b_elem(int lane, int i) { return {(lane % 4) * 2 + (i % 2) + (i / 2) * 8, lane / 4}; }
// Element i (0..3) of lane's C/D fragment, 16 x 8 [m][n].
STRATA_HD constexpr RowCol mma_c_elem(int lane, int i) { return {lane / 4 + (i / 2) * 8, (lane % 4) * 2 + (i % 2)}; }

// A fragment element i over k columns 16 kk .. 16 kk + 15 is element a_source_elem(i) of the C
// fragment of 8-column block 2 kk + a_source_block(i) of the product that made it.
STRATA_HD constexpr int a_source_block(int i) { return i / 4; }
STRATA_HD constexpr int a_source_elem(int i) { return i % 4; }

// ldmatrix .x4: the (row, column) of the first element of the 8-element row that `lane` points at,
// within the 16 x 16 block being loaded.
//  A fragment, tile [m][k]:                    (m, k)
STRATA_HD constexpr RowCol ldsm_a_addr(int lane) { return {lane % 16, (lane / 16) * 8}; }
//  Two B blocks, tile [n][k], no .trans:        (n, k)
STRATA_HD constexpr RowCol ldsm_b_addr(int lane) { return {lane % 8 + (lane / 16) * 8, ((lane / 8) % 2) * 8}; }
//  Two B blocks, tile [k][n], .trans:           (k, n)
STRATA_HD constexpr RowCol ldsm_bt_addr(int lane) { return {lane % 8 + ((lane / 8) % 2) * 8, (lane / 16) * 8}; }

// Element offset of (row, col) in a swizzled shared tile of rows of D elements (D a multiple of 64).
template <int D>
STRATA_HD constexpr int tile_offset(int row, int col) {
  static_assert(D % 64 == 0, "the swizzle needs at least 8 chunks of 16 bytes per row");
  return row * D + (((col / 8) ^ (row % 8)) * 8) + col % 8;
}

// cp.async tile copies (16 bytes each): thread t of the block copies chunk copy_chunk<D>(t) of row
// copy_row<D>(t) and of the rows every threads / (D/8) below it (a multiple of 8, so the swizzled
// offset just moves by whole rows). 8 consecutive threads copy 8 consecutive chunks of one row.
template <int D>
STRATA_HD constexpr int copy_row(int thread) {
  return thread / (D / 8);
}
template <int D>
STRATA_HD constexpr int copy_chunk(int thread) {
  return thread % (D / 8);
}

}  // namespace strata::models::attention_tc
