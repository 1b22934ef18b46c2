#!/usr/bin/env bash
# Before/after check for engine changes: trains configs/tiny.json for a few steps over the matrix of
# stage x optimizer tier x parameter tier x precision x accumulation (world 1, and world 2 under
# mpirun when MPIEXEC is given) and prints one line per configuration with the sha256 of the weight
# file it saved. Run it with the binary before a change and after it, and diff the two outputs:
# a refactoring that keeps behaviour gives identical lines (exact mode and the fast modes alike:
# the same code on the same machine gives the same bits).
#   tools/weights-matrix.sh OLD/strata /tmp/old > before.txt
#   tools/weights-matrix.sh build/bin/strata /tmp/new > after.txt && diff before.txt after.txt
# Usage: weights-matrix.sh STRATA_BINARY WORKDIR [MPIEXEC]
set -euo pipefail
strata="$(realpath "$1")"; work="$2"; mpiexec="${3:-}"
tiny="$(realpath "$(dirname "$0")/../configs/tiny.json")"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
run() {  # name, world, args...
  local name="$1" world="$2"; shift 2
  local cmd=("$strata")
  if [ "$world" -gt 1 ]; then cmd=("$mpiexec" --allow-run-as-root --oversubscribe --bind-to none -np "$world" "$strata"); fi
  "${cmd[@]}" --log-level error train --config "$tiny" --steps 6 --set train_micro_batch_size_per_gpu=1 \
    --set strata.metrics='""' "$@" --save-weights "$name.st" >/dev/null
  echo "$name $(sha256sum "$name.st" | cut -c1-16)"
  rm -rf "$name.st" nvme
}
tiers() {  # optimizer device, param device
  echo --set zero_optimization.offload_optimizer.device="\"$1\"" --set zero_optimization.offload_optimizer.nvme_path='"nvme"' \
    --set zero_optimization.offload_param.device="\"$2\"" --set zero_optimization.offload_param.nvme_path='"nvme"'
}
for prec in exact bf16 fp16; do
  case $prec in
    exact) p=(--set strata.exact=true) ;;
    bf16) p=(--set strata.exact=false --set bf16.enabled=true) ;;
    fp16) p=(--set strata.exact=false --set fp16.enabled=true) ;;
  esac
  for accum in 1 4; do
    for clip in 1.0 0; do
      base=("${p[@]}" --set gradient_accumulation_steps=$accum --set gradient_clipping=$clip)
      for stage in 0 1 2 3; do
        run "$prec.a$accum.c$clip.s$stage" 1 "${base[@]}" --set zero_optimization.stage=$stage
      done
      for opt in cpu nvme; do
        # shellcheck disable=SC2046
        run "$prec.a$accum.c$clip.s2.$opt" 1 "${base[@]}" --set zero_optimization.stage=2 $(tiers $opt none)
        for param in none cpu nvme; do
          # shellcheck disable=SC2046
          run "$prec.a$accum.c$clip.s3.$opt.$param" 1 "${base[@]}" --set zero_optimization.stage=3 $(tiers $opt $param)
        done
      done
      # shellcheck disable=SC2046
      run "$prec.a$accum.c$clip.s3.tiled" 1 "${base[@]}" --set zero_optimization.stage=3 $(tiers nvme nvme) \
        --set 'strata.tiling={"default": 4}'
      if [ -n "$mpiexec" ] && [ "$accum" = 4 ]; then
        for stage in 1 3; do
          run "$prec.w2.c$clip.s$stage" 2 "${base[@]}" --set gradient_accumulation_steps=2 --set zero_optimization.stage=$stage
        done
        # shellcheck disable=SC2046
        run "$prec.w2.c$clip.s3.nvme.nvme" 2 "${base[@]}" --set gradient_accumulation_steps=2 \
          --set zero_optimization.stage=3 $(tiers nvme nvme)
      fi
    done
  done
done
