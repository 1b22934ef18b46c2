// The seeded mutation loop the reader fuzz tests share (issue 19, "Fuzzed readers").
//
// Each test starts from valid inputs produced by the real writers, mutates them (bit flips, byte
// inserts and deletes, truncation, splicing, interesting integers; for JSON also numbers and values
// replaced by extremes and wrong types, and deep nesting) and feeds every mutant to a reader. The
// only acceptable outcomes are a sane result or a strata::Error (ConfigError, FormatError, IoError)
// with a message; any other exception is a reader bug, and so is a crash or a sanitizer report.
//
// Iterations per reader: STRATA_FUZZ_ITERS (default kDefaultIters, sized for CI under ASan). Mutant i
// of a reader is drawn from a generator seeded with (STRATA_FUZZ_SEED, reader name, i) alone, so a
// failure prints the line that reproduces it: STRATA_FUZZ_SEED=S STRATA_FUZZ_FIRST=i
// STRATA_FUZZ_ITERS=1 fuzz_test --gtest_filter=<the test>. The failing input is also written next
// under TMPDIR (or /tmp) as strata-fuzz-<reader>-<i>.bin.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace strata::fuzz {

inline constexpr std::uint64_t kDefaultIters = 4000;
inline constexpr std::uint64_t kDefaultSeed = 20240519;

inline std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strtoull(v, nullptr, 0);
}

// Iterations for one reader: STRATA_FUZZ_ITERS, times `scale` (slow readers run fewer), at least 1.
inline std::uint64_t iterations(double scale = 1.0) {
  const auto n = static_cast<std::uint64_t>(static_cast<double>(env_u64("STRATA_FUZZ_ITERS", kDefaultIters)) * scale);
  return n == 0 ? 1 : n;
}

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : gen_(seed) {}
  std::uint64_t next() { return gen_(); }
  // Uniform in [0, n); n > 0.
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(gen_() % n); }
  bool one_in(std::size_t n) { return below(n) == 0; }
  template <typename T>
  const T& pick(const std::vector<T>& v) { return v[below(v.size())]; }

 private:
  std::mt19937_64 gen_;
};

// Integers that break size arithmetic: zero, one, sign bits, powers of two near the widths' limits.
inline std::uint64_t interesting_u64(Rng& rng) {
  static const std::uint64_t values[] = {0,
                                         1,
                                         2,
                                         0x7f,
                                         0x80,
                                         0xff,
                                         0x7fff,
                                         0xffff,
                                         0x7fffffff,
                                         0x80000000,
                                         0xffffffff,
                                         0x100000000ull,
                                         std::uint64_t{1} << 40,
                                         std::uint64_t{1} << 61,
                                         std::uint64_t{1} << 62,
                                         std::uint64_t{1} << 63,
                                         (std::uint64_t{1} << 63) + 1,
                                         0x7fffffffffffffffull,
                                         0xfffffffffffffffeull,
                                         0xffffffffffffffffull};
  std::uint64_t v = values[rng.below(std::size(values))];
  if (rng.one_in(4)) v += rng.below(5) - 2;
  return v;
}

