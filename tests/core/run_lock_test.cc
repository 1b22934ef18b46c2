// Tests of core/run_lock.h (Note [Run locks] in core/run_lock.h): a second holder is refused with the first one's
// pid, host and start in the message; release unlinks the lock file and frees the path; a lock
// file left behind by a run that died is taken over.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/run_lock.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

class RunLockTest : public ::testing::Test {
 protected:
  RunLockTest() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base != nullptr ? base : "/tmp") + "/strata-run-lock-test-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + templ);
    dir_ = templ;
  }
  ~RunLockTest() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(RunLockTest, ASecondHolderIsRefusedNamingTheFirst) {
  const std::string guarded = dir_ + "/swap.bin";
  RunLock first = RunLock::acquire(guarded, "swap file");
  EXPECT_TRUE(first.held());
  EXPECT_EQ(first.lock_path(), guarded + ".lock");
  // Another open of the lock file is another holder, even in this process (flock is per open file).
  try {
    RunLock second = RunLock::acquire(guarded, "swap file");
    FAIL() << "two holders of one lock";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("swap file " + guarded + " is in use by another run"), std::string::npos) << m;
    EXPECT_NE(m.find("pid " + std::to_string(::getpid()) + " on host"), std::string::npos) << m;
    EXPECT_NE(m.find(" since "), std::string::npos) << m;
    EXPECT_NE(m.find(guarded + ".lock"), std::string::npos) << m;
  }
  first.release();
  EXPECT_FALSE(first.held());
  EXPECT_FALSE(fs::exists(guarded + ".lock")) << "release leaves the lock file behind";
  RunLock again = RunLock::acquire(guarded, "swap file");
  EXPECT_TRUE(again.held());
}

TEST_F(RunLockTest, ALockFileLeftByADeadRunIsTakenOver) {
  const std::string guarded = dir_ + "/ckpt";
  fs::create_directory(guarded);
  const std::string lock_path = guarded + "/.strata.lock";
  std::ofstream(lock_path) << "pid 999999 on host gone since 2026-01-01 00:00:00 UTC (strata train)\n";
  RunLock lock = RunLock::acquire(guarded, "checkpoint directory", lock_path);
  EXPECT_TRUE(lock.held());
  std::ifstream in(lock_path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line.rfind("pid " + std::to_string(::getpid()) + " on host", 0), 0u) << line;
}

TEST_F(RunLockTest, AMissingDirectoryIsAnIoErrorNamingTheLockFile) {
  try {
    RunLock::acquire(dir_ + "/missing/swap.bin", "swap file");
    FAIL() << "locked inside a missing directory";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(dir_ + "/missing/swap.bin.lock"), std::string::npos) << e.what();
  }
}

TEST_F(RunLockTest, MovingKeepsOneHolder) {
  const std::string guarded = dir_ + "/metrics.jsonl";
  RunLock a = RunLock::acquire(guarded, "metrics file");
  RunLock b = std::move(a);
  EXPECT_FALSE(a.held());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_TRUE(b.held());
  EXPECT_THROW(RunLock::acquire(guarded, "metrics file"), ConfigError);
}

}  // namespace
}  // namespace strata
