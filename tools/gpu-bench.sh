#!/usr/bin/env bash
# Strata beside PyTorch eager on the same GPU, in one command (a benchmark, never a test): GPT-2 124M and
# 1.5B, micro-batch 4 x 1024 tokens, bf16, activation checkpointing, AdamW.
#  - strata bench model --device cuda: forward+backward alone, beside a cuBLAS GEMM of the same run;
#  - strata bench step on configs/gpu/<model>.json: the whole training step (ZeRO stage 0, no offload,
#    AdamW on the GPU, clipping at 1.0), median of 4 steps after 2;
#  - tools/torch_gpt2_step.py: the same step in PyTorch eager (Hugging Face GPT-2, fused AdamW).
# Model TFLOP/s for both from the same formula (models::train_flops_per_token: 6 x matmul parameters + 12 x
# layers x d_model x seq; no causal halving, no recompute). Usage: gpu-bench.sh STRATA_BINARY OUTDIR [MODELS...]
set -uo pipefail
strata="$1"; out="$2"; shift 2
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(gpt2-124m gpt2-1.5b)
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"
# The attention op alone beside cuBLAS (bf16, causal, 16 heads x batch 4 at seq 1024; fewer at longer).
# Every tensor-core kernel (see Note [Two tensor-core kernels] in models/kernels/cuda_attention.cuh: fa2 is the default, wmma opt-in; fa2w,
# Note [Wide warps] in models/kernels/cuda_attention_tc.cu, opt-in until timed here).
for variant in fa2 fa2w wmma; do
  for hd in 64 128; do
    for seq in 1024 2048 4096; do
      echo "attention $variant head_dim $hd seq $seq"
      STRATA_ATTENTION_TC=$variant timeout 120 "$strata" --log-level warn bench attention --device cuda --dtype bf16 \
        --batch $((4096 / seq)) --seq $seq --heads 16 --head-dim $hd --reps 5 --json 2>&1 | tee -a "$out/attention.$variant.jsonl"
    done
  done
done
for m in "${models[@]}"; do
  case "$m" in
    gpt2-124m) shape=(--layers 12 --d-model 768 --heads 12) ;;
    gpt2-1.5b) shape=(--layers 48 --d-model 1600 --heads 25) ;;
    *) echo "gpu-bench.sh: unknown model $m"; exit 1 ;;
  esac
  timeout 200 "$strata" --log-level warn bench model --device cuda --dtype bf16 --model "$m" --batch 4 --seq-len 1024 \
    --checkpointing --steps 5 --warmup 2 --profile --json >"$out/$m.bench_model.json" 2>"$out/$m.bench_model.err"
  echo "strata bench model $m: rc $? $(cat "$out/$m.bench_model.json")"; tail -3 "$out/$m.bench_model.err"
  STRATA_ATTENTION_TC=wmma timeout 200 "$strata" --log-level warn bench model --device cuda --dtype bf16 --model "$m" \
    --batch 4 --seq-len 1024 --checkpointing --steps 5 --warmup 2 --profile --json >"$out/$m.bench_model.wmma.json" \
    2>"$out/$m.bench_model.wmma.err"
  echo "strata bench model $m, wmma attention: rc $? $(cat "$out/$m.bench_model.wmma.json")"; tail -3 "$out/$m.bench_model.wmma.err"
  timeout 240 "$strata" --log-level warn bench step --config "$here/../configs/gpu/$m.json" --steps 4 --warmup 2 --json \
    >"$out/$m.bench_step.json" 2>"$out/$m.bench_step.err"
  echo "strata bench step $m: rc $? $(cat "$out/$m.bench_step.json")"; tail -3 "$out/$m.bench_step.err"
  timeout 200 python3 "$here/torch_gpt2_step.py" "${shape[@]}" >"$out/$m.torch.json" 2>"$out/$m.torch.err"
  echo "torch $m: rc $? $(cat "$out/$m.torch.json")"; tail -3 "$out/$m.torch.err"
  python3 - "$out/$m.bench_step.json" "$out/$m.torch.json" "$m" <<'PY' || true
import json, sys
s, t = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
f = s["train_flops_per_token"]
print(f"{sys.argv[3]}: strata {s['tokens_per_s']:.0f} tokens/s ({s['tokens_per_s'] * f / 1e12:.1f} TFLOP/s, peak "
      f"{s['peak_device_bytes'] / 2**30:.1f} GiB) | torch {t['tokens_per_s']:.0f} tokens/s ({t['tokens_per_s'] * f / 1e12:.1f} "
      f"TFLOP/s, peak {t['peak_gpu_bytes'] / 2**30:.1f} GiB) | strata/torch = {s['tokens_per_s'] / t['tokens_per_s']:.2f}")
PY
done
