// The swap store: named tensors kept in preallocated swap files on NVMe.
//
// One swap file per directory (one directory per drive), created 0600 inside the directory the
// user named, preallocated with fallocate and removed when the store closes (swap data does not
// outlive the run). A key maps to extents: 4 KiB-aligned byte ranges of one file each, handed out
// by an ExtentAllocator per file and spread over the files by plan_stripes. Every extent carries
// an xxHash3 of its bytes, checked on read (on by default): a flipped bit on disk becomes a
// FormatError naming the key, the file and the offset instead of wrong numbers in training.
// Reads and writes are asynchronous through the IoEngine and take 4 KiB-aligned buffers padded to
// a multiple of 4 KiB (the engine's chunk pipeline stages through BufferPool slots,
// engine/offload_tier.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/run_lock.h"
#include "offload/extent_allocator.h"
#include "offload/file.h"
#include "offload/io_engine.h"

namespace strata::offload {

enum class Verify : std::uint8_t { Off, On };

struct SwapStoreOptions {
  std::vector<std::string> dirs;          // one swap file in each
  std::uint64_t capacity_bytes = 0;       // in total, split evenly over the directories
  std::string file_name = "strata-swap.bin";
  Verify verify = Verify::On;
  std::uint64_t stripe_min_bytes = 1024 * 1024;  // per file; smaller tensors are not split
  bool keep_files = false;                // leave the swap files on close (tests, debugging)
};

struct SwapExtent {
  unsigned file = 0;                  // index into the store's files
  std::uint64_t file_offset_bytes = 0;
  std::uint64_t length_bytes = 0;     // on disk, a multiple of 4 KiB
  std::uint64_t key_offset_bytes = 0; // where it starts within the tensor
  std::uint64_t data_bytes = 0;       // meaningful bytes (the tail extent is padded)
  std::uint64_t checksum = 0;         // XXH3_64bits of the meaningful bytes
};

class SwapStore {
 public:
  // Checks every directory (exists, writable, O_DIRECT works, enough free space: errors name
  // the directory and the numbers), creates and preallocates the swap files and registers them
  // with `engine`, which must outlive the store.
  SwapStore(IoEngine& engine, SwapStoreOptions options);
  ~SwapStore();
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  static std::uint64_t padded(std::uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; }
  // The size of each of the `dirs` swap files a store of `capacity_bytes` preallocates.
  static std::uint64_t file_bytes(std::uint64_t capacity_bytes, std::size_t dirs);

  // Stores `length_bytes` of `padded` under `key`, replacing any previous value (the old one is
  // gone at once; the new one becomes readable when the handle completes successfully). `padded`
  // must be 4 KiB-aligned, at least padded(length_bytes) long, and stay valid until completion.
  // A full store throws OutOfMemoryError with the numbers; a failed write (EIO, ENOSPC) fails
  // the handle, and the key is then absent while every other key stays readable.
  // `then` (optional) runs on the engine thread after the store's bookkeeping, before waiters wake.
  IoHandle write(const std::string& key, std::span<const std::byte> padded, std::size_t length_bytes,
                 IoCallback then = {});
  // Reads the value of `key` into `padded` (4 KiB-aligned, at least padded(size_bytes(key))).
  // With Verify::On the handle fails with FormatError on a checksum mismatch.
  IoHandle read(const std::string& key, std::span<std::byte> padded, IoCallback then = {}) const;
  void remove(const std::string& key);

  bool contains(const std::string& key) const;
  std::size_t size_bytes(const std::string& key) const;  // throws ConfigError for an unknown key
  std::vector<SwapExtent> extents(const std::string& key) const;
  const std::string& file_path(unsigned file) const { return files_.at(file).path; }
  std::size_t file_count() const { return files_.size(); }
  std::uint64_t capacity_bytes() const;
  std::uint64_t free_bytes() const;
  IoEngine& engine() const { return engine_; }

 private:
  struct File {
    std::string dir;
    std::string path;
    RunLock lock;  // held while the file exists (Note [Run locks], core/run_lock.h); released after the unlink
    UniqueFd fd;
    FileId id = -1;
    std::unique_ptr<ExtentAllocator> allocator;
  };
  struct Entry {
    std::size_t length_bytes = 0;
    std::vector<SwapExtent> extents;
  };
  void verify_extents(const std::string& key, const std::byte* base, const std::vector<SwapExtent>& extents,
                      std::exception_ptr& error) const;
  void release_locked(const std::vector<SwapExtent>& extents);
  void check_buffer(const std::string& key, const void* data, std::size_t have, std::size_t need, const char* what) const;

  IoEngine& engine_;
  SwapStoreOptions options_;
  std::vector<File> files_;
  mutable std::mutex mutex_;
  std::map<std::string, Entry> entries_;
};

}  // namespace strata::offload
