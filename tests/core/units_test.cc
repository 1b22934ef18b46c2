// Tests of core/units.h: byte sizes and counts as users write them in configs and flags
// ("64MiB", "1.5GB", "100M"), the bad forms that must be refused, and the printed form of sizes.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/units.h"

namespace strata {
namespace {

std::size_t bytes_of(const char* text) {
  std::size_t out = 12345;
  EXPECT_TRUE(parse_bytes(text, &out)) << "'" << text << "' should parse";
  return out;
}

TEST(Units, ParseBytesAcceptsBinaryAndDecimalUnits) {
  EXPECT_EQ(bytes_of("0"), 0u);
  EXPECT_EQ(bytes_of("4096"), 4096u);
  EXPECT_EQ(bytes_of("4096B"), 4096u);
  EXPECT_EQ(bytes_of("4K"), 4 * KiB);
  EXPECT_EQ(bytes_of("4KiB"), 4 * KiB);
  EXPECT_EQ(bytes_of("4KB"), 4000u);
  EXPECT_EQ(bytes_of("64MiB"), 64 * MiB);
  EXPECT_EQ(bytes_of("64M"), 64 * MiB);
  EXPECT_EQ(bytes_of("2MB"), 2'000'000u);
  EXPECT_EQ(bytes_of("4G"), 4 * GiB);
  EXPECT_EQ(bytes_of("1.5GiB"), GiB + GiB / 2);
  EXPECT_EQ(bytes_of("1.5GB"), 1'500'000'000u);
  EXPECT_EQ(bytes_of("2TiB"), 2 * 1024 * GiB);
  EXPECT_EQ(bytes_of("3TB"), std::size_t{3'000'000'000'000});
  EXPECT_EQ(bytes_of("0.5K"), 512u);
}

TEST(Units, ParseBytesAllowsSpacesAndEitherCaseOfSingleLetters) {
  EXPECT_EQ(bytes_of("64 MiB"), 64 * MiB);
  EXPECT_EQ(bytes_of(" 64MiB "), 64 * MiB);
  EXPECT_EQ(bytes_of("8 k"), 8 * KiB);
  EXPECT_EQ(bytes_of("64m"), 64 * MiB);
  EXPECT_EQ(bytes_of("4g"), 4 * GiB);
  EXPECT_EQ(bytes_of("4kB"), 4000u);  // the SI spelling of kilobytes
}

// A lowercase b is bits ("64Mb" = 8 MB), and "64mb" could mean either: both are refused rather than
// read as 64e6 bytes, and the message names the two byte spellings.
TEST(Units, ParseBytesRefusesBitsAndMixedCaseUnits) {
  for (const char* bad : {"64Mb", "64mb", "64MIB", "64mib", "1.5 gb", "4kb", "4Kb", "2tb", "4b", "4mB", "4gB", "6 4MiB"}) {
    std::size_t out = 777;
    EXPECT_FALSE(parse_bytes(bad, &out)) << "'" << bad << "' should be refused";
    EXPECT_EQ(out, 777u);
  }
  const std::string bits = bad_bytes_message("64Mb");
  EXPECT_NE(bits.find("'64Mb'"), std::string::npos) << bits;
  EXPECT_NE(bits.find("bits"), std::string::npos) << bits;
  EXPECT_NE(bits.find("64MiB"), std::string::npos) << bits;
  EXPECT_NE(bits.find("64MB"), std::string::npos) << bits;
  EXPECT_NE(bad_bytes_message("1.5 gb").find("1.5GiB"), std::string::npos) << bad_bytes_message("1.5 gb");
  EXPECT_NE(bad_bytes_message("4b").find("4B"), std::string::npos) << bad_bytes_message("4b");
  try {
    parse_bytes_or_throw("64Mb", "--size");
    FAIL() << "no exception";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--size: '64Mb' is not a byte size: a lowercase 'b' means bits"),
              std::string::npos)
        << e.what();
  }
}

TEST(Units, ParseBytesRejectsBadInput) {
  for (const char* bad : {"", " ", "abc", "MiB", "-1", "-4K", "1.2.3", "4XB", "4 KiBs", "1e3", "0x10", "1.5",
                          "0.1K", "4K4", "20000000TB", "99999999999T", "nan", "inf"}) {
    std::size_t out = 777;
    EXPECT_FALSE(parse_bytes(bad, &out)) << "'" << bad << "' should be refused";
    EXPECT_EQ(out, 777u) << "output written for '" << bad << "'";
  }
}

TEST(Units, ParseBytesOrThrowNamesThePlaceAndTheForms) {
  EXPECT_EQ(parse_bytes_or_throw("16MiB", "aio.block_size"), 16 * MiB);
  try {
    parse_bytes_or_throw("16 parsecs", "aio.block_size");
    FAIL() << "no exception";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("aio.block_size"), std::string::npos) << what;
    EXPECT_NE(what.find("16 parsecs"), std::string::npos) << what;
    EXPECT_NE(what.find("64MiB"), std::string::npos) << what;  // an example of a good form
  }
}

TEST(Units, ParseCountUsesMetricSuffixes) {
  std::uint64_t n = 0;
  EXPECT_TRUE(parse_count("7", &n));
  EXPECT_EQ(n, 7u);
  EXPECT_TRUE(parse_count("10k", &n));
  EXPECT_EQ(n, 10'000u);
  EXPECT_TRUE(parse_count("100M", &n));
  EXPECT_EQ(n, 100'000'000u);
  EXPECT_TRUE(parse_count("1.5B", &n));
  EXPECT_EQ(n, 1'500'000'000u);
  EXPECT_TRUE(parse_count("1.5G", &n));
  EXPECT_EQ(n, 1'500'000'000u);
  EXPECT_TRUE(parse_count("2T", &n));
  EXPECT_EQ(n, 2'000'000'000'000u);
  n = 99;
  for (const char* bad : {"", "k", "1.5", "-3", "10KiB", "10x", "1..5M", "5 apples"}) {
    EXPECT_FALSE(parse_count(bad, &n)) << "'" << bad << "' should be refused";
  }
  EXPECT_EQ(n, 99u);
}

TEST(Units, FormatBytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(4 * KiB), "4.00 KiB");
  EXPECT_EQ(format_bytes(1536 * KiB), "1.50 MiB");
  EXPECT_EQ(format_bytes(GiB + GiB / 2), "1.50 GiB");
  EXPECT_EQ(format_bytes(3 * 1024 * GiB), "3.00 TiB");
  EXPECT_EQ(format_bytes(std::size_t{1} << 60), "1024.00 PiB");  // stops at the largest unit
}

TEST(Units, FormatThenParseRoundTrips) {
  for (std::size_t b : {std::size_t{1}, std::size_t{1000}, 4 * KiB, 3 * MiB, 5 * GiB / 2}) {
    std::string text = format_bytes(b);
    std::size_t back = 0;
    ASSERT_TRUE(parse_bytes(text, &back)) << text;
    EXPECT_EQ(back, b) << text;
  }
}

}  // namespace
}  // namespace strata
