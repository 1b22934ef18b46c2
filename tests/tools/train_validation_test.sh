#!/usr/bin/env bash
# Validation during training (Note [Validation during training], train/trainer_validation.h): the
# tiny model trains 6 steps on the fortunes corpus with strata.data.validation "fortunes" every 3
# steps over its first 40 held-out windows, at world 1 (stage 0, in memory) and world 2 (stage 3,
# parameters and optimizer on NVMe). Checks: the metrics hold a validation line at steps 3 and 6;
# the summary's validation loss equals `strata eval` of the saved weights on the same windows
# within 1e-9 relative at both world sizes (1e-7 under tensor parallelism, world 2 x T=2 too) (exact mode: the two runs train the same weights, so their
# validation losses agree too); the step-3 and step-6 losses differ (the check sees the weights);
# settings that do nothing or that the run cannot honour are refused naming the key.
# Usage: train_validation_test.sh STRATA_BINARY CONFIG MPIEXEC WORKDIR
set -euo pipefail
strata="$1"; config="$2"; mpiexec="$3"; work="$4"
source "$(dirname "$0")/lib.sh"
fresh_workdir "$work"
mpi_launcher "$mpiexec"
check() {  # description, command...
  local what="$1"; shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; fail=1; fi
}
common=(--log-level warn train --config "$config" --steps 6 --set train_micro_batch_size_per_gpu=2
        --set strata.data.validation='"fortunes"' --set strata.data.validation_interval_steps=3
        --set strata.data.validation_windows=40)
"$strata" "${common[@]}" --set gradient_accumulation_steps=2 --set zero_optimization.stage=0 \
  --set strata.checkpoint.dir='"w1"' --set strata.metrics='"w1.jsonl"' --save-weights w1.safetensors \
  --summary-json w1.json
"${mpi[@]}" -np 2 "$strata" "${common[@]}" --set gradient_accumulation_steps=1 --set zero_optimization.stage=3 \
  --set zero_optimization.offload_param='{"device": "nvme", "nvme_path": "nv"}' \
  --set zero_optimization.offload_optimizer='{"device": "nvme", "nvme_path": "nv"}' \
  --set strata.checkpoint.dir='"w2"' --set strata.metrics='"w2.jsonl"' --save-weights w2.safetensors \
  --summary-json w2.json
check "world 2 on NVMe trains the same weights as world 1" cmp -s w1.safetensors w2.safetensors
# Tensor parallelism: each tensor rank evaluates the same windows (its slices' sums differ in order).
"${mpi[@]}" -np 2 "$strata" "${common[@]}" --set gradient_accumulation_steps=2 --set strata.parallel.tensor=2 \
  --set strata.checkpoint.dir='"t2"' --set strata.metrics='"t2.jsonl"' --save-weights t2.safetensors \
  --summary-json t2.json
for w in w1 w2 t2; do
  "$strata" --log-level warn eval --model tiny --weights "$w.safetensors" --data w1/data/val.tok --seq-len 32 \
    --batches 10 --batch-size 4 --json > "$w.eval.json"
  check "$w: validation at steps 3 and 6 in the metrics, the summary's loss equals eval's" python3 - "$w" <<'PY'
import json, sys
w = sys.argv[1]
lines = [json.loads(l) for l in open(f"{w}.jsonl") if "validation_loss" in l]
summary, ev = json.load(open(f"{w}.json")), json.load(open(f"{w}.eval.json"))
print(f"  {w}: validation {[(l['step'], round(l['validation_loss'], 6)) for l in lines]}, eval {ev['loss']:.9f} "
      f"over {ev['tokens']} tokens")
ok = [l["step"] for l in lines] == [3, 6] and lines[0]["validation_loss"] != lines[1]["validation_loss"]
ok = ok and summary["validation_step"] == 6 and summary["validation_tokens"] == ev["tokens"] == 40 * 32
ok = ok and abs(summary["validation_loss"] - ev["loss"]) <= (1e-9 if w != "t2" else 1e-7) * ev["loss"]
sys.exit(0 if ok else 1)
PY
done
refused() {  # description, expected text, strata arguments...
  local what="$1" want="$2"; shift 2
  local out rc=0
  out=$("$strata" --log-level warn train --config "$config" --steps 1 "$@" 2>&1) || rc=$?
  if [ "$rc" -eq 1 ] && grep -q -- "$want" <<< "$out"; then echo "ok: refused: $what"
  else echo "FAILED: $what (exit $rc): $out"; fail=1; fi
}
refused "an interval without a validation file" "validation_interval_steps and validation_windows apply to" \
  --set strata.data.validation_interval_steps=2
refused "\"fortunes\" validation of other training data" "held-out split" \
  --set strata.data.train='"w1/data/val.tok"' --set strata.data.validation='"fortunes"'
python3 -c "import struct; open('short.bin', 'wb').write(struct.pack('<256i', 20240520, 1, 10, *[0] * 253) + bytes(20))"
refused "a validation file too short for one window" "short.bin' has 10 tokens, fewer than one window" \
  --set strata.data.validation='"short.bin"'
exit $fail
