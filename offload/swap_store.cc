// The swap store (see offload/swap_store.h).
#include "offload/swap_store.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/units.h"
#include "offload/striping.h"

namespace strata::offload {

SwapStore::SwapStore(IoEngine& engine, SwapStoreOptions options) : engine_(engine), options_(std::move(options)) {
  if (options_.dirs.empty()) throw ConfigError("swap store: no directory given; set the NVMe swap path");
  if (options_.capacity_bytes == 0) throw ConfigError("swap store: capacity is 0 bytes; give a size");
  const std::size_t n = options_.dirs.size();
  const std::uint64_t per_file_bytes = file_bytes(options_.capacity_bytes, n);
  path_inside("/", options_.file_name);  // refuses names with '/' or '..' before anything is created
  try {
    for (const std::string& d : options_.dirs) {
      File f;
      f.dir = check_directory(d, "swap directory");
      for (const File& other : files_) {
        if (other.dir == f.dir) {
          throw ConfigError(fmt::format("swap directory {} is listed twice; give each drive once", f.dir));
        }
      }
      if (auto why = probe_direct_io(f.dir); !why.empty()) {
        throw ConfigError(fmt::format("swap directory {} does not support O_DIRECT ({}); use a directory on a local "
                                      "drive (not tmpfs or a network file system)",
                                      f.dir, why));
      }
      const std::uint64_t free = offload::free_bytes(f.dir);
      if (free < per_file_bytes) {
        throw ConfigError(fmt::format("swap directory {} has {} free but its swap file needs {} ({} over {} "
                                      "director{}); free space, add drives or lower the swap size",
                                      f.dir, format_bytes(free), format_bytes(per_file_bytes),
                                      format_bytes(options_.capacity_bytes), n, n == 1 ? "y" : "ies"));
      }
      f.path = path_inside(f.dir, options_.file_name);
      // Another run's swap file of the same name would be truncated under it: refuse instead.
      f.lock = RunLock::acquire(f.path, "swap file");
      f.fd = open_inside(f.dir, options_.file_name, Direct::On, Truncate::Truncate);
      preallocate(f.fd.get(), f.path, per_file_bytes);
      f.allocator = std::make_unique<ExtentAllocator>(per_file_bytes);
      f.id = engine_.register_file(f.fd.get(), f.path);
      files_.push_back(std::move(f));
    }
  } catch (...) {
    for (File& f : files_) {
      if (f.id >= 0) engine_.unregister_file(f.id);
      if (!options_.keep_files) ::unlink(f.path.c_str());
    }
    throw;
  }
  spdlog::debug("swap store: {} in {} file(s), checksums {}", format_bytes(options_.capacity_bytes), files_.size(),
                options_.verify == Verify::On ? "on" : "off");
}

std::uint64_t SwapStore::file_bytes(std::uint64_t capacity_bytes, std::size_t dirs) {
  if (dirs == 0) return 0;
  const std::uint64_t per_file = (capacity_bytes + dirs - 1) / dirs;
  return (per_file + 4095) / 4096 * 4096;
}

SwapStore::~SwapStore() {
  for (File& f : files_) {
    engine_.unregister_file(f.id);
    f.fd.reset();
    if (!options_.keep_files) ::unlink(f.path.c_str());
  }
}

void SwapStore::check_buffer(const std::string& key, const void* data, std::size_t have, std::size_t need,
                             const char* what) const {
  if (reinterpret_cast<std::uintptr_t>(data) % 4096 != 0) {
    throw ConfigError(fmt::format("swap {} of '{}': the buffer at {} is not 4 KiB-aligned (O_DIRECT needs it); "
                                  "use a HostBuffer or a BufferPool slot",
                                  what, key, data));
  }
  if (have < need) {
    throw ConfigError(fmt::format("swap {} of '{}': the buffer holds {} bytes but {} are needed (the size padded to "
                                  "4 KiB)",
                                  what, key, have, need));
  }
}

void SwapStore::release_locked(const std::vector<SwapExtent>& extents) {
  for (const SwapExtent& e : extents) {
    files_[e.file].allocator->release(ByteRange{e.file_offset_bytes, e.length_bytes});
  }
}

IoHandle SwapStore::write(const std::string& key, std::span<const std::byte> padded_data, std::size_t length_bytes,
                          IoCallback then) {
  if (length_bytes == 0) throw ConfigError(fmt::format("swap write of '{}': the tensor is empty", key));
  const std::uint64_t need = padded(length_bytes);
  check_buffer(key, padded_data.data(), padded_data.size(), need, "write");

  std::vector<SwapExtent> extents;
  {
    std::lock_guard lock(mutex_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      release_locked(it->second.extents);
      entries_.erase(it);
    }
    std::vector<std::uint64_t> free(files_.size());
    for (std::size_t i = 0; i < files_.size(); ++i) free[i] = files_[i].allocator->free_bytes();
    const std::vector<std::uint64_t> plan = plan_stripes(need, free, options_.stripe_min_bytes);
    std::uint64_t key_offset = 0;
    for (std::size_t i = 0; i < files_.size(); ++i) {
      if (plan[i] == 0) continue;
      std::vector<ByteRange> ranges = files_[i].allocator->allocate(plan[i]);
      if (ranges.empty()) {
        release_locked(extents);
        std::uint64_t total_free = 0;
        std::uint64_t total_cap = 0;
        for (const File& f : files_) {
          total_free += f.allocator->free_bytes();
          total_cap += f.allocator->capacity_bytes();
        }
        throw OutOfMemoryError(fmt::format("swap store full: '{}' needs {} ({} in {}), but {} of {} are free; raise "
                                           "the NVMe swap size or add a swap directory",
                                           key, format_bytes(need), format_bytes(plan[i]), files_[i].path,
                                           format_bytes(total_free), format_bytes(total_cap)));
      }
      for (const ByteRange& r : ranges) {
        SwapExtent e;
        e.file = static_cast<unsigned>(i);
        e.file_offset_bytes = r.offset_bytes;
        e.length_bytes = r.length_bytes;
        e.key_offset_bytes = key_offset;
        e.data_bytes = key_offset >= length_bytes ? 0 : std::min<std::uint64_t>(r.length_bytes, length_bytes - key_offset);
        extents.push_back(e);
        key_offset += r.length_bytes;
      }
    }
  }
  std::vector<IoRequest> requests;
  requests.reserve(extents.size());
  for (SwapExtent& e : extents) {
    const std::byte* p = padded_data.data() + e.key_offset_bytes;
    e.checksum = XXH3_64bits(p, e.data_bytes);
    requests.push_back(IoRequest{IoOp::Write, files_[e.file].id, e.file_offset_bytes, const_cast<std::byte*>(p),
                                 e.length_bytes});
  }
  auto on_done = [this, key, length_bytes, extents, then = std::move(then)](std::exception_ptr& error) {
    {
      std::lock_guard lock(mutex_);
      if (error) {
        release_locked(extents);  // the key stays absent; other keys are untouched
      } else {
        entries_[key] = Entry{length_bytes, extents};
      }
    }
    if (then) then(error);
  };
  try {
    return engine_.submit(requests, on_done);
  } catch (...) {
    std::lock_guard lock(mutex_);
    release_locked(extents);
    throw;
  }
}

IoHandle SwapStore::read(const std::string& key, std::span<std::byte> padded_data, IoCallback then) const {
  Entry entry;
  {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      throw ConfigError(fmt::format("swap read of '{}': no such tensor in the swap store (never written, removed, or "
                                    "its write failed)",
                                    key));
    }
    entry = it->second;
  }
  check_buffer(key, padded_data.data(), padded_data.size(), padded(entry.length_bytes), "read");
  std::vector<IoRequest> requests;
  requests.reserve(entry.extents.size());
  for (const SwapExtent& e : entry.extents) {
    requests.push_back(
        IoRequest{IoOp::Read, files_[e.file].id, e.file_offset_bytes, padded_data.data() + e.key_offset_bytes, e.length_bytes});
  }
  const bool check = options_.verify == Verify::On;
  std::byte* base = padded_data.data();
  IoCallback verify = [this, key, base, check, extents = std::move(entry.extents),
                       then = std::move(then)](std::exception_ptr& error) {
    if (check && !error) verify_extents(key, base, extents, error);
    if (then) then(error);
  };
  return engine_.submit(requests, std::move(verify));
}

