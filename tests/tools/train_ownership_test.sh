#!/usr/bin/env bash
# Run ownership of `strata train` (Note [Run locks], core/run_lock.h; issue "trust under hostile
# use"): a fresh run into a checkpoint directory that holds checkpoints is refused, and so is a
# resume that would reach published checkpoints already there (an unpublished one, left by a save
# killed before `latest` moved, is removed); a second run on the NVMe swap file, the checkpoint
# directory or the metrics file of a live run is refused naming the holder's pid; after the holder
# is killed (-9) the next run takes the stale locks over. A mistyped nvme_path grows no directory
# chain. Usage: train_ownership_test.sh STRATA_BINARY CONFIG WORKDIR
set -euo pipefail
strata="$1"; config="$2"; work="$3"
source "$(dirname "$0")/lib.sh"
fresh_workdir "$work"
train() { "$strata" --log-level warn train --config "$config" "$@"; }
run_rc() { out=$("$@" 2>&1) && rc=0 || rc=$?; }
nvme=(--set zero_optimization.offload_optimizer.device=nvme)
ck() { echo "--set" "strata.checkpoint.dir=\"$1\""; }

train --steps 4 --set strata.checkpoint.interval_steps=2 $(ck ck)
check "a run writes its checkpoints" "[ -d ck/step-00000002 ] && [ -d ck/step-00000004 ] && [ ! -e ck/.strata.lock ]"

run_rc train --steps 4 $(ck ck)
check "a fresh run into a directory with checkpoints: exit 1 (got $rc)" "[ $rc -eq 1 ]"
check "... naming the newest and the fix" "echo \"\$out\" | grep -q 'already holds checkpoints (the newest is step-00000004).*--resume'"
check "... and the directory is untouched" "[ \"\$(cat ck/latest)\" = step-00000004 ]"

run_rc train --steps 6 --resume ck/step-00000002 $(ck ck)
check "resuming step 2 where step 4 exists: exit 1 (got $rc)" "[ $rc -eq 1 ]"
check "... saying so" "echo \"\$out\" | grep -q 'holds later checkpoints (latest is step-00000004)'"

train --steps 6 --set strata.checkpoint.interval_steps=2 --resume ck $(ck ck)
check "resuming from the newest continues the series" "[ -d ck/step-00000006 ] && [ \"\$(cat ck/latest)\" = step-00000006 ]"
# A run killed between renaming step-8 into place and replacing latest leaves step-8 unpublished.
cp -r ck/step-00000006 ck/step-00000008
run_rc train --steps 8 --set strata.checkpoint.interval_steps=2 --resume ck $(ck ck)
check "an unpublished later checkpoint is removed, not refused (exit $rc)" "[ $rc -eq 0 ] && [ \"\$(cat ck/latest)\" = step-00000008 ]"
check "... saying so" "echo \"\$out\" | grep -q 'interrupted before it was published'"

# A live run holds its swap file, its checkpoint directory and its metrics file.
mkdir nvme
# (strata itself in the background, not a shell function: $! is then its pid)
"$strata" --log-level warn train --config "$config" --steps 100000 "${nvme[@]}" \
  --set zero_optimization.offload_optimizer.nvme_path='"nvme"' $(ck live) --set strata.metrics='"live.jsonl"' \
  >holder.log 2>&1 &
holder=$!
trap 'kill -9 $holder 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  [ -e nvme/strata-swap-rank0.bin.lock ] && [ -e live/.strata.lock ] && break
  sleep 0.1
done
check "the holder took its locks" "[ -e nvme/strata-swap-rank0.bin.lock ] && [ -e live/.strata.lock ]"
run_rc train --steps 2 "${nvme[@]}" --set zero_optimization.offload_optimizer.nvme_path='"nvme"'
check "a second run on the same swap file: exit 1 (got $rc)" "[ $rc -eq 1 ]"
check "... naming the holder's pid" "echo \"\$out\" | grep -q \"swap file .*strata-swap-rank0.bin is in use by another run: pid $holder\""
run_rc train --steps 2 $(ck live)
check "a second run on the same checkpoint directory: exit 1 (got $rc)" "[ $rc -eq 1 ]"
check "... naming the holder's pid" "echo \"\$out\" | grep -q \"checkpoint directory live is in use by another run: pid $holder\""
run_rc train --steps 2 --set strata.metrics='"live.jsonl"'
check "a second run appending to the same metrics file: exit 1 (got $rc)" "[ $rc -eq 1 ]"
check "... naming the holder's pid" "echo \"\$out\" | grep -q \"metrics file live.jsonl is in use by another run: pid $holder\""
kill -9 "$holder"; wait "$holder" 2>/dev/null || true
check "a killed run leaves its lock files" "[ -e nvme/strata-swap-rank0.bin.lock ]"
run_rc train --steps 2 "${nvme[@]}" --set zero_optimization.offload_optimizer.nvme_path='"nvme"'
check "the next run takes the stale swap lock over (exit $rc)" "[ $rc -eq 0 ] && [ ! -e nvme/strata-swap-rank0.bin.lock ]"

run_rc train --steps 2 "${nvme[@]}" --set zero_optimization.offload_optimizer.nvme_path='"typo/nvme"'
check "a mistyped nvme_path: exit 1 (got $rc)" "[ $rc -eq 1 ] && [ ! -e typo ]"
check "... saying only the last component is made" "echo \"\$out\" | grep -q 'creates only the last'"
exit $fail
