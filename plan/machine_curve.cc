// Drive curves of machine files (plan/machine_curve.h, Note [Drive curves] in plan/machine_curve.h): reading, writing
// and interpolating them.
#include "plan/machine_curve.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "config/config_reader.h"

namespace strata {
namespace {

constexpr std::string_view kCurveForm =
    "give {\"request_sizes\": [262144, 1048576], \"queue_depths\": [4, 32], \"read_gbps\": [[r, r], [r, r]], "
    "\"write_gbps\": [[w, w], [w, w]]}: one row per request size, one column per depth (strata bench io --tune "
    "--machine-file writes it)";

// Where `x` falls on the ascending axis `xs` (log2 values): the lower index and the weight of the
// upper one, clamped to the ends.
struct Bracket {
  std::size_t lo = 0;
  double t = 0;
};

Bracket bracket(const std::vector<double>& xs, double x) {
  if (xs.size() == 1 || x <= xs.front()) return {0, 0};
  if (x >= xs.back()) return {xs.size() - 2, 1};
  const std::size_t hi = static_cast<std::size_t>(std::upper_bound(xs.begin(), xs.end(), x) - xs.begin());
  const std::size_t lo = hi - 1;
  return {lo, (x - xs[lo]) / (xs[hi] - xs[lo])};
}

template <class T>
std::vector<double> log2_axis(const std::vector<T>& values) {
  std::vector<double> out;
  for (T v : values) out.push_back(std::log2(static_cast<double>(v)));
  return out;
}

// An ascending list of positive whole numbers (request sizes in bytes or byte strings; depths).
template <class T>
std::vector<T> read_axis(ConfigReader& r, const char* key, bool bytes) {
  nlohmann::json list;
  r.get_raw(key, &list);
  if (!list.is_array() || list.empty()) r.fail(key, fmt::format("missing or not a list; {}", kCurveForm));
  std::vector<T> out;
  for (const nlohmann::json& v : list) {
    std::uint64_t value = 0;
    std::size_t parsed = 0;
    if (v.is_number_integer() && v.get<std::int64_t>() >= 0) {  // a C++-built value is signed
      value = v.get<std::uint64_t>();
    } else if (bytes && v.is_string() && parse_bytes(v.get<std::string>(), &parsed)) {
      value = parsed;
    } else {
      r.fail(key, fmt::format("{} is not a whole number{}; {}", v.dump(), bytes ? " of bytes" : "", kCurveForm));
    }
    if (bytes && (value < 4096 || value % 4096 != 0 || value > (std::uint64_t{64} << 20))) {
      r.fail(key, fmt::format("{} is not a multiple of 4 KiB up to 64 MiB (a kernel request's size)", value));
    }
    if (!bytes && (value < 1 || value > 65536)) r.fail(key, fmt::format("{} is not a depth of 1..65536", value));
    if (!out.empty() && value <= out.back()) r.fail(key, fmt::format("{} after {}: the list must ascend", value, out.back()));
    out.push_back(static_cast<T>(value));
  }
  return out;
}

std::vector<std::vector<double>> read_grid(ConfigReader& r, const char* key, std::size_t rows, std::size_t columns,
                                           double max_gbps) {
  nlohmann::json rows_json;
  r.get_raw(key, &rows_json);
  const auto shape = [&] {
    r.fail(key, fmt::format("must hold {} rows (one per request size) of {} figures (one per queue depth); {}", rows,
                            columns, kCurveForm));
  };
  if (!rows_json.is_array() || rows_json.size() != rows) shape();
  std::vector<std::vector<double>> grid;
  for (const nlohmann::json& row : rows_json) {
    if (!row.is_array() || row.size() != columns) shape();
    std::vector<double>& out = grid.emplace_back();
    for (const nlohmann::json& v : row) {
      const double gbps = v.is_number() ? v.get<double>() : -1;
      if (!(gbps > 0 && gbps <= max_gbps)) {
        r.fail(key, fmt::format("{} is not a bandwidth above 0, up to {} GB/s (a figure in another unit?)", v.dump(),
                                max_gbps));
      }
      out.push_back(gbps);
    }
  }
  return grid;
}

double grid_best(const std::vector<std::vector<double>>& grid) {
  double best = 0;
  for (const auto& row : grid) best = std::max(best, *std::max_element(row.begin(), row.end()));
  return best;
}

}  // namespace

double DriveCurve::gbps(DriveOp op, std::uint64_t request, double queue_depth) const {
  STRATA_CHECK(!empty() && request > 0 && queue_depth > 0, "DriveCurve::gbps on an empty curve or at {} bytes, depth {}",
               request, queue_depth);
  const auto& grid = op == DriveOp::Read ? read_gbps : write_gbps;
  const Bracket s = bracket(log2_axis(request_bytes), std::log2(static_cast<double>(request)));
  const Bracket q = bracket(log2_axis(queue_depths), std::log2(queue_depth));
  const std::size_t s_hi = std::min(s.lo + 1, request_bytes.size() - 1);
  const std::size_t q_hi = std::min(q.lo + 1, queue_depths.size() - 1);
  const auto along_depth = [&](std::size_t row) {
    return grid[row][q.lo] * (1 - q.t) + grid[row][q_hi] * q.t;
  };
  return along_depth(s.lo) * (1 - s.t) + along_depth(s_hi) * s.t;
}

double DriveCurve::best_gbps(DriveOp op) const { return grid_best(op == DriveOp::Read ? read_gbps : write_gbps); }

DriveCurve parse_drive_curve(ConfigReader r, double max_gbps) {
  DriveCurve c;
  c.request_bytes = read_axis<std::uint64_t>(r, "request_sizes", true);
  c.queue_depths = read_axis<unsigned>(r, "queue_depths", false);
  c.read_gbps = read_grid(r, "read_gbps", c.request_bytes.size(), c.queue_depths.size(), max_gbps);
  c.write_gbps = read_grid(r, "write_gbps", c.request_bytes.size(), c.queue_depths.size(), max_gbps);
  r.finish();
  return c;
}

nlohmann::json drive_curve_to_json(const DriveCurve& c) {
  return {{"request_sizes", c.request_bytes},
          {"queue_depths", c.queue_depths},
          {"read_gbps", c.read_gbps},
          {"write_gbps", c.write_gbps}};
}

}  // namespace strata
