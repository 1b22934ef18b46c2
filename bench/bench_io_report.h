// What `strata bench io` prints (bench/bench_io.cc): a table line or a JSON object per row, and
// for timed runs a line per interval: a JSON line with --json (and to --interval-log), else a live
// line on a terminal (rewritten in place) or a plain line per interval when stdout is not one.
// Reads and writes are combined in the row's top-level figures and given apart as "read" and
// "write" when a row has both.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_io_runs.h"
#include "bench/bench_io_workload.h"

namespace strata::bench::bench_io {

// Combined figures of reads and writes over `seconds`, with "read" and "write" objects (over
// their own times, when given) when both ran.
nlohmann::json ops_json(const OpStats& read, const OpStats& write, double seconds, double read_seconds = 0,
                        double write_seconds = 0);

// One row's runs (one, or --pairs with fio beside them) and what to print beside them.
struct RowReport {
  Row row;
  std::size_t paths = 0;
  std::string engine_name;
  bool huge = false;
  std::vector<WorkloadResult> runs;
  std::vector<FioResult> fio;  // empty without --vs-fio
  nlohmann::json extra = nlohmann::json::object();  // row-specific keys (mix, read_qd, steady, ...)
  bool histogram = false;                          // add the latency histogram to the JSON
};

void print_table_header(bool vs_fio);
// Prints the row: the median run's figures with the median GB/s and, with fio, median ratio.
void print_row(const RowReport& r, bool json);

// Prints the intervals of one row's timed runs.
class IntervalPrinter {
 public:
  // `log`: also write JSON lines there (may be null). `row_keys`: rw, bs, qd of the row.
  IntervalPrinter(bool json, std::FILE* log, nlohmann::json row_keys);
  void print(const IntervalReport& rep);
  // Ends the live line (if one was drawn) before the row's summary.
  void finish();

 private:
  bool json_;
  std::FILE* log_;
  nlohmann::json row_keys_;
  bool live_ = false;
  bool drawn_ = false;
};

}  // namespace strata::bench::bench_io
