// The test files and I/O buffers of `strata bench io` (bench/bench_io.cc): where the files live,
// the state of the blocks under them (Note [Bench file state]) and which pages back the buffers
// (Note [Bench buffers]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/host_buffer.h"
#include "core/units.h"
#include "offload/io_engine.h"
#include "bench/bench_io_runs.h"

namespace strata::bench::bench_io {

// Note [Bench file state]
// What a write costs on this kind of disk depends on the state of the blocks under the file, not
// only on the engine: blocks that were freed and discarded (ext4 mounted with `discard` passes the
// discard to the host, which drops its backing storage) must be allocated again by the host on
// the first write. On the virtio disk of Note [Request size and merging] in offload/uring_engine.cc, writes into
// written blocks and into blocks turned back into ext4 unwritten extents over host-allocated storage
// (FALLOC_FL_ZERO_RANGE) ran at the same speed, writes into fresh fallocated blocks after a hole
// punch (host allocation) ~20 % slower (docs/MEASUREMENTS.md, "Bench file state"). A freshly
// preallocated test file therefore handicaps whichever tool writes it first (Strata, in A B A B
// order). --file-state written (the default) writes every test file once in full before the first
// timed run, so Strata and fio both see written blocks; --file-state fallocated punches the file
// back to fresh preallocated blocks before every timed write run of both tools, to measure the
// first-write case fairly. Reads always need written data (reads of unwritten extents return zeros
// without touching the disk).
enum class FileState : std::uint8_t { Written, Fallocated };

FileState parse_file_state(const std::string& text);

// Writes every test file once in full (Note [Bench file state]).
void prefill(offload::IoEngine& engine, std::vector<TestFile>& files, std::span<std::byte> buffer,
             std::uint64_t file_bytes);

// Frees every block of the test files and preallocates fresh ones (Note [Bench file state]).
void reallocate(const std::vector<TestFile>& files, std::uint64_t file_bytes);

// One preallocated O_DIRECT test file of file_bytes in each directory, after checking that the
// directory supports O_DIRECT and has the room.
std::vector<TestFile> open_test_files(const std::vector<std::string>& dirs, std::uint64_t file_bytes);

enum class DeviceAccess : std::uint8_t { ReadOnly, Destructive };

// Raw block devices (--device), each used over its first file_bytes: opened O_DIRECT, read-only
// unless Destructive, which opens them exclusively (a mounted or otherwise claimed device is
// refused). Anything but a block device is refused with the fix.
std::vector<TestFile> open_test_devices(const std::vector<std::string>& devices, std::uint64_t file_bytes,
                                        DeviceAccess access);

// Note [Bench buffers]: the I/O buffers are one region on 2 MiB huge pages, as BufferPool's
// (Note [Request size and merging] in offload/uring_engine.cc: a request over a huge page is one
// segment), except for random writes of blocks of 16 KiB or less under --huge-pages auto, which
// use 4 KiB pages: on the disk of that Note those ran faster from 4 KiB pages, while random reads
// of 16 KiB, random writes of 64 KiB and every sequential row (whose requests coalesce across
// pages) ran faster from the huge page (docs/MEASUREMENTS.md, "Bench buffers"). Why small random
// writes prefer 4 KiB pages we do not know: the buffers are registered (fixed), so the kernel
// does not pin pages per request. `huge_pages` in the JSON rows says which backing was asked for
// (THP through madvise; the kernel may decline).
class BenchBuffers {
 public:
  // huge_always: --huge-pages on or off for every row; nullopt for auto.
  BenchBuffers(std::size_t buffer_bytes, std::optional<bool> huge_always)
      : buffer_bytes_(buffer_bytes), huge_always_(huge_always) {}

  bool huge_for(const Row& row) const {
    return huge_always_.value_or(!(row.rw == "randwrite" && row.bs_bytes <= 16 * KiB));
  }

  // The buffer on huge or 4 KiB pages, allocated when a row first needs it.
  std::span<std::byte> get(bool huge) {
    HostBuffer& b = buffers_[huge ? 1 : 0];
    if (b.size_bytes() == 0) {
      HostBufferOptions bo;
      bo.huge_pages = huge ? HugePages::Transparent : HugePages::Off;
      bo.alignment_bytes = huge ? 2 * MiB : 4096;
      b = HostBuffer::allocate(buffer_bytes_, bo);
      std::memset(b.data(), 0x5C, b.size_bytes());  // fault every page in before timing
    }
    return std::span<std::byte>(static_cast<std::byte*>(b.data()), b.size_bytes());
  }

 private:
  std::size_t buffer_bytes_;
  std::optional<bool> huge_always_;
  HostBuffer buffers_[2];  // [0]: 4 KiB pages, [1]: huge pages
};


}  // namespace strata::bench::bench_io
