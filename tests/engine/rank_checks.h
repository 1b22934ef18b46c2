// Pass/fail bookkeeping for the multi-rank test programs (run under mpirun by ctest, so not
// GoogleTest): each rank counts its checks, prints the failing ones, and ends with the plain
// "N passed, N failed" line and a non-zero exit code on any failure.
#pragma once

#include <cstdio>
#include <string>

namespace strata::testing_mpi {

class RankChecks {
 public:
  explicit RankChecks(int rank) : rank_(rank) {}
  void expect(bool ok, const std::string& what) {
    if (ok) {
      ++passed_;
    } else {
      ++failed_;
      std::fprintf(stderr, "rank %d: FAILED: %s\n", rank_, what.c_str());
    }
  }
  int finish() const {
    std::printf("rank %d: %d passed, %d failed\n", rank_, passed_, failed_);
    return failed_ == 0 ? 0 : 1;
  }

 private:
  int rank_;
  int passed_ = 0;
  int failed_ = 0;
};

}  // namespace strata::testing_mpi
