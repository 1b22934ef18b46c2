// The offload pipeline's host thread (engine/host_executor.h): tasks run in submission order, one
// at a time; the first failure is kept (later tasks skipped, drain() and submit() rethrow it with
// its own type); the destructor runs what is queued; chaos pauses tasks without reordering them.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/host_executor.h"

namespace strata {
namespace {

TEST(HostExecutor, RunsTasksInOrderOneAtATime) {
  for (const std::uint64_t chaos : {0u, 5u}) {
    HostExecutor ex("test", chaos, 100);
    std::vector<int> order;  // written by the executor's thread only
    std::atomic<int> running{0}, overlapped{0};
    for (int i = 0; i < 200; ++i) {
      ex.submit([&, i] {
        if (running.fetch_add(1) != 0) overlapped.fetch_add(1);
        order.push_back(i);
        running.fetch_sub(1);
      });
    }
    ex.drain();
    ASSERT_EQ(order.size(), 200u) << "chaos " << chaos;
    for (int i = 0; i < 200; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i) << "chaos " << chaos;
    EXPECT_EQ(overlapped.load(), 0);
  }
}

TEST(HostExecutor, TheFirstFailureIsStickyAndKeepsItsType) {
  HostExecutor ex("sticky");
  std::atomic<bool> later_ran{false};
  ex.submit([] { throw IoError("disk gone", 5); });
  ex.submit([&] { later_ran = true; });
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      ex.drain();
      FAIL() << "drain did not report the failure";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("disk gone"), std::string::npos);
    }
  }
  EXPECT_FALSE(later_ran.load());
  EXPECT_THROW(ex.submit([] {}), IoError);
}

TEST(HostExecutor, TheDestructorRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    HostExecutor ex("drained");
    for (int i = 0; i < 50; ++i) {
      ex.submit([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        ran.fetch_add(1);
      });
    }
  }
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace strata
