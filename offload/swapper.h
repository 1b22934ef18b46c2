// The async swapper: moves tensors between host memory and the swap store with bounded
// in-flight bytes, and a streaming helper for passes over many swapped tensors.
//
// swap_out/swap_in return an IoHandle at once. A tensor whose memory is already 4 KiB-aligned and
// a multiple of 4 KiB goes to disk straight from (or into) the caller's memory; any other is
// staged through a slot of the BufferPool (copied on the caller's thread for swap_out, on the
// engine thread for swap_in). In-flight bytes are bounded by `max_inflight_bytes`: a call that
// would exceed the bound blocks until earlier transfers complete (one transfer larger than the
// bound runs alone). stream_keys() runs a function over keys in order, reading key i+1 ahead while
// the function works on key i and writing key i back behind it: the optimizer's sub-group loop.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <span>
#include <string>

#include "offload/buffer_pool.h"
#include "offload/io_engine.h"
#include "offload/swap_store.h"

namespace strata::offload {

struct SwapperOptions {
  std::size_t max_inflight_bytes = 256 * 1024 * 1024;
};

enum class WriteBack : std::uint8_t { Off, On };

class Swapper {
 public:
  Swapper(SwapStore& store, BufferPool& pool, const SwapperOptions& options = {});
  ~Swapper();  // waits for every transfer it started
  Swapper(const Swapper&) = delete;
  Swapper& operator=(const Swapper&) = delete;

  // `src` must stay valid until the handle completes when it is used directly (aligned case).
  IoHandle swap_out(const std::string& key, std::span<const std::byte> src);
  // `dst.size()` must equal the stored size of `key`; `dst` must stay valid until completion.
  IoHandle swap_in(const std::string& key, std::span<std::byte> dst);
  // Waits until nothing started by this swapper is in flight.
  void drain();
  std::size_t inflight_bytes() const;
  std::size_t peak_inflight_bytes() const;

  // For each key in order: reads it (key i+1 is read while work(i) runs), calls
  // work(i, bytes of key i), and with WriteBack::On writes the bytes back under the same key while
  // the next keys proceed. Uses three pool slots; each key must fit in one slot. Rethrows the first
  // I/O or work error after in-flight transfers finished.
  void stream_keys(std::span<const std::string> keys, WriteBack write_back,
                   const std::function<void(std::size_t index, std::span<std::byte> bytes)>& work);

 private:
  void acquire_budget(std::size_t bytes);
  void release_budget(std::size_t bytes);
  static bool direct_ok(const void* p, std::size_t bytes);

  SwapStore& store_;
  BufferPool& pool_;
  SwapperOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::size_t inflight_bytes_ = 0;
  std::size_t peak_inflight_bytes_ = 0;
  std::size_t inflight_ops_ = 0;
};

}  // namespace strata::offload
