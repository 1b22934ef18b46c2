#!/usr/bin/env bash
# `strata bench io --replay` and `--tune`, the two ties to training. --replay (Note [Step replay],
# bench/bench_io_replay.h): the replayed step of the
# demo config reads and writes exactly the NVMe bytes a step of `strata train` on the same config
# reads and writes (so the jobs, keys, fetches and the overlapped update are the engine's), and the
# report carries the I/O time, the simulated compute, the bottleneck verdict, tokens/s and the wear
# with --drive-tbw. --tune sweeps a small matrix on the config's nvme_path, writes a fragment
# of aio keys, and `strata train --config-fragment` shows them in its plan line. Times are only
# checked to be positive. Misuse ends in one line naming the flag.
# Skips (exit 77) where the work directory refuses O_DIRECT.
# Usage: bench_io_replay_test.sh STRATA_BINARY WORKDIR
set -euo pipefail
strata="$1"; work="$2"
source "$(dirname "$0")/bench_io_common.sh"
cd "$work"
nvme=(--set "zero_optimization.offload_optimizer.nvme_path=\"$work/nvme\""
      --set "zero_optimization.offload_param.nvme_path=\"$work/nvme\"")

"$strata" --log-level warn train --steps 3 "${nvme[@]}" --set "strata.metrics=\"$work/m.jsonl\"" >/dev/null
read -r train_read train_written < <(python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(rows[-1]["nvme_read_bytes"], rows[-1]["nvme_written_bytes"])' "$work/m.jsonl")

out=$("$strata" --log-level warn bench io --replay demo --replay-steps 2 --drive-tbw 600 --json "${nvme[@]}")
if python3 -c '
import json, sys
r = json.loads(sys.argv[1]); read, written = int(sys.argv[2]), int(sys.argv[3])
ok = (r["nvme_read_bytes_per_step"] == read and r["nvme_written_bytes_per_step"] == written
      and r["io_seconds"] > 0 and r["compute_step_seconds"] > 0 and r["predicted_step_seconds"] > 0
      and isinstance(r["nvme_bottleneck"], bool) and r["nvme_tokens_per_s"] > 0 and r["param_fetches"] > 0
      and r["overlapped_update"] and r["nvme_tb_written_per_day"] > 0 and r["days_to_rated_endurance"] > 0)
sys.exit(0 if ok else 1)' "$out" "$train_read" "$train_written"; then
  ok "replay of demo: $train_read bytes read and $train_written written per step, as strata train's step"
else
  bad "replay of demo against train's step ($train_read read, $train_written written): $out"
fi
[ ! -e "$work/nvme/strata-replay-swap.bin" ] && ok "the replay's swap file is gone" || bad "replay swap file left"

# Without the overlapped update the replay runs the separate update's jobs: the bytes still match.
"$strata" --log-level warn train --steps 2 "${nvme[@]}" --set strata.offload.overlap_optimizer=false \
  --set "strata.metrics=\"$work/m2.jsonl\"" >/dev/null
want=$(python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][-1]; print(r["nvme_read_bytes"], r["nvme_written_bytes"])' "$work/m2.jsonl")
got=$("$strata" --log-level warn bench io --replay demo --replay-steps 1 --json "${nvme[@]}" \
  --set strata.offload.overlap_optimizer=false | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["nvme_read_bytes_per_step"], r["nvme_written_bytes_per_step"])')
[ "$want" = "$got" ] && ok "separate update: $got as train" || bad "separate update: replay $got, train $want"

text=$("$strata" --log-level warn bench io --replay demo --replay-steps 1 "${nvme[@]}")
grep -q "^NVMe is \(not \)\?the bottleneck: it allows [0-9.]* tokens/s" <<<"$text" && grep -q "I/O alone" <<<"$text" &&
  grep -q "compute alone" <<<"$text" && ok "text report" || bad "text report: $text"

refuse_replay() {  # description, expected text, args...
  local what="$1" want="$2"; shift 2
  local msg rc=0
  msg=$("$strata" bench io "$@" 2>&1) || rc=$?
  if [ "$rc" = 1 ] && grep -q -- "$want" <<<"$msg" && [ "$(wc -l <<<"$msg")" = 1 ]; then ok "refused $what: $msg"; else bad "$what: exit $rc: $msg"; fi
}
refuse_replay "--replay-steps 0" "--replay-steps 0: must be 1-1000" --replay demo --replay-steps 0 "${nvme[@]}"
refuse_replay "--set without --replay" "--set is an option of --replay" --dir "$work" --set a=1
refuse_replay "a config without NVMe" "keeps nothing on NVMe" --replay demo \
  --set zero_optimization.offload_optimizer.device='"cpu"' --set zero_optimization.offload_param.device='"cpu"'
refuse_replay "--dir beside --replay (replay runs on the config's nvme_path)" \
  "--dir is not an option of --replay, which replays one step of the config on its nvme_path" --replay demo --dir "$work"
refuse_replay "--qd beside --replay" "--qd is not an option of --replay" --replay demo --qd 4 "${nvme[@]}"
refuse_replay "--tune with both --dir and --config" "--tune: --dir/--paths name the drive to tune, and so do --config" \
  --tune --dir "$work" --config "$work/no-such.json"
refuse_replay "a missing config" "no-such-replay.json: no such config file" --replay "$work/no-such-replay.json"
# --tune: a small sweep on the config's nvme_path; the fragment's settings reach train's plan line.
out=$("$strata" --log-level warn bench io --tune --size 8M --tune-request-sizes 128K,512K --tune-qd 2,8 \
  --out "$work/tuned.json" "${nvme[@]}")
if python3 -c '
import json, sys
f = json.load(open(sys.argv[1]))["aio"]
sys.exit(0 if set(f) == {"queue_depth", "request_size", "write_request_size"} and f["queue_depth"] in (2, 8)
         and f["request_size"] in (131072, 524288) and f["write_request_size"] in (131072, 524288) else 1)' "$work/tuned.json" &&
   [ "$(grep -c "GB/s\|KiB" <<<"$out")" -ge 5 ]; then ok "--tune wrote $(tr -d ' \n' <"$work/tuned.json")"; else bad "--tune: $out"; fi
printf '{"aio": {"queue_depth": 8, "request_size": 262144, "write_request_size": 131072}}\n' >"$work/frag.json"
plan=$("$strata" train --steps 1 --config-fragment "$work/frag.json" "${nvme[@]}" --set "strata.metrics=\"$work/m3.jsonl\"" 2>&1 | grep "tier plan")
grep -q "queue depth 8, requests up to 256.00 KiB read / 128.00 KiB write" <<<"$plan" &&
  ok "train --config-fragment: the plan line shows the tuned settings" || bad "plan line: $plan"
"$strata" train --steps 1 --config-fragment "$work/tuned.json" "${nvme[@]}" --set "strata.metrics=\"$work/m4.jsonl\"" >/dev/null 2>&1 &&
  ok "train runs with the fragment --tune wrote" || bad "train with the tuned fragment failed"
refuse_replay "--tune-qd 0" "--tune-qd 0: each depth must be a whole number 1-1024" --tune --tune-qd 0 "${nvme[@]}"
refuse_replay "--tune-request-sizes 5000" "--tune-request-sizes 5000: each size must be a multiple of 4 KiB" \
  --tune --tune-request-sizes 5000 "${nvme[@]}"
refuse_replay "--out without --tune" "--out is an option of --tune" --dir "$work" --out "$work/x.json"
msg=$("$strata" train --config-fragment "$work/nope.json" 2>&1) || true
grep -q "config-fragment $work/nope.json" <<<"$msg" && ok "a missing fragment is named" || bad "missing fragment: $msg"
printf '{"aio": {"request_size": 5000}}\n' >"$work/bad.json"
msg=$("$strata" train --config-fragment "$work/bad.json" 2>&1) || true
grep -q "aio.request_size" <<<"$msg" && ok "a bad fragment value names the key: $msg" || bad "bad fragment: $msg"
exit $fail
