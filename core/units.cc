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

namespace {

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// The number and the unit of a byte size, the unit as written (spaces between them dropped); the
// number's text in *number_text when not null.
bool split_byte_size(std::string_view text, double* number, std::string* unit, std::string* number_text = nullptr) {
  const std::string_view s = trimmed(text);
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return false;
  const std::string num(s.substr(0, i));
  if (number_text != nullptr) *number_text = num;
  if (num.find('.') != num.rfind('.')) return false;
  char* end = nullptr;
  *number = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(*number) || *number < 0) return false;
  *unit = std::string(trimmed(s.substr(i)));
  return true;
}

// Bytes per unit as spelled; 0 for a spelling that is not accepted.
double bytes_per_unit(const std::string& unit) {
  if (unit.empty() || unit == "B") return 1;
  // Up to E: format_bytes prints PiB, and what Strata prints it must read back.
  static constexpr const char* kPrefixes = "KMGTPE";
  for (int p = 0; p < 6; ++p) {
    const char upper = kPrefixes[p];
    const char lower_case = static_cast<char>(std::tolower(static_cast<unsigned char>(upper)));
    const double binary = std::pow(1024.0, p + 1);
    const double decimal = std::pow(1000.0, p + 1);
    if (unit.size() == 1 && (unit[0] == upper || unit[0] == lower_case)) return binary;
    if (unit.size() == 3 && unit[0] == upper && unit[1] == 'i' && unit[2] == 'B') return binary;
    if (unit.size() == 2 && unit[1] == 'B' && (unit[0] == upper || (upper == 'K' && unit[0] == 'k'))) return decimal;
  }
  return 0;
}

}  // namespace

bool parse_bytes(std::string_view text, std::size_t* out_bytes) {
  double number = 0;
  std::string unit;
  if (!split_byte_size(text, &number, &unit)) return false;
  const double mult = bytes_per_unit(unit);
  if (mult == 0) return false;
  const double bytes = number * mult;
  if (bytes > 1.8e19 || bytes != std::floor(bytes)) return false;
  *out_bytes = static_cast<std::size_t>(bytes);
  return true;
}

std::string bad_bytes_message(std::string_view text) {
  double number = 0;
  std::string unit, num;
  if (split_byte_size(text, &number, &unit) && bytes_per_unit(unit) != 0 && number * bytes_per_unit(unit) > 1.8e19) {
    return fmt::format("'{}' is too large: a byte size is at most 16EiB (2^64 bytes)", text);
  }
  if (split_byte_size(text, &number, &unit, &num) && !unit.empty() && unit.back() == 'b') {
    // "64Mb", "64mb", "1gib": a lowercase b is bits (64Mb would be 8 MB); the intent is unclear.
    const char prefix = static_cast<char>(std::toupper(static_cast<unsigned char>(unit.front())));
    if (unit.size() >= 2 && std::string_view("KMGTPE").find(prefix) != std::string_view::npos) {
      return fmt::format("'{}' is not a byte size: a lowercase 'b' means bits; write {}{}iB (powers of 1024) or "
                         "{}{}B (powers of 1000)",
                         text, num, prefix, num, prefix);
    }
    return fmt::format("'{}' is not a byte size: a lowercase 'b' means bits; write bytes with a capital B, e.g. "
                       "{}B",
                       text, num);
  }
  return fmt::format("'{}' is not a byte size; write a whole number of bytes, e.g. 4096, 64MiB, 1.5GiB or 64M "
                     "(powers of 1024), 64MB or 2GB (powers of 1000)",
                     text);
}

std::size_t parse_bytes_or_throw(std::string_view text, std::string_view where) {
  std::size_t bytes = 0;
  if (!parse_bytes(text, &bytes)) throw ConfigError(fmt::format("{}: {}", where, bad_bytes_message(text)));
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