// One byte-level mutation of `data` in place; `others` are inputs to splice from.
inline void mutate_bytes(std::string& data, Rng& rng, const std::vector<std::string>& others) {
  const auto at = [&]() { return data.empty() ? 0 : rng.below(data.size()); };
  switch (rng.below(9)) {
    case 0:  // flip 1-8 bits
      if (data.empty()) break;
      for (std::size_t k = 1 + rng.below(8); k-- > 0;) data[at()] ^= static_cast<char>(1u << rng.below(8));
      break;
    case 1: {  // set a byte to an edge value
      if (data.empty()) break;
      static const unsigned char edge[] = {0, 1, 0x7f, 0x80, 0xff, '"', '[', '{', '0', '9', '-', '.', 'e'};
      data[at()] = static_cast<char>(edge[rng.below(std::size(edge))]);
      break;
    }
    case 2: {  // insert 1-16 random bytes
      std::string ins(1 + rng.below(16), '\0');
      for (auto& c : ins) c = static_cast<char>(rng.next());
      data.insert(data.empty() ? 0 : rng.below(data.size() + 1), ins);
      break;
    }
    case 3:  // delete a range
      if (data.empty()) break;
      {
        const std::size_t from = at();
        data.erase(from, 1 + rng.below(std::min<std::size_t>(64, data.size() - from)));
      }
      break;
    case 4:  // truncate
      data.resize(data.empty() ? 0 : rng.below(data.size()));
      break;
    case 5: {  // splice: a prefix of this input and a suffix of another
      const std::string& other = rng.pick(others);
      const std::size_t cut = data.empty() ? 0 : rng.below(data.size() + 1);
      const std::size_t from = other.empty() ? 0 : rng.below(other.size() + 1);
      data = data.substr(0, cut) + other.substr(from);
      break;
    }
    case 6: {  // duplicate a range
      if (data.empty()) break;
      const std::size_t from = at();
      const std::string piece = data.substr(from, 1 + rng.below(64));
      data.insert(at(), piece);
      break;
    }
    case 7: {  // overwrite 1, 2, 4 or 8 bytes with an interesting little-endian integer
      const std::size_t width = std::size_t{1} << rng.below(4);
      if (data.size() < width) break;
      const std::uint64_t v = interesting_u64(rng);
      // Header fields sit at small offsets: aim there half the time.
      const std::size_t limit = rng.one_in(2) ? std::min<std::size_t>(data.size() - width + 1, 64) : data.size() - width + 1;
      std::memcpy(data.data() + rng.below(limit), &v, width);
      break;
    }
    default: {  // append garbage
      std::string tail(1 + rng.below(32), '\0');
      for (auto& c : tail) c = static_cast<char>(rng.next());
      data += tail;
      break;
    }
  }
}

// A JSON value token's byte span in a JSON text (numbers, strings, literals, opening brackets).
struct Span {
  std::size_t begin, end;
};

// The spans of the scalar values in `text` (a rough lexer: good enough on mutants, never reads out of bounds).
inline std::vector<Span> json_scalars(std::string_view text, bool strings_only = false) {
  std::vector<Span> out;
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == '"') {
      std::size_t j = i + 1;
      while (j < text.size() && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, text.size());
      // A key is followed by ':'; keep values only.
      std::size_t k = j;
      while (k < text.size() && (text[k] == ' ' || text[k] == '\n')) ++k;
      if (k >= text.size() || text[k] != ':') out.push_back({i, j});
      i = j;
    } else if (!strings_only && (c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n')) {
      std::size_t j = i + 1;
      while (j < text.size() && std::strchr("0123456789.eE+-abcdefghijklmnopqrstuvwxyz", text[j]) != nullptr) ++j;
      out.push_back({i, j});
      i = j;
    } else {
      ++i;
    }
  }
  return out;
}

// Values that break JSON readers: extremes, wrong types, strings that look like numbers.
inline std::string extreme_json_value(Rng& rng) {
  static const std::vector<std::string> values = {
      "-1", "0", "1", "-0", "0.5", "1e308", "-1e308", "1e999", "-1e999", "1e-400", "2147483647", "2147483648",
      "-2147483649", "4294967295", "4294967296", "9223372036854775807", "9223372036854775808",
      "-9223372036854775808", "-9223372036854775809", "18446744073709551615", "18446744073709551616",
      "123456789012345678901234567890", "1.5e19", "4.2e9", "\"NaN\"", "\"nan\"", "\"inf\"", "\"-inf\"",
      "\"1e999\"", "\"auto\"", "\"\"", "\"x\"", "\"\\u0000\"", "\"\\ud800\"", "\"99999999999999999999GiB\"",
      "\"-5\"", "\"1e308\"", "\"18446744073709551616\"", "true", "false", "null", "[]", "{}", "[1,2]",
      "[-1]", "[1e999]", "{\"a\":1}", "[\"x\"]", "[[]]"};
  return rng.pick(values);
}

inline std::string nested(Rng& rng, const std::string& inner) {
  static const std::size_t depths[] = {2, 10, 100, 300, 1000, 5000, 100000};
  const std::size_t d = depths[rng.below(rng.one_in(8) ? std::size(depths) : 4)];
  const bool arrays = rng.one_in(2);
  std::string s;
  s.reserve(d * 6 + inner.size());
  for (std::size_t k = 0; k < d; ++k) s += arrays ? "[" : "{\"a\":";
  s += inner;
  for (std::size_t k = 0; k < d; ++k) s += arrays ? "]" : "}";
  return s;
}