void SwapStore::verify_extents(const std::string& key, const std::byte* base, const std::vector<SwapExtent>& extents,
                               std::exception_ptr& error) const {
      for (std::size_t i = 0; i < extents.size(); ++i) {
        const SwapExtent& e = extents[i];
        const std::uint64_t got = XXH3_64bits(base + e.key_offset_bytes, e.data_bytes);
        if (got != e.checksum) {
          error = std::make_exception_ptr(FormatError(fmt::format(
              "swap data of '{}' is corrupt: extent {} of {} ({} bytes at offset {} of {}) has checksum {:016x}, "
              "written as {:016x}; the drive or the swap file was modified, so the data cannot be trusted",
              key, i + 1, extents.size(), e.data_bytes, e.file_offset_bytes, files_[e.file].path, got, e.checksum)));
          return;
        }
      }
}

void SwapStore::remove(const std::string& key) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  release_locked(it->second.extents);
  entries_.erase(it);
}

bool SwapStore::contains(const std::string& key) const {
  std::lock_guard lock(mutex_);
  return entries_.count(key) != 0;
}

std::size_t SwapStore::size_bytes(const std::string& key) const {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) throw ConfigError(fmt::format("swap store has no tensor '{}'", key));
  return it->second.length_bytes;
}

std::vector<SwapExtent> SwapStore::extents(const std::string& key) const {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) throw ConfigError(fmt::format("swap store has no tensor '{}'", key));
  return it->second.extents;
}

std::uint64_t SwapStore::capacity_bytes() const {
  std::lock_guard lock(mutex_);
  std::uint64_t t = 0;
  for (const File& f : files_) t += f.allocator->capacity_bytes();
  return t;
}

std::uint64_t SwapStore::free_bytes() const {
  std::lock_guard lock(mutex_);
  std::uint64_t t = 0;
  for (const File& f : files_) t += f.allocator->free_bytes();
  return t;
}

}  // namespace strata::offload
