#!/usr/bin/env bash
# End-to-end master test of `strata train` in exact mode: the same 8 units per step split as
# world 1 x 8 micro-batches at stage 0, world 2 x 4 at stage 3, and world 4 x 2 at stage 2 with a
# sharding factor of 2 must write byte-identical weight files, for the GPT-2 and the LLaMA-style
# tiny models. Usage: train_exact_test.sh STRATA_BINARY CONFIG MPIEXEC WORKDIR
set -euo pipefail
strata="$1"; config="$2"; mpiexec="$3"; work="$4"
mkdir -p "$work"; cd "$work"
mpi=("$mpiexec" --allow-run-as-root --oversubscribe --bind-to none)
fail=0
for model in tiny tiny-llama; do
  common=(--log-level warn train --config "$config" --steps 5 --set strata.model="\"$model\"" --set train_micro_batch_size_per_gpu=1)
  "$strata" "${common[@]}" --set gradient_accumulation_steps=8 --set zero_optimization.stage=0 --save-weights "$model.w1.safetensors"
  "${mpi[@]}" -np 2 "$strata" "${common[@]}" --set gradient_accumulation_steps=4 --set zero_optimization.stage=3 \
    --save-weights "$model.w2.safetensors"
  "${mpi[@]}" -np 4 "$strata" "${common[@]}" --set gradient_accumulation_steps=2 --set zero_optimization.stage=2 \
    --set zero_optimization.mics_shard_size=2 --save-weights "$model.w4.safetensors"
  for w in 2 4; do
    if cmp -s "$model.w1.safetensors" "$model.w$w.safetensors"; then
      echo "$model: world $w weights are byte-identical to world 1"
    else
      echo "$model: FAILED: world $w weights differ from world 1"; fail=1
    fi
  done
done
exit $fail
