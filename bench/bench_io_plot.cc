// `strata bench io --plot` (bench/bench_io_plot.h): gnuplot scripts with their data inline.
#include "bench/bench_io_plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "train/output_file.h"

namespace strata::bench::bench_io {
namespace {

enum class PlotKind { Svg, Png };

PlotKind kind_of(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  return ext == ".png" ? PlotKind::Png : PlotKind::Svg;
}

bool gnuplot_on_path() {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "";
  while (!dirs.empty()) {
    const std::size_t colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    dirs = colon == std::string_view::npos ? std::string_view{} : dirs.substr(colon + 1);
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/gnuplot";
    if (::access(candidate.c_str(), X_OK) == 0) return true;
  }
  return false;
}

// A gnuplot single-quoted string: a quote inside is written twice.
std::string gp_string(std::string_view text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string terminal(const std::string& path, int width, int height) {
  if (kind_of(path) == PlotKind::Png) return fmt::format("set terminal pngcairo size {},{} noenhanced font 'sans,10'\n", width, height);
  return fmt::format("set terminal svg size {},{} noenhanced font 'sans,10' background '#ffffff'\n", width, height);
}

// Runs gnuplot on `script` (which draws into `tmp`), then renames `tmp` over `path`.
void run_gnuplot(const std::string& script, const std::string& tmp, const std::string& path) {
  std::FILE* pipe = ::popen("gnuplot", "w");
  if (pipe == nullptr) throw IoError(fmt::format("--plot {}: cannot start gnuplot ({})", path, errno_text(errno)), errno);
  const std::size_t written = std::fwrite(script.data(), 1, script.size(), pipe);
  const int status = ::pclose(pipe);
  const bool ok = written == script.size() && status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
                  std::filesystem::exists(tmp);
  if (!ok) {
    std::filesystem::remove(tmp);
    throw Error(fmt::format("--plot {}: gnuplot failed (status {}); its messages are above", path, status));
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

std::string size_label(std::size_t bytes) {
  if (bytes % MiB == 0) return fmt::format("{}M", bytes / MiB);
  if (bytes % KiB == 0) return fmt::format("{}K", bytes / KiB);
  return std::to_string(bytes);
}

void check_plot_output(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext != ".svg" && ext != ".png") {
    throw ConfigError(fmt::format("--plot {}: the picture's kind comes from its name; end it in .svg or .png", path));
  }
  if (path.find('\n') != std::string::npos) throw ConfigError("--plot: the path holds a newline; choose another name");
  train::check_output_path(path, "--plot", train::OutputWrite::Replaced);
  if (!gnuplot_on_path()) {
    throw ConfigError(fmt::format("--plot {}: gnuplot is not installed (strata draws its plots with it); install the "
                                  "Debian package gnuplot-nox (sudo apt-get install gnuplot-nox; tools/setup.sh "
                                  "installs it), or drop --plot",
                                  path));
  }
}

void IntervalPlot::begin_row(std::string label) { series_.push_back(Series{std::move(label), {}}); }

void IntervalPlot::add(const IntervalReport& rep) {
  STRATA_CHECK(!series_.empty(), "IntervalPlot::add before begin_row");
  LatencyHistogram latency = rep.read.latency;
  latency.merge(rep.write.latency);
  Point p;
  p.t_s = rep.end_s;
  p.gbps = rep.seconds > 0 ? static_cast<double>(rep.read.bytes + rep.write.bytes) / rep.seconds / 1e9 : 0;
  p.p50_us = latency.percentile_us(50);
  p.p99_us = latency.percentile_us(99);
  series_.back().points.push_back(p);
}

bool IntervalPlot::empty() const {
  for (const Series& s : series_) {
    if (!s.points.empty()) return false;
  }
  return true;
}

void IntervalPlot::draw(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  std::string script = terminal(path, 960, 720);
  script += fmt::format("set output {}\n", gp_string(tmp));
  std::vector<std::size_t> drawn;  // series with points, each one data block $dN
  for (std::size_t i = 0; i < series_.size(); ++i) {
    if (series_[i].points.empty()) continue;
    drawn.push_back(i);
    script += fmt::format("$d{} << EOD\n", i);
    for (const Point& p : series_[i].points) {
      // A latency of 0 (no request completed) has no place on a log axis: left out (NaN).
      const auto us = [](double v) { return v > 0 ? fmt::format("{:.3f}", v) : std::string("NaN"); };
      script += fmt::format("{:.6f} {:.6f} {} {}\n", p.t_s, p.gbps, us(p.p50_us), us(p.p99_us));
    }
    script += "EOD\n";
  }
  script +=
      "set multiplot layout 2,1 title 'strata bench io: bandwidth and latency per interval'\n"
      "set grid\nset key outside right top\nset xlabel 'time (s)'\nset ylabel 'GB/s'\nset yrange [0:*]\n";
  std::string bandwidth, latency;
  for (std::size_t i : drawn) {
    const std::string& label = series_[i].label;
    bandwidth += fmt::format("{}$d{} using 1:2 with linespoints title {}", bandwidth.empty() ? "" : ", ", i, gp_string(label));
    latency += fmt::format("{}$d{} using 1:3 with linespoints title {}, $d{} using 1:4 with linespoints title {}",
                           latency.empty() ? "" : ", ", i, gp_string(label + " p50"), i, gp_string(label + " p99"));
  }
  script += "plot " + bandwidth + "\n";
  script += "set ylabel 'latency (us)'\nset yrange [*:*]\nset logscale y\nplot " + latency + "\nunset multiplot\n";
  run_gnuplot(script, tmp, path);
}

void draw_heat_maps(const std::string& path, const TuneGrid& grid) {
  const std::string tmp = path + ".tmp";
  std::string script = terminal(path, 1100, 480);
  script += fmt::format("set output {}\n", gp_string(tmp));
  std::string xtics, ytics;
  for (std::size_t q = 0; q < grid.queue_depths.size(); ++q) {
    xtics += fmt::format("{}'{}' {}", q == 0 ? "" : ", ", grid.queue_depths[q], q);
  }
  for (std::size_t s = 0; s < grid.request_bytes.size(); ++s) {
    ytics += fmt::format("{}'{}' {}", s == 0 ? "" : ", ", size_label(grid.request_bytes[s]), s);
  }
  const auto block = [&](const char* name, const std::vector<std::vector<double>>& values) {
    std::string b = fmt::format("${} << EOD\n", name);
    for (std::size_t s = 0; s < values.size(); ++s) {
      for (std::size_t q = 0; q < values[s].size(); ++q) b += fmt::format("{} {} {:.4f}\n", q, s, values[s][q]);
      b += "\n";
    }
    return b + "EOD\n";
  };
  script += block("reads", grid.read_gbps) + block("writes", grid.write_gbps);
  script += fmt::format(
      "set multiplot layout 1,2 title 'strata bench io --tune: GB/s by kernel request size x queue depth'\n"
      "set xtics ({})\nset ytics ({})\nset xlabel 'queue depth'\nset ylabel 'request size'\n"
      "set cblabel 'GB/s'\nset palette rgbformulae 22,13,10\nset key off\nset tics out\n"
      "set xrange [-0.5:{}]\nset yrange [-0.5:{}]\n",
      xtics, ytics, static_cast<double>(grid.queue_depths.size()) - 0.5,
      static_cast<double>(grid.request_bytes.size()) - 0.5);
  for (const char* name : {"reads", "writes"}) {
    script += fmt::format(
        "set title '{0}'\nplot ${0} using 1:2:3 with image title '{0} GB/s', "
        "${0} using 1:2:(sprintf('%.2f', $3)) with labels title '{0} figures'\n",
        name);
  }
  script += "unset multiplot\n";
  run_gnuplot(script, tmp, path);
}

}  // namespace strata::bench::bench_io
