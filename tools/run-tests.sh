#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything (the CUDA backend too when
# nvcc is present, warnings as errors), and runs the whole GoogleTest suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh build
bash tools/setup-python.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 600
