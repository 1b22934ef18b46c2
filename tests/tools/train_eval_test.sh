#!/usr/bin/env bash
# End-to-end: `strata train` on the tiny model lowers the training loss; the weights it saves load in
# `strata eval` and score better on the validation split than the untrained initialization;
# `strata bench model --json` prints its figures; DeepSpeed keys accepted without effect are warned about
# once each; bad input (missing config, unknown key, bad --set, missing weights file) fails with exit
# code 1 and a message naming the problem.
# Usage: train_eval_test.sh STRATA_BINARY CONFIG WORKDIR
set -euo pipefail
strata="$1"; config="$2"; work="$3"
source "$(dirname "$0")/lib.sh"
mkdir -p "$work"; cd "$work"
rm -f metrics.jsonl  # strata.metrics appends; start from an empty file on re-runs

"$strata" --log-level warn train --config "$config" --steps 0 --save-weights init.safetensors > init.log 2>&1 ||
  { cat init.log; exit 1; }
# DeepSpeed keys accepted without effect: one warning line at startup naming them, their reasons at
# debug level; none without them, and none for a value that is DeepSpeed's default.
check "no ignored-key warnings for a config without such keys" "! grep -q 'without effect' init.log"
"$strata" --log-level warn train --config "$config" --steps 0 --set zero_optimization.overlap_comm=false \
  --set aio.thread_count=4 --set zero_optimization.contiguous_gradients=true > ignored.log 2>&1 ||
  { cat ignored.log; exit 1; }
check "one warning line naming the keys without effect" "[ \$(grep -c 'without effect here' ignored.log) -eq 1 ] &&
  grep 'without effect here' ignored.log | grep -q 'zero_optimization.overlap_comm, aio.thread_count' &&
  ! grep -q 'contiguous_gradients' ignored.log"
"$strata" --log-level debug train --config "$config" --steps 0 --set zero_optimization.overlap_comm=false \
  --set aio.thread_count=4 > ignored-debug.log 2>&1 || { cat ignored-debug.log; exit 1; }
check "the reasons at debug level" "grep -q 'zero_optimization.overlap_comm: .*communication stream' ignored-debug.log &&
  grep -q 'aio.thread_count: .*io_uring' ignored-debug.log"
"$strata" train --config "$config" --steps 30 --set strata.metrics=metrics.jsonl --save-weights trained.safetensors \
  > train.log 2>&1
first=$(head -1 metrics.jsonl | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
last=$(tail -1 metrics.jsonl | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
check "training loss falls ($first -> $last)" "awk 'BEGIN{exit !($last < 0.8 * $first)}'"
check "30 metrics lines" "[ \$(wc -l < metrics.jsonl) -eq 30 ]"

val=strata-run/data/val.tok
e0=$("$strata" --log-level warn eval --model tiny --weights init.safetensors --data "$val" --seq-len 32 --batches 8 --json)
e1=$("$strata" --log-level warn eval --model tiny --weights trained.safetensors --data "$val" --seq-len 32 --batches 8 --json)
l0=$(echo "$e0" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
l1=$(echo "$e1" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
check "eval: trained weights ($l1) beat the initialization ($l0) on validation" "awk 'BEGIN{exit !($l1 < $l0)}'"

# fp16 multiplies the loss gradient by the loss scale and the step divides it out: the first step's
# gradient norm (the same data, the same initial weights) is bf16's up to 16-bit rounding, not 1/scale
# of it (the scale was once never applied).
for p in bf16 fp16; do
  rm -f "norm.$p.jsonl"
  "$strata" --log-level error train --config "$config" --steps 1 --set strata.exact=false --set $p.enabled=true \
    --set strata.metrics="\"norm.$p.jsonl\"" > /dev/null 2>&1
done
n16=$(sed 's/.*"grad_norm":\([0-9.e+-]*\).*/\1/' norm.fp16.jsonl); nb16=$(sed 's/.*"grad_norm":\([0-9.e+-]*\).*/\1/' norm.bf16.jsonl)
s16=$(sed 's/.*"loss_scale":\([0-9.e+-]*\).*/\1/' norm.fp16.jsonl)
check "fp16 gradient norm $n16 at loss scale $s16 matches bf16's $nb16 within 5%" \
  "awk 'BEGIN{exit !($s16 > 1 && $n16 > 0.95 * $nb16 && $n16 < 1.05 * $nb16)}'"

b=$("$strata" --log-level warn bench model --model tiny --seq-len 32 --steps 1 --warmup 0 --json)
check "bench model --json reports tokens/s and the sgemm yardstick" "echo '$b' | grep -q tokens_per_s && echo '$b' | grep -q sgemm"
# Small sizes too: the phase's clip threshold follows the gradients' norm (below 3M parameters a
# fixed threshold of 1 left clipping off, and the bench stopped on an internal check).
a=$("$strata" --log-level warn bench adam --mode phase --params 100K --threads 1 --reps 1 --json) && rc=0 || rc=$?
check "bench adam --mode phase at 100K parameters runs (exit $rc)" "[ $rc -eq 0 ] && echo '$a' | grep -q threads"
# bench step on the demo (everything on NVMe) reports its NVMe writes and what they mean for a drive.
bs=$("$strata" --log-level warn bench step --steps 1 --warmup 1 --drive-tbw 600 --json --set strata.data.seq_len=32 \
  --set train_micro_batch_size_per_gpu=1 --set strata.metrics='""' --set zero_optimization.offload_optimizer.nvme_path='"step-nvme"' \
  --set zero_optimization.offload_param.nvme_path='"step-nvme"') && rc=0 || rc=$?
days=$(echo "$bs" | sed -n 's/.*"days_to_rated_endurance":\([0-9.e+-]*\).*/\1/p')
check "bench step --drive-tbw reports the days to the rated endurance ($days, exit $rc)" \
  "[ $rc -eq 0 ] && awk 'BEGIN{exit !(\"$days\" + 0 > 0)}' && echo '$bs' | grep -q nvme_tb_written_per_day"

expect_error() {  # name, expected text, command...
  local name="$1" text="$2"; shift 2
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  check "$name (exit $rc)" "[ $rc -eq 1 ] && echo \"\$out\" | grep -q -- \"$text\""
  [ $rc -eq 1 ] || echo "$out" | tail -3
}
expect_error "missing config file" "cannot be opened" "$strata" train --config does-not-exist.json
expect_error "unknown key with suggestion" "did you mean 'stage'" "$strata" train --config "$config" --set zero_optimization.stgae=3
expect_error "bad --set" "expected key.path=value" "$strata" train --config "$config" --set nonsense
expect_error "missing weights file" "missing.safetensors" "$strata" eval --model tiny --weights missing.safetensors --data "$val"
exit $fail
