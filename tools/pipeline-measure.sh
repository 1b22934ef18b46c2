#!/usr/bin/env bash
# The pipeline measurements of docs/MEASUREMENTS.md ("Pipeline parallelism on the sim device"): an
# 8-block LLaMA-style model (d_model 256, 8 heads, 4 KV heads, MLP 512, vocabulary 256, fp32) trained
# under mpirun at one rank and at P = 2, 4 (and 8) stages, both schedules.
#   memory: 8 micro-batches of 2 x 128 tokens, 5 steps, at the host's speed; kept against
#           re-materialized stage activations (strata.parallel.stage_recompute): tokens/s, and per
#           stage its activation sets, activation workspace, peak device memory and idle share.
#   bubble: 8 micro-batches of 1 x 128 tokens, 3 steps, with modeled compute
#           (strata.device.compute_tflops, Note [Modeled compute] in models/kernels/ops.h): each stage's idle share of
#           the pipeline's step beside the ideal (P - 1) / (A + P - 1), and the worst gap.
# Every run's weights are compared with the one-rank run's (exact mode): a difference is reported.
# Usage: pipeline-measure.sh STRATA_BINARY WORKDIR MPIEXEC [memory|bubble|all]
# WORKDIR is created, or emptied when an earlier run of this script made it.
set -euo pipefail
usage="usage: pipeline-measure.sh STRATA_BINARY WORKDIR MPIEXEC [memory|bubble|all]"
[ $# -ge 3 ] || { echo "$usage" >&2; exit 1; }
strata="$(realpath "$1")"; work="$2"; which="${4:-all}"
mpiexec="$(command -v "$3")" || { echo "pipeline-measure.sh: MPIEXEC '$3' is not a command" >&2; exit 1; }
case "$which" in memory|bubble|all) ;; *) echo "$usage" >&2; exit 1 ;; esac
tiny="$(realpath "$(dirname "$0")/../configs/tiny.json")"
if [ -e "$work" ]; then
  if [ ! -e "$work/.pipeline-measure" ] && [ -n "$(ls -A "$work")" ]; then
    echo "pipeline-measure.sh: $work is not empty and not an earlier run's directory; give a new one" >&2; exit 1
  fi
  rm -rf "$work"
fi
mkdir -p "$work"; cd "$work"; touch .pipeline-measure
model='{"name": "m8", "arch": "llama", "vocab_size": 256, "max_seq_len": 128, "n_layers": 8, "d_model": 256, "n_heads": 8, "n_kv_heads": 4, "ffn_hidden": 512}'
mpi=("$mpiexec" --allow-run-as-root --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
run() {  # name, stages, args...
  local name="$1" np="$2"; shift 2
  local launcher=()
  [ "$np" -gt 1 ] && launcher=("${mpi[@]}" -np "$np")
  "${launcher[@]}" "$strata" --log-level warn train --config "$tiny" --set strata.model="$model" --set gradient_clipping=0 \
    --set strata.data.seq_len=128 --set gradient_accumulation_steps=8 --set zero_optimization.stage=1 \
    --set strata.exact=true --set strata.device.memory='"1GiB"' --set strata.metrics='""' \
    --set strata.parallel.pipeline="$np" --summary-json "$name.json" --save-weights "$name.st" "$@"
}
same() {  # reference, runs...
  local ref="$1"; shift
  for r in "$@"; do cmp -s "$ref.st" "$r.st" || echo "WEIGHTS DIFFER: $r against $ref"; done
}
gpipe=(--set strata.parallel.schedule='"gpipe"')

if [ "$which" = memory ] || [ "$which" = all ]; then
  mem=(--set strata.steps=5 --set train_micro_batch_size_per_gpu=2)
  remat=(--set strata.parallel.stage_recompute=true)
  run ref 1 "${mem[@]}"
  run p2 2 "${mem[@]}"; run p2r 2 "${mem[@]}" "${remat[@]}"; run p2g 2 "${mem[@]}" "${gpipe[@]}"
  run p4 4 "${mem[@]}"; run p4r 4 "${mem[@]}" "${remat[@]}"; run p4g 4 "${mem[@]}" "${gpipe[@]}"
  same ref p2 p2r p2g p4 p4r p4g
  python3 - <<'EOF'
import json
r = json.load(open("ref.json"))
print(f"one rank: {r['tokens_per_second']:.0f} tokens/s, peak {r['peak_device_bytes'] / 2**20:.1f} MiB")
for n, what in [("p2", "P = 2, 1F1B"), ("p2r", "P = 2, 1F1B, re-materialized"), ("p2g", "P = 2, GPipe"),
                ("p4", "P = 4, 1F1B"), ("p4r", "P = 4, 1F1B, re-materialized"), ("p4g", "P = 4, GPipe")]:
    j = json.load(open(n + ".json")); p = j["pipeline"]
    stages = "; ".join(f"{s['activation_sets']} sets, {s['activation_bytes'] / 2**20:.1f} MiB, peak "
                       f"{s['peak_device_bytes'] / 2**20:.1f} MiB, idle {100 * s['measured_bubble_fraction']:.1f}%"
                       for s in p["per_stage"])
    print(f"{what}: {j['tokens_per_second']:.0f} tokens/s | {stages} (ideal {100 * p['ideal_bubble_fraction']:.1f}%)")
EOF
fi

if [ "$which" = bubble ] || [ "$which" = all ]; then
  bub=(--set strata.steps=3 --set train_micro_batch_size_per_gpu=1)
  run bref 1 "${bub[@]}"
  for p in 2 4 8; do
    tflops=0.004; [ "$p" -eq 8 ] && tflops=0.002  # far below what the host computes per rank
    run "b$p" "$p" "${bub[@]}" --set strata.device.compute_tflops=$tflops
    run "b${p}g" "$p" "${bub[@]}" --set strata.device.compute_tflops=$tflops "${gpipe[@]}"
  done
  same bref b2 b2g b4 b4g b8 b8g
  python3 - <<'EOF'
import json
for n in ["b2", "b2g", "b4", "b4g", "b8", "b8g"]:
    p = json.load(open(n + ".json"))["pipeline"]
    ideal = 100 * p["ideal_bubble_fraction"]
    idle = [100 * s["measured_bubble_fraction"] for s in p["per_stage"]]
    print(f"P = {p['stages']}, {p['schedule']}: ideal {ideal:.1f}%, idle per stage "
          + ", ".join(f"{x:.1f}%" for x in idle) + f"; worst gap {max(abs(x - ideal) for x in idle):.1f} points")
EOF
fi
