#!/usr/bin/env bash
# `strata train` on a cuda device (label gpu): skips (exit 77, saying why) where no cuda device is
# usable. Checks, with the tiny GPT-2 and LLaMA models:
#  1. cuda against sim: the same 20 steps in fp32 give loss curves within 2e-3 nats of each other
#     per step (different summation orders in cuBLAS/OpenBLAS and the kernels' reductions move the
#     loss by ~1e-6 per step; Adam amplifies it over 20 steps, but far less than 2e-3 on these
#     models), and in bf16 within 0.05 nats (bf16 rounds activations and weights to 8 bits of
#     mantissa: one rounding flipped by a different order moves an element by 2^-8 relative);
#  2. exact mode on cuda is deterministic: two runs write the same weight bits;
#  3. exact mode on cuda: ZeRO stages 0-3 write the same bits (as on sim). Splits of a step over
#     ranks x accumulation (train_exact_test.sh on sim) need two or more GPUs: two ranks cannot share
#     one GPU under NCCL, and at one rank no two accumulation counts make the same step (a
#     micro-batch's rows are summed as one run in the bias and norm gradients, so micro-batch size x
#     accumulation splits differ in rounding on sim too);
#  4. offload of the optimizer state (cpu, nvme) and of the parameters (cpu) (refused on cuda
#     unless STRATA_CUDA_OFFLOAD=1, which these runs set, and checked refused without it), tiling and
#     activation checkpointing on cuda keep those bits;
#  5. a checkpoint taken at step 4 on cuda and resumed gives the straight run's bits at step 8;
#  6. bf16 and fp16 (loss scaler) train on cuda: finite losses that fall;
#  7. under mpirun at world 1 the run takes the NCCL communicator (every collective of ZeRO-3 through
#     NCCL) and gives the local run's bits; with strata.parallel.communicator "mpi", 2 and 4 ranks
#     share the GPU through staged MPI and give the local run's bits too, and (STRATA_CUDA_PARALLEL=1)
#     so do pipeline 2 under both schedules and tensor 2 (against one rank of 2 tensor slices);
#  8. bad input: a device cap over the GPU's memory, tensor slices, and (on a one-GPU machine) two ranks on the
#     one GPU, are refused with a message naming the key or the cause; sim's modeled compute speed
#     (strata.device.compute_tflops) is reported as ignored.
#  9. (after 1) strata eval of the cuda-trained weights on cuda and on sim: the same loss within
#     1e-4 nats.
# Usage: train_cuda_test.sh STRATA_BINARY CONFIG WORKDIR [MPIEXEC]
# STRATA_CUDA_TEST_KIND=sim runs the same checks with the sim device in cuda's place (a dry run of
# this script where there is no GPU; items 7 and 8 need a GPU and are left out).
set -uo pipefail
strata="$1"; config="$2"; work="$3"; mpiexec="${4:-}"
kind="${STRATA_CUDA_TEST_KIND:-cuda}"
source "$(dirname "$0")/lib.sh"
fresh_workdir "$work" || exit 1

# Is a cuda device usable? strata's own answer (no GPU, no driver, a build without CUDA: skip).
if ! probe=$(timeout 120 "$strata" --log-level warn train --config "$config" --steps 1 --set strata.device.kind="\"$kind\"" 2>&1); then
  if grep -q -e "no cuda device is usable" -e "has no CUDA backend" <<<"$probe"; then
    skip "no usable cuda device: $(grep -o -e 'no cuda device is usable.*' -e 'has no CUDA backend.*' <<<"$probe" | head -1)"
  fi
  echo "$probe" | tail -20; bad "a one-step cuda run failed"; exit 1
fi

