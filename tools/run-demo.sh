#!/usr/bin/env bash
# The README's main-job command: installs what is missing, builds Strata, and runs the main job.
# Until the trainer lands this is `strata doctor` on ./strata-run, the directory the demo training
# run will swap into; afterwards it is `strata train` with configs/demo.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh build >/dev/null
mkdir -p strata-run
exec ./build/bin/strata doctor --dir ./strata-run "$@"
