// Block headers and checks of `strata bench io --verify` (Note [Bench verify] in
// bench/bench_io_verify.h).
#include "bench/bench_io_verify.h"

#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

#include "core/file_io.h"
#include "core/host_buffer.h"

namespace strata::bench::bench_io {
namespace {

// The header takes the first 64 bytes of a block; each 4 KiB sector carries a 16-byte tag right
// after that point (the first sector's after the header), so the tags never overlap it.
constexpr std::size_t kHeaderBytes = 64;
constexpr std::size_t kSectorBytes = 4096;

std::uint64_t payload_seed(std::uint64_t offset_bytes, std::uint64_t generation, std::uint64_t seed) {
  return seed ^ (offset_bytes * 0x9E3779B97F4A7C15ull) ^ (generation * 0xC2B2AE3D27D4EB4Full);
}

std::uint64_t payload_hash(std::span<const std::byte> block, const BlockHeader& h) {
  return XXH3_64bits_withSeed(block.data() + kHeaderBytes, block.size() - kHeaderBytes,
                              payload_seed(h.offset_bytes, h.generation, h.seed));
}

BlockHeader read_header(std::span<const std::byte> block) {
  BlockHeader h;
  std::memcpy(&h, block.data(), sizeof h);
  return h;
}

std::string describe(const BlockHeader& h) {
  return fmt::format("{{offset {}, generation {}, seed {:#x}}}", h.offset_bytes, h.generation, h.seed);
}

}  // namespace

void stamp_block(std::span<std::byte> block, std::uint64_t offset_bytes, std::uint64_t generation,
                 std::uint64_t seed) {
  for (std::size_t s = 0; s < block.size(); s += kSectorBytes) {
    const std::uint64_t t[2] = {offset_bytes + s, generation};
    std::memcpy(block.data() + s + kHeaderBytes, t, sizeof t);
  }
  BlockHeader h{kBlockMagic, offset_bytes, generation, seed, 0};
  h.payload_xxh3 = payload_hash(block, h);
  std::memcpy(block.data(), &h, sizeof h);
}

void check_block(std::span<const std::byte> block, std::uint64_t offset_bytes, std::uint64_t generation,
                 std::uint64_t seed, const std::string& path) {
  const BlockHeader found = read_header(block);
  const BlockHeader want{kBlockMagic, offset_bytes, generation, seed, 0};
  std::string what;
  if (found.magic != kBlockMagic) {
    what = "no block header (never written by this tool, or overwritten)";
  } else if (const std::uint64_t got = payload_hash(block, found); got != found.payload_xxh3) {
    what = fmt::format("payload checksum {:#018x}, header says {:#018x} (flipped or torn data)", got,
                       found.payload_xxh3);
  } else if (found.seed != seed) {
    what = "a block of another run (seed differs)";
  } else if (found.offset_bytes != offset_bytes) {
    what = fmt::format("misdirected write: the block written for offset {}", found.offset_bytes);
  } else if (found.generation < generation) {
    what = fmt::format("stale block: generation {} where {} was written (a lost write)", found.generation,
                       generation);
  } else if (found.generation != generation) {
    what = fmt::format("generation {} was never written (expected {})", found.generation, generation);
  } else {
    return;
  }
  throw VerifyError(fmt::format("--verify: block at offset {} of {} is wrong: {}; expected {}, found {}",
                                offset_bytes, path, what, describe(want), describe(found)));
}

void inject_fault(int fd, const std::string& path, const std::string& kind, std::uint64_t block,
                  std::size_t block_bytes, const VerifyMap& map, std::uint64_t seed) {
  const std::uint64_t blocks = map.generation.size();
  if (block >= blocks) {
    throw ConfigError(fmt::format("--inject-fault: block {} is past the file's {} blocks", block, blocks));
  }
  HostBufferOptions bo;
  bo.alignment_bytes = kSectorBytes;
  HostBuffer buf = HostBuffer::allocate(block_bytes, bo);
  std::span<std::byte> b(static_cast<std::byte*>(buf.data()), block_bytes);
  const std::uint64_t offset = block * block_bytes;
  if (kind == "flip") {
    read_exact(fd, b.data(), block_bytes, offset, path);
    b[block_bytes - 1] ^= std::byte{0x01};
  } else if (kind == "stale") {
    stamp_block(b, offset, map.generation[block] - 1, seed);
  } else if (kind == "misdirect") {
    read_exact(fd, b.data(), block_bytes, ((block + 1) % blocks) * block_bytes, path);
  } else {
    throw ConfigError(fmt::format("--inject-fault '{}': use flip, stale or misdirect[@BLOCK]", kind));
  }
  write_exact(fd, b.data(), block_bytes, offset, path);
  fsync_file(fd, path);
}

}  // namespace strata::bench::bench_io
