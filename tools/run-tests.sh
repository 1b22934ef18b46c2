#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything (the CUDA backend too when
# nvcc is present, warnings as errors), and runs the whole GoogleTest suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh build
# One OpenBLAS thread per test process unless the caller chose: the suite runs tests side by side, and
# OpenBLAS's spinning workers on a small machine make a run several times slower (see .ci/run).
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
bash tools/setup-python.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 600
