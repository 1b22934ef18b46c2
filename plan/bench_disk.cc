// Disk yardsticks for the benchmarks (plan/bench_disk.h).
#include "plan/bench_disk.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/host_buffer.h"
#include "plan/run_plan.h"
#include "offload/file.h"
#include "offload/io_engine.h"

namespace strata {

DiskPassSeconds time_disk_passes(const TrainConfig& cfg, const std::string& dir, std::uint64_t read_bytes,
                                 std::uint64_t write_bytes) {
  DiskPassSeconds out;
  if (read_bytes + write_bytes == 0) return out;
  using Clock = std::chrono::steady_clock;
  const std::string canonical = offload::check_directory(dir, "benchmark directory");
  const std::uint64_t size = (std::max(read_bytes, write_bytes) + (4u << 20) - 1) / (4u << 20) * (4u << 20);
  const std::string name = ".strata-bench-disk.bin";
  const std::string path = canonical + "/" + name;
  offload::UniqueFd fd = offload::open_inside(canonical, name, offload::Direct::On, offload::Truncate::Truncate);
  offload::preallocate(fd.get(), path, size);
  auto engine = offload::make_io_engine(io_engine_options(cfg.aio));
  const offload::FileId file = engine->register_file(fd.get(), path);
  const std::size_t piece = static_cast<std::size_t>(std::min<std::uint64_t>(size, 64u << 20));
  HostBufferOptions ho;
  ho.huge_pages = HugePages::Transparent;
  ho.alignment_bytes = 2u << 20;
  HostBuffer buffer = HostBuffer::allocate(piece, ho);
  std::memset(buffer.data(), 7, piece);
  const auto pass = [&](offload::IoOp op, std::uint64_t bytes) {
    std::vector<offload::IoRequest> requests;
    for (std::uint64_t off = 0; off < bytes; off += piece) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(piece, bytes - off));
      requests.push_back({op, file, off, buffer.data(), (n + 4095) / 4096 * 4096});
    }
    const auto t0 = Clock::now();
    engine->run(requests);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  pass(offload::IoOp::Write, size);  // every block written once before the timed passes
  out.write = pass(offload::IoOp::Write, write_bytes);
  out.read = pass(offload::IoOp::Read, read_bytes);
  engine->unregister_file(file);
  fd.reset();
  std::filesystem::remove(path);
  return out;
}

}  // namespace strata
