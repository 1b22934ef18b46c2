#!/usr/bin/env bash
# A start-up refusal on one rank stops every rank with one message (Note [Start-up refusals agreed],
# train/rank_agreement.h). Each case makes the two ranks of a job differ in the world outside the
# config, which the ranks' identity check cannot see: the lock of rank 1's swap file held by another
# process, rank 0's metrics file locked by another run, the swap directory a regular file in one
# rank's working directory only (mpirun's per-rank --wdir), the data file missing in one rank's.
# Each must end the job with exit 1 (never a hang: `timeout` gives 124) and exactly one
# "strata: error:" line naming the refusing rank and its reason. Before the note, rank 0 went on
# into its first collective and the job hung or ended without saying why on rank 0.
# Usage: startup_refusal_test.sh STRATA_BINARY CONFIG MPIEXEC WORKDIR
set -euo pipefail
strata="$1"; config="$2"; mpiexec="$3"; work="$4"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
mpi=(timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe --bind-to none)
fail=0
train=("$strata" --log-level warn train --config "$config" --steps 2 --set gradient_accumulation_steps=1)
nvme=(--set zero_optimization.offload_optimizer.device='"nvme"' --set zero_optimization.offload_optimizer.nvme_path='"nv"')

expect() {  # name, exit code, output, fixed texts the one error line must hold...
  local name="$1" rc="$2" out="$3"; shift 3
  local lines; lines=$(grep -c "strata: error:" <<<"$out" || true)
  local line; line=$(grep "strata: error:" <<<"$out" | head -1 || true)
  local missing=""
  for text in "$@"; do grep -qF -- "$text" <<<"$line" || missing+=" '$text'"; done
  if [ "$rc" -eq 1 ] && [ "$lines" -eq 1 ] && [ -z "$missing" ]; then
    echo "ok: $name"
  else
    echo "FAILED: $name (exit $rc, $lines error lines, missing:${missing:- none})"; echo "$out" | tail -8; fail=1
  fi
}

hold() {  # path: another process holds its flock (one process, so `kill` releases it)
  python3 -c 'import fcntl, sys, time; f = open(sys.argv[1], "w"); fcntl.flock(f, fcntl.LOCK_EX); time.sleep(300)' \
    "$1" >/dev/null 2>&1 &
  holder=$!
  sleep 1
}
release() { kill "$holder"; wait "$holder" 2>/dev/null || true; }

# A token file every rank finds (the fortunes cache is made under each working directory).
"$strata" --log-level warn train --config "$config" --steps 0
tokens=(--set strata.data.train="\"$work/strata-run/data/train.tok\"")

# 1. Another process holds the lock of rank 1's swap file.
mkdir -p nv
hold nv/strata-swap-rank1.bin.lock
out=$("${mpi[@]}" -np 2 "${train[@]}" "${nvme[@]}" 2>&1) && rc=0 || rc=$?
release
expect "rank 1's swap file locked by another process" "$rc" "$out" \
  "rank 1 of 2 refused to start" "strata-swap-rank1.bin" "in use by another run"

# 2. Another run holds rank 0's metrics file.
hold metrics.jsonl.lock
out=$("${mpi[@]}" -np 2 "${train[@]}" --set strata.metrics='"metrics.jsonl"' 2>&1) && rc=0 || rc=$?
release
expect "rank 0's metrics file locked by another run" "$rc" "$out" \
  "rank 0 of 2 refused to start" "metrics.jsonl" "in use by another run"

# 3. The swap directory is a regular file in rank 1's working directory only.
mkdir -p a/nv b; : > b/nv
out=$("${mpi[@]}" -np 1 --wdir "$work/a" "${train[@]}" "${tokens[@]}" "${nvme[@]}" : \
  -np 1 --wdir "$work/b" "${train[@]}" "${tokens[@]}" "${nvme[@]}" 2>&1) && rc=0 || rc=$?
expect "the swap directory refused on rank 1 only" "$rc" "$out" "rank 1 of 2 refused to start" "nvme_path directory nv"

# 4. The data file exists in rank 0's working directory only.
mkdir -p c d; cp strata-run/data/train.tok c/train.tok
data=(--set strata.data.train='"train.tok"')
out=$("${mpi[@]}" -np 1 --wdir "$work/c" "${train[@]}" "${data[@]}" : \
  -np 1 --wdir "$work/d" "${train[@]}" "${data[@]}" 2>&1) && rc=0 || rc=$?
expect "the data file missing on rank 1" "$rc" "$out" "rank 1 of 2 refused to start" "train.tok"

# 5. Alike, the same job trains (the agreement costs nothing when nobody refuses).
out=$("${mpi[@]}" -np 1 --wdir "$work/c" "${train[@]}" "${data[@]}" : \
  -np 1 --wdir "$work/c" "${train[@]}" "${data[@]}" 2>&1) && rc=0 || rc=$?
if [ "$rc" -eq 0 ]; then echo "ok: ranks alike train"; else echo "FAILED: ranks alike (exit $rc)"; echo "$out" | tail -5; fail=1; fi
exit $fail
