#!/bin/bash
# strata simulate's NVMe seconds beside `strata bench io --replay`'s measured I/O seconds for three
# configs (the demo; the demo with parameters on the CPU, only the optimizer on NVMe; a 12-layer,
# d_model 384 GPT-2 shape), in alternated rounds: each round tunes the drive of WORK/strata-run/nvme
# into a fresh copy of a machine file (bench io --tune --machine-file, Note [Drive curves] in
# plan/machine_curve.h), then replays each config against it, so a replay and the curve it is
# compared with are measured minutes apart at most. One line per round and config, then the medians
# of the per-round ratios and the load average seen (docs/MEASUREMENTS.md, "Replay beside simulate").
#
# usage: tools/replay-vs-simulate.sh STRATA WORK [ROUNDS] [TUNE_SIZE]
set -euo pipefail
strata=$(realpath "$1")
work=$2
rounds=${3:-5}
tune_size=${4:-128M}
mkdir -p "$work/strata-run"
cd "$work"
big=(--set strata.model.d_model=384 --set strata.model.n_layers=12 --set strata.model.ffn_hidden=1536
     --set strata.model.n_heads=6 --set strata.device.memory=64MiB
     --set zero_optimization.stage3_prefetch_bucket_size=4e6 --set zero_optimization.stage3_max_live_parameters=4e6
     --set zero_optimization.offload_param.buffer_size=4e6)
opt=(--set zero_optimization.offload_param.device=cpu)
# The host part of the machine: measured once. The sim device's PCIe figures are 0 in doctor's file
# (copies at memory speed); simulate needs them > 0 for offloaded state, and they do not touch NVMe.
if [ ! -f base.json ]; then
  "$strata" --log-level warn doctor --json --measure --out base.json >/dev/null
  python3 - <<'PY'
import json
m = json.load(open("base.json"))
m["gpus"]["pcie_h2d_gbps"] = m["gpus"]["pcie_d2h_gbps"] = m["host"]["memory_gbps"]
json.dump(m, open("base.json", "w"), indent=1)
PY
fi
: >rounds.txt
for r in $(seq 1 "$rounds"); do
  cp base.json "m$r.json"
  "$strata" --log-level warn bench io --tune --size "$tune_size" --tune-qd 1,4,16,32 --tune-jobs 1 --tune-rw-qd none \
    --machine-file "m$r.json" >/dev/null
  for c in demo opt big; do
    case $c in demo) x=();; opt) x=("${opt[@]}");; big) x=("${big[@]}");; esac
    load=$(cut -d' ' -f1 /proc/loadavg)
    "$strata" --log-level warn bench io --replay demo --machine "m$r.json" --replay-steps 5 --json "${x[@]}" |
      tail -1 | python3 -c "
import json, sys
j = json.load(sys.stdin); p = j['io_profile']
print('$r $c %s %.4f %.4f %.2f %.1f %.2f' % ('$load', j['io_seconds'], j['simulated_nvme_seconds'],
      j['io_seconds'] / j['simulated_nvme_seconds'], p['mean_requests_in_flight'], p['mixed_seconds'] / p['busy_seconds']))" |
      tee -a rounds.txt
  done
done
python3 - <<'PY'
import statistics as st
rows = [l.split() for l in open("rounds.txt")]
print("config rounds replay_s simulated_s replay/simulated (median, range) load")
for c in ("demo", "opt", "big"):
    r = [x for x in rows if x[1] == c]
    ratio = [float(x[5]) for x in r]
    print(c, len(r), "%.4f" % st.median(float(x[3]) for x in r), "%.4f" % st.median(float(x[4]) for x in r),
          "%.2f (%.2f-%.2f)" % (st.median(ratio), min(ratio), max(ratio)),
          "%.1f-%.1f" % (min(float(x[2]) for x in r), max(float(x[2]) for x in r)))
PY
