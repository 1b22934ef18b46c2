#!/usr/bin/env bash
# The ranks of one job agree before the first step (Note [Ranks agree], train/rank_agreement.h):
# ranks launched with different --steps (the job hung after the shorter rank's last step), seeds or
# micro-batches (exit 0 on a silent mix) all end with exit 1 and one message naming the differing
# key and both values; ranks launched alike train as before.
# Usage: rank_agreement_test.sh STRATA_BINARY CONFIG MPIEXEC WORKDIR
set -euo pipefail
strata="$1"; config="$2"; mpiexec="$3"; work="$4"
source "$(dirname "$0")/lib.sh"
fresh_workdir "$work"
mpi=(timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe --bind-to none)
train=("$strata" --log-level warn train --config "$config")
two() {  # name, expected text (fixed), rank 0's extra arguments, --, rank 1's extra arguments
  local name="$1" text="$2"; shift 2
  local a=() b=()
  while [ "$1" != "--" ]; do a+=("$1"); shift; done; shift
  b=("$@")
  local out rc=0
  out=$("${mpi[@]}" -np 1 "${train[@]}" "${a[@]}" : -np 1 "${train[@]}" "${b[@]}" 2>&1) || rc=$?
  if [ -z "$text" ]; then
    if [ $rc -eq 0 ]; then ok "$name"; else bad "$name (exit $rc)"; echo "$out" | tail -5; fi
    return
  fi
  # Both ranks say why: rank 1 names the key, rank 0 that rank 1 differs.
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF -- "$text" <<<"$out" &&
     grep -qF "1 of the 2 ranks of this job do not run what rank 0 runs" <<<"$out"; then
    ok "$name (exit $rc)"
  else
    bad "$name (exit $rc)"; echo "$out" | tail -5
  fi
}
two "--steps 3 on one rank, 6 on the other: refused, not hung" "strata.steps (6 here, 3 on rank 0)" \
  --steps 3 -- --steps 6
two "another seed on one rank" "config.strata.seed (7 here, 1234 on rank 0)" \
  --steps 2 -- --steps 2 --set strata.seed=7
two "another micro-batch on one rank" "train_micro_batch_size_per_gpu (1 here, 2 on rank 0)" \
  --steps 2 -- --steps 2 --set train_micro_batch_size_per_gpu=1
two "another model on one rank" 'config.strata.model ("tiny-llama" here, "tiny" on rank 0)' \
  --steps 2 -- --steps 2 --set strata.model='"tiny-llama"'
two "--save-weights on one rank only: refused, not hung in the weights' gather" 'save_weights ("w.st" here, "" on rank 0)' \
  --steps 2 -- --steps 2 --save-weights w.st
two "ranks launched alike train" "" --steps 2 -- --steps 2
exit $fail