run() {  # output-prefix, extra args...: trains, writes OUT.safetensors and OUT.jsonl
  local out="$1"; shift
  local rc=0
  # A tiny model's 20 steps take seconds on a GPU: a run still going after 120 s hangs, and the
  # others would likely hang too, so the script stops there (GPU time is short).
  timeout 120 "$strata" --log-level warn train --config "$config" --save-weights "$out.safetensors" \
      --set strata.metrics="\"$PWD/$out.jsonl\"" "$@" >"$out.log" 2>&1 || rc=$?
  if [ "$rc" = 124 ]; then tail -20 "$out.log"; bad "run $out ($*) hung: no exit in 120 s"; exit 1; fi
  if [ "$rc" != 0 ]; then tail -20 "$out.log"; bad "run $out ($*) failed"; return 1; fi
}
same() {  # a, b, what
  if cmp -s "$1.safetensors" "$2.safetensors"; then ok "$3"; else bad "$3: $1 and $2 differ"; fi
}
curves() {  # a, b, tolerance (nats), what: per-step losses within the tolerance
  python3 - "$1.jsonl" "$2.jsonl" "$3" "$4" <<'EOF' || fail=1
import json, math, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
tol, what = float(sys.argv[3]), sys.argv[4]
worst = max(abs(x - y) for x, y in zip(a, b)) if a and len(a) == len(b) else math.inf
finite = all(math.isfinite(x) for x in a + b)
print(f"{'ok' if worst <= tol and finite else 'FAILED'}: {what}: {len(a)} steps, losses {a[0]:.4f} -> {a[-1]:.4f} "
      f"(other {b[0]:.4f} -> {b[-1]:.4f}), largest step difference {worst:.3g} nats (tolerance {tol})")
sys.exit(0 if worst <= tol and finite else 1)
EOF
}
falls() {  # run, what: finite losses whose last is below the first
  python3 - "$1.jsonl" "$2" <<'EOF' || fail=1
import json, math, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1])]
good = all(math.isfinite(x) for x in l) and l[-1] < l[0]
print(f"{'ok' if good else 'FAILED'}: {sys.argv[2]}: {len(l)} steps, loss {l[0]:.4f} -> {l[-1]:.4f}")
sys.exit(0 if good else 1)
EOF
}

