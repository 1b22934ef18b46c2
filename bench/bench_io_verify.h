// Note [Bench verify]: what `strata bench io --verify` writes and checks.
//
// Every block (one request of --bs bytes) starts with a header: a magic, the block's file offset,
// its generation (1 for the first write of this run, +1 per rewrite), the run's seed and an XXH3
// of the rest of the block seeded with offset, generation and seed. Every 4 KiB sector of the
// payload starts with its own offset and the generation, so a torn write (a new header over
// sectors of an older generation) fails the checksum as surely as a flipped byte. The runner keeps
// the generation each block must have (VerifyMap); a read checks the header against it, so a
// stale block (an older generation that is otherwise intact), a misdirected write (a valid block
// at the wrong offset) and a block from another run (another seed) are told apart in the message,
// which names the offset, the expected and the found header, and fails the run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace strata::bench::bench_io {

struct BlockHeader {
  std::uint64_t magic = 0;
  std::uint64_t offset_bytes = 0;
  std::uint64_t generation = 0;
  std::uint64_t seed = 0;
  std::uint64_t payload_xxh3 = 0;
};

inline constexpr std::uint64_t kBlockMagic = 0x5354524154414231ull;  // "STRATAB1"

// A block read back is not the block written there (Note [Bench verify]).
class VerifyError : public Error {
 public:
  using Error::Error;
};

// Fills `block` (offset_bytes in the file) as generation `generation` of run `seed`.
void stamp_block(std::span<std::byte> block, std::uint64_t offset_bytes, std::uint64_t generation,
                 std::uint64_t seed);

// Checks a block read from `offset_bytes` of `path` against the generation it must have; throws
// VerifyError naming the offset, the expected and the found header and what is wrong.
void check_block(std::span<const std::byte> block, std::uint64_t offset_bytes, std::uint64_t generation,
                 std::uint64_t seed, const std::string& path);

// The generation every block of one test file must have, and which blocks have a request in
// flight (a block is never read and written at once, so what a read sees is defined).
struct VerifyMap {
  std::vector<std::uint64_t> generation;  // 0: never written this run, not checked
  std::vector<std::uint8_t> busy;
  explicit VerifyMap(std::uint64_t blocks) : generation(blocks, 0), busy(blocks, 0) {}
};

// Test hook (the hidden --inject-fault): damages block `block` of the file on disk, outside the
// engine, as a drive could: "flip" flips one payload byte, "stale" writes the block's previous
// generation intact, "misdirect" writes a valid copy of another block there. Throws ConfigError
// for an unknown kind.
void inject_fault(int fd, const std::string& path, const std::string& kind, std::uint64_t block,
                  std::size_t block_bytes, const VerifyMap& map, std::uint64_t seed);

}  // namespace strata::bench::bench_io
