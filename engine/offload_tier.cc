// Host and NVMe tiers and the chunk pipeline (see engine/offload_tier.h, Note [Chunk pipeline] in
// engine/offload_tier.h).
#include "engine/offload_tier.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include <fmt/format.h>

#include "core/error.h"

namespace strata {

Home tier_home(Home home) {
  STRATA_CHECK(home != Home::Device, "a tier store holds host and NVMe arrays; this one's home is the device");
  return home;
}

TierStore::TierStore(offload::SwapStore* swap, HostMemoryPinner* pinner) : swap_(swap), pinner_(pinner) {}

TierStore::~TierStore() = default;

std::span<std::byte> TierStore::host(const std::string& key, std::size_t bytes, bool device_copies) {
  std::lock_guard lock(mutex_);
  auto it = host_.find(key);
  if (it == host_.end()) {
    HostBufferOptions o;
    o.pinner = device_copies ? pinner_ : nullptr;
    o.huge_pages = bytes >= (std::size_t{2} << 20) ? HugePages::Transparent : HugePages::Off;
    it = host_.emplace(key, HostBuffer::allocate(offload::SwapStore::padded(std::max<std::size_t>(bytes, 1)), o)).first;
    host_bytes_ += it->second.size_bytes();
    peak_host_bytes_ = std::max(peak_host_bytes_, host_bytes_);
  }
  STRATA_CHECK(it->second.size_bytes() >= bytes, "host array {} holds {} bytes, {} asked", key,
               it->second.size_bytes(), bytes);
  STRATA_CHECK(!device_copies || pinner_ == nullptr || it->second.pinned(),
               "host array {} was created pageable but a device stream copies it", key);
  return {static_cast<std::byte*>(it->second.data()), it->second.size_bytes()};
}

void TierStore::remove(const std::string& key) {
  {
    std::lock_guard lock(mutex_);
    auto it = host_.find(key);
    if (it != host_.end()) {
      host_bytes_ -= it->second.size_bytes();
      host_.erase(it);
      return;
    }
  }
  if (swap_ != nullptr && swap_->contains(key)) swap_->remove(key);
}

offload::SwapStore& TierStore::swap() const {
  STRATA_CHECK(swap_ != nullptr, "an NVMe array was used but no NVMe tier is configured");
  return *swap_;
}

void TierStore::write_now(const std::string& key, std::span<const std::byte> padded, std::size_t bytes) {
  swap().write(key, padded, bytes).wait();
  count_written(bytes);
  note_nvme_usage();
}

void TierStore::read_now(const std::string& key, std::span<std::byte> padded) {
  swap().read(key, padded).wait();
  count_read(swap().size_bytes(key));
}

void TierStore::note_nvme_usage() {
  if (swap_ == nullptr) return;
  const std::uint64_t used = swap_->capacity_bytes() - swap_->free_bytes();
  std::lock_guard lock(mutex_);
  peak_nvme_bytes_ = std::max(peak_nvme_bytes_, used);
}

TierIoStats TierStore::stats() const {
  TierIoStats s;
  s.nvme_bytes_read = read_bytes_.load();
  s.nvme_bytes_written = written_bytes_.load();
  std::lock_guard lock(mutex_);
  s.host_bytes = host_bytes_;
  s.peak_host_bytes = peak_host_bytes_;
  if (swap_ != nullptr) s.nvme_bytes = swap_->capacity_bytes() - swap_->free_bytes();
  s.peak_nvme_bytes = std::max<std::uint64_t>(peak_nvme_bytes_, s.nvme_bytes);
  return s;
}

ChunkPipeline::ChunkPipeline(TierStore& store, offload::BufferPool& pool) : store_(store), pool_(pool) {}

namespace {

bool in_slot(const ChunkField& f) { return f.kind == ChunkField::Scratch || f.tier == Home::Nvme; }

// A job whose reads were issued: its slot (shared with the write callbacks that give it back).
struct InFlight {
  std::size_t index = 0;
  std::shared_ptr<offload::BufferLease> lease;
  std::vector<std::span<std::byte>> spans;
  std::vector<offload::IoHandle> reads;
};

// Job i's fields: host arrays in place, NVMe and scratch fields carved from the slot `lease`, the
// NVMe reads started.
InFlight issue_job(TierStore& store, const ChunkJob& job, std::size_t i, offload::BufferLease lease) {
  InFlight f;
  f.index = i;
  if (lease.valid()) f.lease = std::make_shared<offload::BufferLease>(std::move(lease));
  std::size_t offset = 0;
  try {
    for (const auto& field : job.fields) {
      if (!in_slot(field)) {
        f.spans.push_back(store.host(field.key, field.bytes));
        continue;
      }
      const std::size_t padded = offload::SwapStore::padded(field.bytes);
      STRATA_CHECK(f.lease && offset + padded <= f.lease->size_bytes(),
                   "chunk job needs {} bytes of staging, the slot has {}", offset + padded,
                   f.lease ? f.lease->size_bytes() : 0);
      std::span<std::byte> s = f.lease->span().subspan(offset, padded);
      offset += padded;
      if (field.tier == Home::Nvme && (field.kind == ChunkField::Read || field.kind == ChunkField::Update)) {
        f.reads.push_back(store.swap().read(field.key, s));
        store.count_read(field.bytes);
      }
      f.spans.push_back(s);
    }
  } catch (...) {
    // A read already started still lands in the slot: let it finish before the slot goes back.
    for (auto& h : f.reads) (void)h.wait_error();
    throw;
  }
  return f;
}

// Runs an issued job once its reads landed, then starts its writes (write-behind: the slot returns
// to the pool when the last write from it completes) and drops the keys it consumed.
void run_job(TierStore& store, ChunkJob& job, InFlight& f, std::vector<offload::IoHandle>& writes) {
  for (auto& h : f.reads) h.wait();
  job.work(f.spans);
  if (job.also) {
    auto lease = f.lease;
    writes.push_back(job.also(f.spans, [lease](std::exception_ptr&) mutable { lease.reset(); }));
  }
  for (std::size_t k = 0; k < job.fields.size(); ++k) {
    const ChunkField& field = job.fields[k];
    if (field.tier != Home::Nvme || (field.kind != ChunkField::Update && field.kind != ChunkField::Write)) continue;
    auto lease = f.lease;
    writes.push_back(store.swap().write(field.key, f.spans[k], field.bytes,
                                        [lease](std::exception_ptr&) mutable { lease.reset(); }));
    store.count_written(field.bytes);
  }
  for (const auto& key : job.remove_after) store.remove(key);
}

}  // namespace

std::size_t ChunkPipeline::slot_bytes_needed(const ChunkJob& job) {
  std::size_t bytes = 0;
  for (const auto& f : job.fields) {
    if (in_slot(f)) bytes += offload::SwapStore::padded(f.bytes);
  }
  return bytes;
}

void ChunkPipeline::run(std::vector<ChunkJob>& jobs) {
  std::deque<InFlight> queue;
  std::vector<offload::IoHandle> writes;
  std::exception_ptr error;
  const std::size_t depth = std::max<std::size_t>(pool_.slot_count(), 1);

  auto needs_slot = [&](std::size_t i) { return slot_bytes_needed(jobs[i]) > 0; };

  std::size_t next = 0;
  while ((next < jobs.size() || !queue.empty()) && error == nullptr) {
    // Issue reads ahead: always at least one job; more while slots are free without blocking.
    while (next < jobs.size() && queue.size() < depth) {
      offload::BufferLease lease;
      if (needs_slot(next)) {
        if (queue.empty()) {
          lease = pool_.acquire();
        } else if (!pool_.try_acquire(&lease)) {
          break;
        }
      }
      try {
        queue.push_back(issue_job(store_, jobs[next], next, std::move(lease)));
      } catch (...) {
        error = std::current_exception();
        break;
      }
      ++next;
    }
    if (error != nullptr || queue.empty()) break;
    InFlight f = std::move(queue.front());
    queue.pop_front();
    try {
      run_job(store_, jobs[f.index], f, writes);
    } catch (...) {
      error = std::current_exception();
    }
  }
  // Let every read and write in flight finish before the slots and spans go away.
  for (auto& f : queue) {
    for (auto& h : f.reads) {
      auto e = h.wait_error();
      if (error == nullptr) error = e;
    }
  }
  queue.clear();
  for (auto& h : writes) {
    auto e = h.wait_error();
    if (error == nullptr) error = e;
  }
  store_.note_nvme_usage();
  if (error != nullptr) std::rethrow_exception(error);
}

}  // namespace strata
