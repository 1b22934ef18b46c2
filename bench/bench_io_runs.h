// A row of `strata bench io` (bench/bench_io.cc), its test files, and the row run through fio with
// the same parameters on the same files. Strata's side is bench/bench_io_workload.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "offload/file.h"
#include "offload/io_engine.h"

namespace strata::bench::bench_io {

struct Row {
  std::string rw;
  std::size_t bs_bytes = 0;
  unsigned qd = 0;
};

struct TestFile {
  std::string dir;
  std::string path;
  offload::UniqueFd fd;
  offload::FileId id = -1;
  bool device = false;  // a raw block device (--device): never removed, never reallocated
};

// One fio job per file and part: a whole row is one part over the whole file; readers+writers
// rows are two parts at once (fio's own jobs), each on its half with its own queue depth.
struct FioPart {
  std::string rw;  // read, write, randread, randwrite, randrw
  unsigned qd = 1;
  std::uint64_t offset_bytes = 0;
  std::uint64_t bytes = 0;
};

// What fio runs: the parts, the read share of randrw (--rwmixread), a time (0: one pass of each
// part), extra options from --fio-option, and Strata's scale: jobs per file (numjobs, each on its
// slice of the part as Strata's), their CPUs (cpus[file], split one per job), polled completions
// (hipri), read-only access to a device, and the buffer memory (fio's --mem).
struct FioJob {
  std::vector<FioPart> parts;
  unsigned read_percent = 100;
  double time_s = 0;
  std::vector<std::string> extra_options;
  unsigned jobs = 1;
  std::vector<std::vector<int>> cpus;
  bool iopoll = false;
  bool readonly = false;
  std::string mem = "malloc";
};

// Note [Bench equal memory]
// The pages under the I/O buffers are most of the difference between Strata and fio on a disk
// like that of Note [Request size and merging] (offload/uring_engine.cc): Strata's buffers are on
// 2 MiB pages (THP, Note [Bench buffers] in bench/bench_io_files.h), fio's malloc'd ones on 4 KiB
// pages. fio cannot ask for THP; its huge-page kind is hugetlb (--mem=shmhuge), which needs pages
// reserved in /proc/sys/vm/nr_hugepages. So --fio-mem same (the default) gives fio shmhuge when
// Strata's row is on huge pages and enough hugetlb pages are free, and otherwise moves Strata's row
// to 4 KiB pages, as fio's: either way both sides use the same page size and the ratio compares
// engines. --fio-mem malloc (or any fio --mem kind) sets fio's memory and leaves Strata's as it is;
// the row then says the memory differs.
struct FioMemory {
  std::string fio_mem;     // fio's --mem
  bool strata_huge = true;  // Strata's buffers on huge pages
  bool equal = true;        // both sides on the same page size
  std::string note;         // why Strata moved to 4 KiB pages, if it did
};

// The memory of both sides for a row (Note [Bench equal memory]). mode: "same" or a fio --mem
// kind; huge: Strata's choice for the row; hugetlb_bytes: what fio's buffers need on huge pages.
FioMemory choose_fio_memory(const std::string& mode, bool huge, std::size_t hugetlb_bytes);

struct FioResult {
  double gbps = 0;         // reads + writes, 1e9 bytes/s
  double cpu_s_per_gb = 0;  // fio's usr + sys CPU over its run, per GB moved
  // Per operation that ran ("read", "write"): p50_us, p99_us, p99_9_us, max_us, mean_us of fio's
  // total latency (lat: queued to completion, as Strata's figures), and the same in "slat"
  // (queued to submitted) and "clat" (submitted to completion).
  nlohmann::json latency = nlohmann::json::object();
};

// Runs fio with the row's parameters on the same files.
FioResult run_fio(const std::vector<TestFile>& files, const Row& row, const FioJob& job);

}  // namespace strata::bench::bench_io
