#!/usr/bin/env bash
# The DeepSpeed configs people have (issue "The DeepSpeed configs people have"): every config in
# tests/tools/ds_configs/ (written in the styles of the Hugging Face integration's docs, DeepSpeed's
# docs and examples, Megatron-DeepSpeed, Stanford Alpaca, FastChat, LLaMA-Factory, axolotl, OpenRLHF,
# and DeepSpeed's legacy forms) trains 2 steps on the tiny model as published: only the model, the
# sim device, the data and the NVMe directory are set on the command line. "auto" values are
# resolved out loud; keys without effect are one line; switched-off features pass silently; the
# refusals that remain name the key and what to use instead.
# Usage: ds_configs_test.sh STRATA_BINARY CONFIG_DIR WORKDIR
set -euo pipefail
strata="$1"; configs="$2"; work="$3"
source "$(dirname "$0")/lib.sh"
fresh_workdir "$work"
common=(--steps 2 --set strata.model='"tiny"' --set strata.device.kind='"sim"' --set strata.device.memory='"256MiB"'
        --set strata.data.train='"fortunes"' --set strata.data.seq_len=32 --set strata.metrics='""')
trained=0
for f in "$configs"/*.json; do
  name=$(basename "$f" .json)
  extra=()
  if grep -q '"nvme"' "$f"; then
    mkdir -p "nvme-$name"
    extra+=(--set zero_optimization.offload_optimizer.nvme_path="\"$PWD/nvme-$name\"")
    grep -q '"offload_param": {"device": "nvme"' "$f" &&
      extra+=(--set zero_optimization.offload_param.nvme_path="\"$PWD/nvme-$name\"")
  fi
  rc=0
  "$strata" train --config "$f" "${common[@]}" "${extra[@]}" >"$name.log" 2>&1 || rc=$?
  check "$name trains 2 steps as published" "[ $rc -eq 0 ] && grep -q 'done: 2 steps' $name.log"
  [ $rc -eq 0 ] || tail -3 "$name.log"
  [ $rc -eq 0 ] && trained=$((trained + 1))
  # Whatever "auto" a config holds is resolved in the startup block, each key once.
  if grep -q '"auto"' "$f"; then
    check "$name: its \"auto\" values are resolved out loud" "grep -q 'resolved \"auto\"' $name.log"
  fi
  # Keys without effect: at most one warning line, whatever their number.
  check "$name: keys without effect take at most one line" \
    "[ \$(grep -c 'without effect here' $name.log) -le 1 ]"
done
check "at least 20 configs train as published ($trained)" "[ $trained -ge 20 ]"

# What the resolutions are, where they matter most (the HF ZeRO-3 config with every "auto").
log=hf_zero3_auto.log
check "clipping auto is 1.0, not off" "grep -q 'gradient_clipping = 1.0' $log"
check "lr auto is 5e-05, not 1e-3" "grep -q 'optimizer.params.lr = 5e-05' $log"
check "the schedule's total steps are the run's" "grep -q 'scheduler.params.total_num_steps = 2' $log"
check "precision auto is bf16" "grep -q 'bf16.enabled = true' $log"
check "DeepSpeed's defaults say nothing (overlap_comm true, contiguous_gradients true)" \
  "! grep 'without effect here' $log | grep -q 'overlap_comm'"
# Legacy forms: translated with a line, and they act.
check "the legacy bfloat16 section is bf16" \
  "grep -q 'bfloat16 (read as bf16)' legacy_bfloat16_section.log && grep -q 'bf16' legacy_bfloat16_section.log"
check "cpu_offload: true is the optimizer offloaded to the CPU" \
  "grep -q 'cpu_offload (read as zero_optimization.offload_optimizer.device = \"cpu\")' legacy_bfloat16_section.log"
check "stage3 aliases are read" "grep -q 'max_live_parameters (read as zero_optimization.stage3_max_live_parameters)' legacy_aliases_zero3.log"
check "switched-on monitors are named once, without effect" \
  "grep 'without effect here' monitors_switched_on.log | grep -q 'tensorboard, wandb, flops_profiler'"
check "switched-off monitors say nothing" "! grep -q 'without effect here' monitors_switched_off.log"
check "the batch triangle derives the accumulation" "grep -q '8 x 1 x 1\\|2 x 4 x 1' batch_triangle_tbs_micro.log"

# What is still refused names the key and what to use instead.
expect_error() {  # name, expected text, set...
  local name="$1" text="$2"; shift 2
  local out rc=0
  out=$("$strata" train --config "$configs/sgd_fp32_stage0.json" "${common[@]}" "$@" 2>&1) || rc=$?
  check "$name (exit $rc)" "[ $rc -eq 1 ] && echo \"\$out\" | grep -qF -- \"$text\""
  [ $rc -eq 1 ] && echo "$out" | grep -qF -- "$text" || echo "$out" | tail -2
}
expect_error "quantized weights switched on" "zero_optimization.zero_quantized_weights: this DeepSpeed key is not supported" \
  --set zero_optimization.zero_quantized_weights=true
expect_error "a DeepSpeed optimizer Strata lacks" "DeepSpeed's Lamb is not implemented in Strata" --set optimizer.type='"Lamb"'
expect_error "a DeepSpeed schedule Strata lacks" "DeepSpeed's OneCycle schedule is not implemented" --set scheduler.type='"OneCycle"'
expect_error "a swapped key names its twin" "did you mean 'overlap_comm'?" --set zero_optimization.comm_overlap=true
expect_error "aio inside zero_optimization" "is a top-level section of the config" --set zero_optimization.aio.queue_depth=8
expect_error "fp16 loss scaling inside bf16" "bf16 has no loss scaling" --set bf16.loss_scale=0
expect_error "an alias beside its name, disagreeing" "DeepSpeed's other name for 'zero_optimization.stage3_max_live_parameters'" \
  --set zero_optimization.max_live_parameters=5 --set zero_optimization.stage3_max_live_parameters=6
expect_error "batch sizes that disagree" "must equal micro-batch x accumulation" \
  --set train_batch_size=3 --set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=1
exit $fail
