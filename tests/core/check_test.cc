// Tests of core/error.h: the STRATA_CHECK family carries file:line, the failing condition or call
// and the message or errno text; the typed errors keep their type and payload through a catch by
// base class; errno_text is strerror plus the number.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <string>

#include "core/error.h"

namespace strata {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Check, FiresWithFileLineConditionAndMessage) {
  int line = 0;
  try {
    const int have = 3;
    line = __LINE__ + 1;
    STRATA_CHECK(have == 4, "have {} shards, want {}", have, 4);
    FAIL() << "no exception";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(contains(what, "check_test.cc:" + std::to_string(line) + ":")) << what;
    EXPECT_TRUE(contains(what, "have == 4")) << what;
    EXPECT_TRUE(contains(what, "have 3 shards, want 4")) << what;
  }
}

TEST(Check, PassingCheckEvaluatesNeitherThrowsNorFormats) {
  int condition_evals = 0;
  int message_evals = 0;
  auto message_arg = [&] { return ++message_evals; };
  EXPECT_NO_THROW(STRATA_CHECK((++condition_evals, true), "never {}", message_arg()));
  EXPECT_EQ(condition_evals, 1);
  EXPECT_EQ(message_evals, 0);
}

TEST(Check, EmptyMessageLeavesNoTrailingSeparator) {
  try {
    STRATA_CHECK(1 + 1 == 3, "");
    FAIL() << "no exception";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(contains(what, "check failed: 1 + 1 == 3")) << what;
    EXPECT_NE(what.back(), ' ') << what;
    EXPECT_NE(what.back(), ':') << what;
  }
}

TEST(Check, ErrnoGivesTheCallAndStrerror) {
  int calls = 0;
  try {
    STRATA_CHECK_ERRNO((++calls, ::open("/nonexistent-dir-strata/file", O_RDONLY)));
    FAIL() << "no exception";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(contains(what, "check_test.cc:")) << what;
    EXPECT_TRUE(contains(what, "::open(\"/nonexistent-dir-strata/file\", O_RDONLY)")) << what;
    EXPECT_TRUE(contains(what, "No such file or directory")) << what;
    EXPECT_TRUE(contains(what, "(errno " + std::to_string(ENOENT) + ")")) << what;
  }
  EXPECT_EQ(calls, 1);  // the call is evaluated exactly once
}

TEST(Check, ErrnoPassesTheResultThrough) {
  const int fd = STRATA_CHECK_ERRNO(::open("/dev/null", O_RDONLY));
  EXPECT_GE(fd, 0);
  EXPECT_EQ(STRATA_CHECK_ERRNO(::close(fd)), 0);
  try {
    STRATA_CHECK_ERRNO(::close(fd));  // closed twice
    FAIL() << "no exception";
  } catch (const InternalError& e) {
    EXPECT_TRUE(contains(e.what(), "Bad file descriptor")) << e.what();
  }
}

TEST(Check, NegErrnoForLiburingStyleResults) {
  auto submit = [](int result) { return result; };
  EXPECT_EQ(STRATA_CHECK_NEGERRNO(submit(7)), 7);
  EXPECT_EQ(STRATA_CHECK_NEGERRNO(submit(0)), 0);
  try {
    STRATA_CHECK_NEGERRNO(submit(-ENOSPC));
    FAIL() << "no exception";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(contains(what, "submit(-ENOSPC)")) << what;
    EXPECT_TRUE(contains(what, "No space left on device")) << what;
    EXPECT_TRUE(contains(what, "(errno " + std::to_string(ENOSPC) + ")")) << what;
  }
}

TEST(Check, ErrnoText) {
  EXPECT_EQ(errno_text(ENOENT), "No such file or directory (errno " + std::to_string(ENOENT) + ")");
  EXPECT_TRUE(contains(errno_text(EAGAIN), "Resource temporarily unavailable")) << errno_text(EAGAIN);
  const std::string unknown = errno_text(98765);
  EXPECT_TRUE(contains(unknown, "98765")) << unknown;
}

TEST(Check, TypedErrorsKeepTypeAndPayload) {
  try {
    throw IoError("read of /swap/a at offset 4096 (1 MiB) failed", EIO);
  } catch (const Error& e) {
    const auto* io = dynamic_cast<const IoError*>(&e);
    ASSERT_NE(io, nullptr);
    EXPECT_EQ(io->errno_value(), EIO);
    EXPECT_TRUE(contains(e.what(), "/swap/a")) << e.what();
  }
  EXPECT_THROW(throw ConfigError("x"), Error);
  EXPECT_THROW(throw FormatError("x"), Error);
  EXPECT_THROW(throw OutOfMemoryError("x"), Error);
  EXPECT_THROW(throw DeviceError("x"), Error);
  EXPECT_THROW(throw InternalError("x"), Error);
  EXPECT_THROW(throw DeviceError("x"), std::runtime_error);
  // Distinct types: a handler for one does not catch another.
  auto throws_config = [] { throw ConfigError("bad key"); };
  EXPECT_THROW(
      {
        try {
          throws_config();
        } catch (const DeviceError&) {
          FAIL() << "a ConfigError was caught as a DeviceError";
        }
      },
      ConfigError);
}

}  // namespace
}  // namespace strata
