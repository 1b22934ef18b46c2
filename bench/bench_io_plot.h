// `strata bench io --plot FILE.svg` (or .png): pictures of a run, drawn by gnuplot (Debian's
// gnuplot-nox, run as a program on a generated script with the data inline), not by hand: the
// bandwidth and the latency (p50, p99) of every interval of a --time/--interval run, one series
// per row, and the heat maps of --tune (GB/s by kernel request size x queue depth, reads and
// writes). Everything that can refuse (the file's kind and folder, gnuplot missing) is checked at
// start-up, before any I/O; the picture is written next to its name and renamed over it whole.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "bench/bench_io_workload.h"

namespace strata::bench::bench_io {

// --plot's checks at start-up: a name ending in .svg or .png in an existing folder, and gnuplot
// on PATH. Throws one ConfigError naming the flag, the problem and the fix.
void check_plot_output(const std::string& path);

// A request size as a plot's label: 256K, 4M.
std::string size_label(std::size_t bytes);

// Bandwidth and latency over time, one series per row of a timed run.
class IntervalPlot {
 public:
  // Starts the series of the next row (`label`: its rw, bs and qd).
  void begin_row(std::string label);
  void add(const IntervalReport& rep);
  bool empty() const;
  // Draws every series into `path` (checked by check_plot_output).
  void draw(const std::string& path) const;

 private:
  struct Point {
    double t_s = 0, gbps = 0, p50_us = 0, p99_us = 0;
  };
  struct Series {
    std::string label;
    std::vector<Point> points;
  };
  std::vector<Series> series_;
};

// --tune's grid: GB/s of reads and writes, [request size][queue depth].
struct TuneGrid {
  std::vector<std::size_t> request_bytes;
  std::vector<unsigned> queue_depths;
  std::vector<std::vector<double>> read_gbps, write_gbps;
};

// Two heat maps side by side (reads, writes), each cell labelled with its GB/s.
void draw_heat_maps(const std::string& path, const TuneGrid& grid);

}  // namespace strata::bench::bench_io
