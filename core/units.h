// Byte quantities: parsing "64MiB" / "4G" / "1.5GB" and printing 1.5 GiB. Sizes are always bytes
// in std::size_t (suffix _bytes in names); element counts are never mixed in (suffix _elems).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * KiB;
inline constexpr std::size_t GiB = 1024 * MiB;

// Accepts an integer or decimal number, optional spaces, and an optional unit spelled exactly: B;
// KiB, MiB, GiB, TiB and the single letters K, M, G, T (either case) are powers of 1024; KB (or kB),
// MB, GB, TB are powers of 1000. A lowercase 'b' means bits ("64Mb", "64mb", "1gib") and is refused,
// as is anything else. Returns false without touching *out_bytes on a refusal.
bool parse_bytes(std::string_view text, std::size_t* out_bytes);

// What is wrong with `text`, which parse_bytes refused, and the accepted spellings:
// "'64Mb' is not a byte size: a lowercase 'b' means bits; write 64MiB (2^20 bytes) or 64MB ...".
std::string bad_bytes_message(std::string_view text);

// Like parse_bytes but throws ConfigError naming `where`, the problem and the accepted forms.
std::size_t parse_bytes_or_throw(std::string_view text, std::string_view where);

// Counts with a metric suffix: "100M" -> 100'000'000, "1.5B"/"1.5G" -> 1'500'000'000, "10k".
bool parse_count(std::string_view text, std::uint64_t* out);

// "0 B", "512 B", "4.00 KiB", "1.50 GiB".
std::string format_bytes(std::size_t bytes);

}  // namespace strata
