// Byte quantities (see core/units.h).
#include "core/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "core/error.h"

namespace strata {
namespace {

std::string lower(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c != ' ') out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

// Splits "1.5GiB" into number 1.5 and unit "gib".
bool split_number(std::string_view text, double* number, std::string* unit) {
  const std::string s = lower(text);
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return false;
  const std::string num = s.substr(0, i);
  if (num.find('.') != num.rfind('.')) return false;
  char* end = nullptr;
  *number = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(*number) || *number < 0) return false;
  *unit = s.substr(i);
  return true;
}

}  // namespace

bool parse_bytes(std::string_view text, std::size_t* out_bytes) {
  double number = 0;
  std::string unit;
  if (!split_number(text, &number, &unit)) return false;
  double mult = 0;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  else return false;
  const double bytes = number * mult;
  if (bytes > 1.8e19 || bytes != std::floor(bytes)) return false;
  *out_bytes = static_cast<std::size_t>(bytes);
  return true;
}

std::size_t parse_bytes_or_throw(std::string_view text, std::string_view where) {
  std::size_t bytes = 0;
  if (!parse_bytes(text, &bytes)) {
    throw ConfigError(fmt::format("{}: '{}' is not a byte size; write e.g. 4096, 64MiB, 1.5GiB or 2GB",
                                  where, text));
  }
  return bytes;
}

bool parse_count(std::string_view text, std::uint64_t* out) {
  double number = 0;
  std::string unit;
  if (!split_number(text, &number, &unit)) return false;
  double mult = 0;
  if (unit.empty()) mult = 1;
  else if (unit == "k") mult = 1e3;
  else if (unit == "m") mult = 1e6;
  else if (unit == "b" || unit == "g") mult = 1e9;
  else if (unit == "t") mult = 1e12;
  else return false;
  const double value = number * mult;
  if (value > 1.8e19 || value != std::floor(value)) return false;
  *out = static_cast<std::uint64_t>(value);
  return true;
}

std::string format_bytes(std::size_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, units[u]);
}

}  // namespace strata