// One JSON-aware mutation (or, a quarter of the time, a byte-level one).
inline void mutate_json(std::string& text, Rng& rng, const std::vector<std::string>& others) {
  const std::vector<Span> spans = json_scalars(text);
  if (spans.empty() || rng.one_in(4)) return mutate_bytes(text, rng, others);
  const Span s = rng.pick(spans);
  const std::string old = text.substr(s.begin, s.end - s.begin);
  std::string value;
  switch (rng.below(5)) {
    case 0:
    case 1: value = extreme_json_value(rng); break;
    case 2: value = nested(rng, rng.one_in(2) ? old : extreme_json_value(rng)); break;
    case 3: value = "[" + old + "]"; break;
    default: {  // a number with more digits, or another value's text
      const Span t = rng.pick(spans);
      value = rng.one_in(2) ? old + std::string(1 + rng.below(30), '9') : text.substr(t.begin, t.end - t.begin);
      break;
    }
  }
  text.replace(s.begin, s.end - s.begin, value);
}

// Seeds mutants of `seeds` (1-4 mutations each, by `mutate`) for STRATA_FUZZ_ITERS x `scale`
// iterations and hands each to `check`, which returns normally for a sane result and throws for
// anything else. strata::Error with a message passes; any other exception fails the test, naming
// the iteration and how to reproduce it.
using Mutator = std::function<void(std::string&, Rng&, const std::vector<std::string>&)>;

struct FuzzStats {
  std::uint64_t inputs = 0, accepted = 0, refused = 0;
  double seconds = 0;
};

inline FuzzStats fuzz_loop(const std::string& reader, const std::vector<std::string>& seeds, const Mutator& mutate,
                           const std::function<void(const std::string&)>& check, double scale = 1.0) {
  const std::uint64_t base = env_u64("STRATA_FUZZ_SEED", kDefaultSeed);
  const std::uint64_t first = env_u64("STRATA_FUZZ_FIRST", 0);
  const std::uint64_t n = iterations(scale);
  std::uint64_t reader_hash = 1469598103934665603ull;
  for (const char c : reader) reader_hash = (reader_hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  FuzzStats stats;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t i = first; i < first + n; ++i) {
    Rng rng(splitmix64(base ^ splitmix64(reader_hash + i)));
    std::string input = rng.pick(seeds);
    for (std::size_t k = 1 + rng.below(4); k-- > 0;) mutate(input, rng, seeds);
    std::string failure;
    try {
      check(input);
      ++stats.accepted;
    } catch (const Error& e) {
      if (std::string_view(e.what()).empty()) failure = "a strata::Error with an empty message";
      ++stats.refused;
    } catch (const std::exception& e) {
      failure = std::string("an exception that is not a strata::Error (") + typeid(e).name() + "): " + e.what();
    }
    ++stats.inputs;
    if (!failure.empty()) {
      const char* dir = std::getenv("TMPDIR");
      const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/strata-fuzz-" + reader + "-" +
                               std::to_string(i) + ".bin";
      std::ofstream(path, std::ios::binary) << input;
      ADD_FAILURE() << reader << " input " << i << " (" << input.size() << " bytes, saved as " << path
                    << "): " << failure.substr(0, 2000) << "\nreproduce: STRATA_FUZZ_SEED=" << base
                    << " STRATA_FUZZ_FIRST=" << i << " STRATA_FUZZ_ITERS=1";
      break;
    }
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz %s: %llu inputs (%llu accepted, %llu refused) in %.2f s, %.0f inputs/s\n", reader.c_str(),
              static_cast<unsigned long long>(stats.inputs), static_cast<unsigned long long>(stats.accepted),
              static_cast<unsigned long long>(stats.refused), stats.seconds,
              static_cast<double>(stats.inputs) / std::max(stats.seconds, 1e-9));
  return stats;
}

// A check's way to say the reader returned something insane (fails the fuzz loop: not a strata::Error).
struct InsaneResult : std::logic_error {
  using std::logic_error::logic_error;
};

}  // namespace strata::fuzz
