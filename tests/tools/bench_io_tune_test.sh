#!/usr/bin/env bash
# `strata bench io --tune` (bench/bench_io_tune.h) over request size x queue depth, jobs and readers
# and writers at once: the JSON rows of every stage, a fragment of exactly the aio keys the engine
# reads with the chosen values among those swept, and the drive curve written into a machine file
# (an existing one updated, keeping what tune does not measure; a new one measured as doctor
# --measure does) that reads back, equals the sweep's grid and that `strata simulate` plans with.
# Times are never compared. Misuse ends in one line naming the flag.
# Usage: bench_io_tune_test.sh STRATA_BINARY WORKDIR CONFIGS_DIR
set -euo pipefail
strata="$1"; work="$2"; configs="$3"
source "$(dirname "$0")/bench_io_common.sh"
cd "$work"

cp "$configs/machines/rtx4090-2drives.json" "$work/m.json"
"$strata" --log-level warn bench io --tune --dir "$work" --size 8M --tune-request-sizes 128K,512K --tune-qd 2,8 \
  --tune-jobs 1,2 --out "$work/tuned.json" --machine-file "$work/m.json" --json >"$work/tune.jsonl"
if python3 - "$work/tune.jsonl" "$work/tuned.json" "$work/m.json" "$work" <<'PY'
import json, sys, os
rows = [json.loads(l) for l in open(sys.argv[1])]
frag, m, work = json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), sys.argv[4]
grid = [r for r in rows if "tune" in r]
jobs = [r for r in rows if "tune_jobs" in r]
rw = [r for r in rows if "tune_rw" in r]
tuned = [r for r in rows if "tuned" in r]
assert len(grid) == 8 and all(r["gbps"] > 0 for r in grid), grid
assert [r["tune_jobs"] for r in jobs] == [1, 2] and all(r["read_gbps"] > 0 and r["write_gbps"] > 0 for r in jobs), jobs
assert [r["tune_rw"] for r in rw] == ["1+1", "4+4"] and all(r["seconds_per_gb"] > 0 for r in rw), rw
assert len(tuned) == 1 and tuned[0]["tuned"] == frag and tuned[0]["depth_from"] == "read+write", tuned
aio = frag["aio"]
assert list(frag) == ["aio"] and sorted(aio) == ["queue_depth", "request_size", "write_request_size"], frag
assert aio["queue_depth"] in (2, 8) and aio["request_size"] in (131072, 524288) and aio["write_request_size"] in (131072, 524288)
d = m["drives"]
curve = d["curve"]
assert curve["request_sizes"] == [131072, 524288] and curve["queue_depths"] == [2, 8], curve
for op in ("read", "write"):
    want = [[next(r["gbps"] for r in grid if r["tune"] == op and r["request_size"] == s and r["qd"] == q)
             for q in (2, 8)] for s in (131072, 524288)]
    assert curve[op + "_gbps"] == want, (op, curve, want)
    assert d[op + "_gbps"] == max(max(row) for row in want)
assert d["count"] == 1 and d["paths"] == [os.path.abspath(work)] and d["endurance_tbw"] == 1200, d
assert m["gpus"]["count"] == 1 and "bench io --tune" in m["note"], m
PY
then ok "--tune: grid, jobs and read+write rows; aio fragment; the curve in the machine file is the grid"
else bad "--tune: $(cat "$work/tune.jsonl") / $(cat "$work/tuned.json") / $(cat "$work/m.json")"; fi

# strata simulate plans with the curve (Note [Drive curves] in plan/machine_curve.h); the fragment's keys reach its
# plan.
nvme=(--set "zero_optimization.offload_optimizer.nvme_path=\"$work/nvme\""
      --set "zero_optimization.offload_param.nvme_path=\"$work/nvme\"")
sim=$("$strata" --log-level warn simulate --machine "$work/m.json" --json "${nvme[@]}") &&
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); sys.exit(0 if r["step_seconds"] > 0 else 1)' "$sim" &&
  ok "strata simulate reads the tuned machine file" || bad "simulate with the tuned machine file: $sim"

# A new machine file: measured as doctor --measure does, then given the curve; text output.
text=$("$strata" --log-level warn bench io --tune --dir "$work" --size 8M --tune-request-sizes 256K --tune-qd 4 \
  --tune-jobs 1 --tune-rw-qd 2+2 --machine-file "$work/new.json")
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))["drives"]
sys.exit(0 if d["curve"]["request_sizes"] == [262144] and d["curve"]["queue_depths"] == [4] and d["count"] == 1 else 1)' \
  "$work/new.json" && grep -q "measured as strata doctor --measure does" <<<"$text" &&
  grep -q "^2+2 " <<<"$text" && ok "--machine-file new.json: measured, with the curve" || bad "new machine file: $text"

refuse "--tune-jobs 0" "--tune-jobs 0: each number of rings must be a whole number 1-64" --tune --tune-jobs 0
refuse "--tune-rw-qd 8" "--tune-rw-qd 8: give reader+writer depths" --tune --tune-rw-qd 8
refuse "--tune-rw-qd 0+4" "--tune-rw-qd 0: each depth must be" --tune --tune-rw-qd 0+4
refuse "--machine-file without --tune" "--machine-file is an option of --tune" --machine-file "$work/x.json"
refuse "--tune-jobs without --tune" "--tune-jobs is an option of --tune" --tune-jobs 2
echo '{"name": "x"}' >"$work/broken.json"
refuse "a broken machine file, before the sweep" "broken.json.*gpus" --tune --machine-file "$work/broken.json"
exit "$fail"