cuda=(--set strata.device.kind="\"$kind\"")
sim=(--set strata.device.kind='"sim"')
for model in tiny tiny-llama; do
  mm=(--set strata.model="\"$model\"")
  m=("${mm[@]}" --steps 20)
  # 1. cuda against sim, not exact (the fast paths), fp32 and bf16.
  run "$model.sim.f32" "${m[@]}" "${sim[@]}" --set strata.exact=false
  run "$model.cuda.f32" "${m[@]}" "${cuda[@]}" --set strata.exact=false
  curves "$model.sim.f32" "$model.cuda.f32" 2e-3 "$model fp32: cuda against sim"
  # 1b. strata eval of the trained weights on cuda against sim: the same mean cross-entropy within
  #     1e-4 nats (one forward; summation orders differ by ~1e-6).
  evals=()
  for dev in sim "$kind"; do
    if out=$(timeout 120 "$strata" --log-level warn eval --model "$model" --weights "$model.cuda.f32.safetensors" \
               --data strata-run/data/val.tok --batches 4 --device "$dev" --json 2>&1); then
      evals+=("$(python3 -c 'import json, sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["loss"])' \
                 <<<"$out" 2>/dev/null || echo nan)")
    else
      evals+=(nan); echo "$out" | tail -5
    fi
  done
  if python3 -c 'import math, sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-4 else 1)' \
       "${evals[0]}" "${evals[1]}"; then
    ok "$model: eval on $kind against sim: ${evals[1]} and ${evals[0]} nats"
  else
    bad "$model: eval on $kind against sim: ${evals[1]} and ${evals[0]} nats (tolerance 1e-4)"
  fi
  run "$model.sim.bf16" "${m[@]}" "${sim[@]}" --set strata.exact=false --set bf16.enabled=true
  run "$model.cuda.bf16" "${m[@]}" "${cuda[@]}" --set strata.exact=false --set bf16.enabled=true
  curves "$model.sim.bf16" "$model.cuda.bf16" 0.05 "$model bf16: cuda against sim"
  falls "$model.cuda.bf16" "$model bf16 on cuda"
  run "$model.cuda.f16" "${m[@]}" "${cuda[@]}" --set strata.exact=false --set fp16.enabled=true
  falls "$model.cuda.f16" "$model fp16 (dynamic loss scale) on cuda"

  # 2-3. exact mode: determinism, stages, accumulation splits (8 sequences a step).
  e=("${m[@]}" "${cuda[@]}" --set strata.exact=true)
  run "$model.x.s0.1x8" "${e[@]}" --set zero_optimization.stage=0 --set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=8
  run "$model.x.s0.1x8.again" "${e[@]}" --set zero_optimization.stage=0 --set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=8
  same "$model.x.s0.1x8" "$model.x.s0.1x8.again" "$model exact on cuda: two runs give the same bits"
  for s in 1 2 3; do
    run "$model.x.s$s.1x8" "${e[@]}" --set zero_optimization.stage=$s --set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=8
    same "$model.x.s0.1x8" "$model.x.s$s.1x8" "$model exact on cuda: stage $s = stage 0"
  done
  # 4. offload, tiling, activation checkpointing, against the plain run of the same 2 x 4 split at
  #    stage 3.
  s2x4=(--set zero_optimization.stage=3 --set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=4)
  base=("${e[@]}" "${s2x4[@]}")
  ref="$model.x.s3.2x4"
  run "$ref" "${base[@]}"
  # Offload on cuda is refused (engine/zero_engine.cc: its first GPU run failed) unless
  # STRATA_CUDA_OFFLOAD=1, which these runs set to reproduce it.
  if [ "$kind" = cuda ]; then
    out=$(timeout 120 "$strata" --log-level warn train --config "$config" "${base[@]}" \
          --set zero_optimization.offload_optimizer.device='"cpu"' 2>&1); rc=$?
    if [ "$rc" -ne 0 ] && grep -q "offload on a cuda device does not run correctly yet" <<<"$out"; then
      ok "$model: offload on cuda is refused without STRATA_CUDA_OFFLOAD=1"
    else
      bad "$model: offload on cuda was not refused (rc $rc): $(tail -2 <<<"$out")"
    fi
  fi
  export STRATA_CUDA_OFFLOAD=1
  run "$model.x.opt_cpu" "${base[@]}" --set zero_optimization.offload_optimizer.device='"cpu"'
  same "$ref" "$model.x.opt_cpu" "$model exact on cuda: optimizer state on the host"
  run "$model.x.opt_nvme" "${base[@]}" --set zero_optimization.offload_optimizer.device='"nvme"' \
    --set zero_optimization.offload_optimizer.nvme_path="\"$PWD/nvme.$model\""
  same "$ref" "$model.x.opt_nvme" "$model exact on cuda: optimizer state on NVMe"
  run "$model.x.param_cpu" "${base[@]}" --set zero_optimization.offload_optimizer.device='"cpu"' \
    --set zero_optimization.offload_param.device='"cpu"'
  same "$ref" "$model.x.param_cpu" "$model exact on cuda: parameters and optimizer state on the host"
  unset STRATA_CUDA_OFFLOAD
  run "$model.x.tiled" "${base[@]}" --set 'strata.tiling={"default": 2}'
  same "$ref" "$model.x.tiled" "$model exact on cuda: blocks tiled in 2"
  run "$model.x.ckpt" "${base[@]}" --set "strata.model={\"name\": \"$model\", \"checkpoint_activations\": true}"
  same "$ref" "$model.x.ckpt" "$model exact on cuda: activation checkpointing"
  # 5. checkpoint at step 4, resume to 8 = straight 8.
  b8=("${mm[@]}" "${cuda[@]}" --set strata.exact=true "${s2x4[@]}")
  r=("${b8[@]}" --set strata.checkpoint.dir="\"$PWD/ckpt.$model\"" --set strata.checkpoint.interval_steps=4)
  run "$model.x.straight8" "${b8[@]}" --steps 8
  run "$model.x.first4" "${r[@]}" --steps 4
  run "$model.x.resumed8" "${r[@]}" --steps 8 --resume "$PWD/ckpt.$model"
  same "$model.x.straight8" "$model.x.resumed8" "$model exact on cuda: resumed at step 4 = straight 8 steps"
