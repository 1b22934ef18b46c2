// The sgemm yardstick: this machine's fp32 GFLOP/s through the models' matmul op, the op the sim
// device computes with (models/kernels/ops.h, inline, OpenBLAS). `strata bench model` prints it
// beside a model's achieved rate; `strata doctor --measure` (sim/doctor_measure.h) writes it as
// the sim device's bf16_tflops, and the simulator's machine measurement (sim/sim_machine_measure.h)
// takes it as the sim device's peak. It sits on the floor of the op it times.
#pragma once

#include <cstdint>

namespace strata::models {

// sgemm GFLOP/s (1e9 FLOP/s) of C[m x n] = A[m x k] B[n x k]^T through the models' matmul op, run
// for at least `min_seconds` and 3 repetitions after a warm-up.
double measure_sgemm_gflops(std::int64_t m, std::int64_t n, std::int64_t k, double min_seconds);

}  // namespace strata::models
