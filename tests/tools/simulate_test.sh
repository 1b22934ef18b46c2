#!/usr/bin/env bash
# `strata simulate`: a prediction for each example machine (text and --json, with a trace that
# parses), a tensor-parallel layout, and one clear line with exit 1 for bad input: no --machine, a missing machine file, a
# config that does not fit the machine, a machine without the drives the config puts state on.
# Usage: simulate_test.sh STRATA_BINARY CONFIGS_DIR WORKDIR
set -euo pipefail
strata="$1"; configs="$2"; work="$3"
mkdir -p "$work"
cd "$work"
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi; }

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

expect_error() {  # name, pattern, args...
  local name="$1" pattern="$2"; shift 2
  local err rc
  err=$("$strata" simulate "$@" 2>&1 >/dev/null) && rc=0 || rc=$?
  echo "$err"
  check "$name: exit 1" "[ $rc -eq 1 ]"
  check "$name: one line naming it" "[ \$(echo \"\$err\" | wc -l) -eq 1 ] && echo \"\$err\" | grep -q -e \"$pattern\""
}
expect_error "no --machine" "--machine is needed" --config "$configs/tiny.json"
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
