// CPU yardsticks measured by the benchmarks beside what they judge, and by `strata doctor
// --measure` to describe this machine (plan/machine.h): the CPU AdamW rate beside the Adam-shaped
// memory pass (bench/bench_adam.cc) and the sgemm rate of the matmul op the sim device computes with
// (bench/bench_model.cc). The disk's yardstick is plan/bench_disk.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

struct AdamRates {
  double adam_params_per_s = 0;  // AdamW on all cores, fp32 gradients
  double memory_gbps = 0;        // the faster Adam-shaped memory pass around it, 1e9 bytes/s
};

// `strata bench adam --params N --threads <all> --reps R` in one call: the best of `reps`
// repetitions of pass, AdamW, pass over `params` fp32 parameters with fp32 gradients.
AdamRates measure_adam_rates(std::size_t params, int reps);

// sgemm GFLOP/s (1e9 FLOP/s) of C[m x n] = A[m x k] B[n x k]^T through the models' matmul op, run
// for at least `min_seconds` and 3 repetitions after a warm-up.
double measure_sgemm_gflops(std::int64_t m, std::int64_t n, std::int64_t k, double min_seconds);

}  // namespace strata
