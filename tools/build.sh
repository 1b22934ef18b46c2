#!/usr/bin/env bash
# Configures and builds Strata into a build directory (default: build/). Used by the README's two
# commands and by .ci/run. Extra arguments go to CMake's configure step, e.g.
#   tools/build.sh build-asan -DSTRATA_SANITIZE=address,undefined -DSTRATA_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
shift || true
bash tools/setup.sh
# ccache (when installed): paths relative to the checkout, so a fresh clone elsewhere still hits.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake -S . -B "$BUILD_DIR" -G Ninja -DSTRATA_WERROR=ON "$@" >"$BUILD_DIR.configure.log" 2>&1 ||
  { cat "$BUILD_DIR.configure.log"; exit 1; }
grep -E '^-- Strata:' "$BUILD_DIR.configure.log" || true
cmake --build "$BUILD_DIR" -j"$(nproc)"
