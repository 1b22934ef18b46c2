// The op-against-reference suites that both device-ops programs run, written once: the sim suite
// (device_ops_test.cc) and the cuda suite (device_ops_cuda_test.cc) differ only in the fixture that
// makes the device and stream and in the names of their suites. GoogleTest names a suite after a
// class, so the shared definitions are one macro:
//   STRATA_DEVICE_OPS_REFERENCE_SUITES(Fixture, Suite, prefix, OptimizerTest)
// defines Suite##Convert (every dtype pair), Suite##Sized (every size of op_sizes()) and
// Suite##Optimizer (every optim_cases() entry, as the test OptimizerTest) on `Fixture`, a
// ::testing::Test that provides `testing::Rig rig()`, and instantiates them as prefix/...
// The checks themselves are in device_ops_checks.h.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <tuple>

#include "tests/engine/device_ops_checks.h"

namespace strata::device_ops::testing {

using DTypePair = std::tuple<DType, DType>;

inline std::string dtype_pair_name(const ::testing::TestParamInfo<DTypePair>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_to_" + std::string(dtype_name(std::get<1>(info.param)));
}

inline std::string size_name(const ::testing::TestParamInfo<std::size_t>& info) {
  return "n" + std::to_string(info.param);
}

inline std::string optim_case_name(const ::testing::TestParamInfo<OptimCase>& info) { return info.param.name; }

// Both poison modes of a sum-of-squares check, for every gradient dtype.
template <typename Check>
void for_dtypes_and_poison(Check check) {
  for (DType dtype : all_dtypes()) {
    check(dtype, Poison::No);
    check(dtype, Poison::Yes);
  }
}

}  // namespace strata::device_ops::testing

#define STRATA_DEVICE_OPS_REFERENCE_SUITES(Fixture, Suite, prefix, OptimizerTest)                                  \
  class Suite##Convert : public Fixture,                                                                         \
                         public ::testing::WithParamInterface<::strata::device_ops::testing::DTypePair> {};     \
  TEST_P(Suite##Convert, MatchesReferenceBitForBit) {                                                            \
    const auto [from, to] = GetParam();                                                                          \
    ::strata::device_ops::testing::Rig r = rig();                                                                \
    for (std::size_t n : ::strata::device_ops::testing::op_sizes()) {                                            \
      ::strata::device_ops::testing::check_convert(r, from, to, n);                                              \
    }                                                                                                            \
  }                                                                                                              \
  INSTANTIATE_TEST_SUITE_P(prefix, Suite##Convert,                                                               \
                           ::testing::Combine(::testing::ValuesIn(::strata::device_ops::testing::all_dtypes()),  \
                                              ::testing::ValuesIn(::strata::device_ops::testing::all_dtypes())), \
                           ::strata::device_ops::testing::dtype_pair_name);                                      \
  class Suite##Sized : public Fixture, public ::testing::WithParamInterface<std::size_t> {};                     \
  TEST_P(Suite##Sized, AddLeftMatchesReference) {                                                                \
    ::strata::device_ops::testing::Rig r = rig();                                                                \
    ::strata::device_ops::testing::check_add_left(r, GetParam());                                                \
  }                                                                                                              \
  TEST_P(Suite##Sized, ConvertAddLeftMatchesReferenceAndTheTwoOpForm) {                                          \
    ::strata::device_ops::testing::Rig r = rig();                                                                \
    for (::strata::DType dtype : ::strata::device_ops::testing::all_dtypes()) {                                  \
      ::strata::device_ops::testing::check_convert_add_left(r, dtype, GetParam());                               \
    }                                                                                                            \
  }                                                                                                              \
  TEST_P(Suite##Sized, BlockSumSquaresMatchesGradStatsPerBlock) {                                                \
    ::strata::device_ops::testing::Rig r = rig();                                                                \
    ::strata::device_ops::testing::for_dtypes_and_poison([&](::strata::DType dtype, auto poison) {               \
      ::strata::device_ops::testing::check_block_sum_squares(r, GetParam(), poison, dtype);                      \
    });                                                                                                          \
  }                                                                                                              \
  TEST_P(Suite##Sized, ExactSumSquaresMatchesOneAccumulator) {                                                   \
    ::strata::device_ops::testing::Rig r = rig();                                                                \
    ::strata::device_ops::testing::for_dtypes_and_poison([&](::strata::DType dtype, auto poison) {               \
      ::strata::device_ops::testing::check_exact_sum_squares(r, GetParam(), poison, dtype);                      \
    });                                                                                                          \
  }                                                                                                              \
  INSTANTIATE_TEST_SUITE_P(prefix, Suite##Sized, ::testing::ValuesIn(::strata::device_ops::testing::op_sizes()), \
                           ::strata::device_ops::testing::size_name);                                            \
  class Suite##Optimizer : public Fixture,                                                                       \
                           public ::testing::WithParamInterface<::strata::device_ops::testing::OptimCase> {};   \
  TEST_P(Suite##Optimizer, OptimizerTest) {                                                                      \
    ::strata::device_ops::testing::Rig r = rig();                                                                \
    ::strata::device_ops::testing::check_optimizer_update(r, GetParam());                                        \
  }                                                                                                              \
  INSTANTIATE_TEST_SUITE_P(prefix, Suite##Optimizer,                                                             \
                           ::testing::ValuesIn(::strata::device_ops::testing::optim_cases()),                   \
                           ::strata::device_ops::testing::optim_case_name)
