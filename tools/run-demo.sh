#!/usr/bin/env bash
# The README's main-job command: installs what is missing, builds Strata, checks the machine
# (`strata doctor`), and trains the demo model: `strata train` with configs/demo.json (a byte-level
# GPT on the fortunes corpus, ZeRO stage 3 on a device capped below the model's state, with
# optimizer state and parameters on NVMe under ./strata-run/nvme), on the sim device: offload on a
# GPU has not run yet (README, "How the CUDA path is verified"). Extra arguments go to
# `strata train`, e.g. tools/run-demo.sh --steps 20, or --set strata.device.kind='"auto"' to take
# a usable GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh build >/dev/null
mkdir -p strata-run
./build/bin/strata doctor --dir ./strata-run
exec ./build/bin/strata train --config configs/demo.json "$@"