done

# 7. NCCL at world 1.
if [ -n "$mpiexec" ] && [ "$kind" = cuda ]; then
  if timeout 300 "$mpiexec" --allow-run-as-root -np 1 "$strata" --log-level info train --config "$config" --save-weights nccl.safetensors \
      --set strata.model='"tiny"' --steps 20 "${cuda[@]}" --set strata.exact=true --set zero_optimization.stage=3 \
      --set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=8 >nccl.log 2>&1; then
    if grep -q "collectives nccl" nccl.log; then ok "mpirun -np 1 on cuda uses the NCCL communicator"
    else bad "mpirun -np 1 on cuda: the log does not name the nccl communicator"; fi
    same tiny.x.s0.1x8 nccl "tiny exact on cuda: ZeRO-3 through NCCL at world 1 = the local run"
  else tail -20 nccl.log; bad "mpirun -np 1 on cuda failed"; fi
fi

# 7b. More ranks on the node than GPUs: refused before any work, naming the cause.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ -n "$mpiexec" ] && [ "$kind" = cuda ] && [ "${gpus:-0}" = 1 ]; then
  out=$(timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$strata" --log-level warn train --config "$config" \
    --steps 1 "${cuda[@]}" 2>&1) && rc=0 || rc=$?
  if [ "$rc" -ne 0 ] && grep -q "2 ranks on this node but 1 GPU(s)" <<<"$out"; then ok "two ranks on one GPU are refused"
  else echo "$out" | tail -3; bad "two ranks on one GPU: exit $rc without the message"; fi
fi

# 7c. Staged MPI (Note [Staged MPI] in comm/comm_staged.cc, strata.parallel.communicator "mpi"): 2 and 4 ranks share the
#     GPU and talk over MPI through pinned host copies; exact data parallelism at stage 3 (the same 8
#     sequences a step) gives the one-rank local run's bits.
if [ -n "$mpiexec" ] && [ "$kind" = cuda ]; then
  for np in 2 4; do
    if timeout 300 "$mpiexec" --allow-run-as-root --oversubscribe --bind-to none -np $np "$strata" --log-level info train \
        --config "$config" --save-weights staged.$np.safetensors --set strata.model='"tiny"' --steps 20 "${cuda[@]}" \
        --set strata.exact=true --set zero_optimization.stage=3 --set train_micro_batch_size_per_gpu=1 \
        --set gradient_accumulation_steps=$((8 / np)) --set strata.parallel.communicator='"mpi"' >staged.$np.log 2>&1; then
      if grep -q "collectives mpi-staged" staged.$np.log; then ok "$np ranks on one GPU use the staged MPI communicator"
      else bad "$np ranks with communicator mpi: the log does not name mpi-staged"; fi
      same tiny.x.s0.1x8 staged.$np "tiny exact on cuda: $np ranks through staged MPI at stage 3 = the local run"
    else tail -20 staged.$np.log; bad "$np ranks on one GPU through staged MPI failed"; fi
  done
fi

# 7d. Tensor and pipeline parallelism on cuda (refused unless STRATA_CUDA_PARALLEL=1), their ranks
#     sharing the GPU through staged MPI: exact runs at pipeline 2 (1F1B and GPipe) give the local
#     run's bits, and tensor 2 (the vocabulary-parallel kernels) the bits of one rank computing the
#     same 2 tensor slices.
if [ -n "$mpiexec" ] && [ "$kind" = cuda ]; then
  par=(--config "$config" --set strata.model='"tiny"' "${cuda[@]}" --set strata.exact=true
       --set zero_optimization.stage=1 --set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=8
       --set strata.parallel.communicator='"mpi"')
  two=("$mpiexec" --allow-run-as-root --oversubscribe --bind-to none -np 2 "$strata" --log-level warn train)
  if out=$(timeout 120 "${two[@]}" "${par[@]}" --steps 1 --set strata.parallel.pipeline=2 2>&1); then
    bad "pipeline 2 on cuda was accepted without STRATA_CUDA_PARALLEL=1"
  elif grep -q "pipeline = 2 on a cuda device" <<<"$out"; then ok "pipeline 2 on cuda is refused without the opt-in"
  else echo "$out" | tail -3; bad "pipeline 2 on cuda: the refusal does not name the key"; fi
  for sched in 1f1b gpipe; do
    if STRATA_CUDA_PARALLEL=1 timeout 150 "${two[@]}" "${par[@]}" --steps 20 --set strata.parallel.pipeline=2 \
        --set strata.parallel.schedule="\"$sched\"" --save-weights pp.$sched.safetensors >pp.$sched.log 2>&1; then
      same tiny.x.s0.1x8 pp.$sched "tiny exact on cuda: pipeline 2 ($sched) on one GPU = the local run"
    else tail -20 pp.$sched.log; bad "pipeline 2 ($sched) on one GPU failed"; fi
  done
  if STRATA_CUDA_PARALLEL=1 timeout 150 "$strata" --log-level warn train "${par[@]}" --steps 20 --set strata.parallel.tensor_slices=2 \
      --save-weights s2.safetensors >s2.log 2>&1 &&
     STRATA_CUDA_PARALLEL=1 timeout 150 "${two[@]}" "${par[@]}" --steps 20 --set strata.parallel.tensor=2 \
      --save-weights t2.safetensors >t2.log 2>&1; then
    same s2 t2 "tiny exact on cuda: tensor 2 on one GPU = one rank of 2 tensor slices"
  else tail -20 s2.log t2.log; bad "tensor slices or tensor 2 on one GPU failed"; fi
fi

# 8. A cap larger than the GPU.
if [ "$kind" != cuda ]; then exit $fail; fi
if out=$(timeout 120 "$strata" --log-level warn train --config "$config" --steps 1 "${cuda[@]}" --set strata.device.memory='"100TiB"' 2>&1); then
  bad "a 100 TiB device cap was accepted"
elif grep -q "strata.device.memory" <<<"$out"; then ok "a cap over the GPU's memory is refused: $(tail -1 <<<"$out")"
else echo "$out" | tail -3; bad "a cap over the GPU's memory: the message does not name strata.device.memory"; fi
# strata.device.compute_tflops (sim's modeled speed) on a GPU: said to be ignored, and the run trains.
if out=$(timeout 120 "$strata" --log-level warn train --config "$config" --steps 1 "${cuda[@]}" \
    --set strata.device.compute_tflops=1 2>&1) && grep -q "compute_tflops = 1 .*is ignored" <<<"$out"; then
  ok "strata.device.compute_tflops on a GPU is reported as ignored"
else echo "$out" | tail -3; bad "strata.device.compute_tflops on a GPU: no warning, or the run failed"; fi
# Tensor slices on one GPU (the vocabulary-parallel CUDA kernels, not yet run in training): refused.
if out=$(timeout 120 "$strata" --log-level warn train --config "$config" --steps 1 "${cuda[@]}" \
    --set strata.parallel.tensor_slices=2 2>&1); then
  bad "tensor_slices 2 on cuda was accepted"
elif grep -q "tensor_slices = 2" <<<"$out"; then ok "tensor slices on cuda are refused: $(tail -1 <<<"$out" | cut -c1-120)"
else echo "$out" | tail -3; bad "tensor slices on cuda: the message does not name tensor_slices"; fi
exit $fail
