#!/usr/bin/env bash
# `strata simulate`: a prediction for each example machine (text and --json, with a trace that
# parses), a tensor-parallel layout, pipeline stages (both schedules, the sim device's machine of
# docs/MEASUREMENTS.md), and one clear line with exit 1 for bad input: no --machine, a missing machine
# file, a config that does not fit the machine, a machine without the drives the config puts state on,
# more pipeline stages than layers, pipeline stages with --machine measure.
# Usage: simulate_test.sh STRATA_BINARY CONFIGS_DIR WORKDIR
set -euo pipefail
strata="$1"; configs="$2"; work="$3"
here="$(cd "$(dirname "$0")" && pwd)"
source "$(dirname "$0")/lib.sh"
mkdir -p "$work"
cd "$work"

for m in h100x1-4drives h100x8-node rtx4090-2drives; do
  out=$("$strata" simulate --config "$configs/demo.json" --machine "$configs/machines/$m.json") && rc=0 || rc=$?
  echo "$out"
  check "$m: exit 0" "[ $rc -eq 0 ]"
  check "$m: predicts a step and names the slowest queue" "echo \"\$out\" | grep -q 'predicted step .* slowest queue'"
done
"$strata" simulate --config "$configs/tiny.json" --machine "$configs/machines/h100x8-node.json" --json \
  --trace "$work/sim.trace.json" > "$work/sim.json"
check "--json is one object with the step time" \
  "python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j[\"step_seconds\"] > 0 and j[\"world_size\"] == 8' '$work/sim.json'"
check "--trace writes Chrome trace JSON" \
  "python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))[\"traceEvents\"]; assert any(x[\"name\"].startswith(\"reduce_scatter\") for x in e)' '$work/sim.trace.json'"
# Tensor parallelism on the 8-GPU node: data 4 x tensor 2, the tensor group's all-reduces in the trace.
"$strata" simulate --config "$configs/demo.json" --machine "$configs/machines/h100x8-node.json" --json \
  --set strata.parallel.tensor=2 --trace "$work/tp.trace.json" > "$work/tp.json"
check "tensor 2 on 8 GPUs: data 4 x tensor 2, its all-reduces in the trace" \
  "python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); e=json.load(open(sys.argv[2]))[\"traceEvents\"]; assert j[\"world_size\"] == 8 and j[\"tensor_ranks\"] == 2 and j[\"step_seconds\"] > 0 and any(x[\"name\"].startswith(\"tensor all_reduce\") for x in e)' '$work/tp.json' '$work/tp.trace.json'"

# Pipeline stages: tiny at P = 2 on 2 of the node's GPUs, both schedules: a stage each in the JSON, with
# its bubble, the ideal beside it, and one trace process per stage.
for sch in 1f1b gpipe; do
  "$strata" simulate --config "$configs/tiny.json" --machine "$configs/machines/h100x8-node.json" --world 2 --json \
    --set strata.parallel.pipeline=2 --set "strata.parallel.schedule=\"$sch\"" --set gradient_accumulation_steps=4 \
    --trace "$work/pp_$sch.trace.json" > "$work/pp_$sch.json"
  check "pipeline 2, $sch: two stages with their bubble, a trace process each" \
    "python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); p=j[\"pipeline\"]; e=json.load(open(sys.argv[2]))[\"traceEvents\"]; assert j[\"world_size\"] == 2 and j[\"pipeline_stages\"] == 2 and j[\"step_seconds\"] > 0 and p[\"schedule\"] == sys.argv[3] and abs(p[\"ideal_bubble_fraction\"] - 0.2) < 1e-12 and [s[\"peak_in_flight\"] for s in p[\"per_stage\"]] == ([2, 1] if sys.argv[3] == \"1f1b\" else [4, 4]) and all(0 < s[\"bubble_fraction\"] < 1 for s in p[\"per_stage\"]) and {x[\"pid\"] for x in e} == {0, 1}' '$work/pp_$sch.json' '$work/pp_$sch.trace.json' $sch"
done
out=$("$strata" simulate --config "$configs/tiny.json" --machine "$configs/machines/h100x8-node.json" --world 2 \
  --set strata.parallel.pipeline=2)
echo "$out"
check "pipeline 2, text: a line per stage and the ideal bubble" \
  "echo \"\$out\" | grep -q '^pipeline: 2 stages, 1f1b' && echo \"\$out\" | grep -q '^1 .*1-1' && echo \"\$out\" | grep -q 'ideal (P - 1) / (A + P - 1) = 33.3%'"
# The machine of docs/MEASUREMENTS.md ("Step simulator against pipelined training"): the sim device
# with modeled compute, P = 4 over the 8-block model there.
m8='{"name": "m8", "arch": "llama", "vocab_size": 256, "max_seq_len": 128, "n_layers": 8, "d_model": 256, "n_heads": 8, "n_kv_heads": 4, "ffn_hidden": 512}'
"$strata" simulate --config "$configs/tiny.json" --machine "$here/sim_modeled_machine.json" --world 4 --efficiency 1 --json \
  --set strata.model="$m8" --set strata.data.seq_len=128 --set gradient_accumulation_steps=8 --set zero_optimization.stage=1 \
  --set train_micro_batch_size_per_gpu=1 --set 'strata.device.memory="1GiB"' --set strata.parallel.pipeline=4 > "$work/m8.json"
check "the sim device's machine file, P = 4: 2 blocks a stage, 1F1B's P - p micro-batches in flight" \
  "python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))[\"pipeline\"][\"per_stage\"]; assert [(s[\"first_layer\"], s[\"end_layer\"], s[\"peak_in_flight\"]) for s in p] == [(0, 2, 4), (2, 4, 3), (4, 6, 2), (6, 8, 1)]' '$work/m8.json'"

expect_error() {  # name, pattern, args...
  local name="$1" pattern="$2"; shift 2
  local err rc
  err=$("$strata" simulate "$@" 2>&1 >/dev/null) && rc=0 || rc=$?
  echo "$err"
  check "$name: exit 1" "[ $rc -eq 1 ]"
  check "$name: one line naming it" "[ \$(echo \"\$err\" | wc -l) -eq 1 ] && echo \"\$err\" | grep -q -e \"$pattern\""
}
expect_error "no --machine" "--machine is needed" --config "$configs/tiny.json"
expect_error "more pipeline stages than layers" "each stage needs at least one layer: valid choices 1..2" \
  --config "$configs/tiny.json" --set strata.parallel.pipeline=4 --machine "$configs/machines/h100x8-node.json"
expect_error "pipeline stages with --machine measure" "--machine measure" --config "$configs/tiny.json" \
  --set strata.parallel.pipeline=2 --world 2 --machine measure
expect_error "missing machine file" "no-such-machine.json" --config "$configs/tiny.json" --machine "$work/no-such-machine.json"
expect_error "config larger than the machine" "device" --config "$configs/tiny.json" --set strata.model=llama-7b \
  --set strata.data.seq_len=32 --machine "$configs/machines/rtx4090-2drives.json"
python3 - "$configs/machines/rtx4090-2drives.json" "$work/nodrives.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["drives"]["count"] = 0; json.dump(m, open(sys.argv[2], "w"))
PY
"$strata" simulate --config "$configs/demo.json" --machine "$work/nodrives.json" >/dev/null 2>"$work/nodrives.err" && rc=0 || rc=$?
cat "$work/nodrives.err"
check "no drives for NVMe state: exit 1 naming drives" "[ $rc -eq 1 ] && grep -q 'drives' '$work/nodrives.err'"
exit $fail
