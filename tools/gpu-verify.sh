#!/usr/bin/env bash
# The GPU machine's checks, in one command (README "How the CUDA path is verified"): run after
# `bash .gpu/remote.sh` built Strata with CUDA into BUILD (../shared/gpu/README.md).
#   0. the host-driven stream patterns the offload pipeline uses (core_cuda_test: seconds);
#   1. offload on cuda (refused unless STRATA_CUDA_OFFLOAD=1, engine/zero_engine.cc; host-driven, see
#      Note [Host-driven offload] in docs/DESIGN.md): tiny with the optimizer on the CPU, tiny in exact mode
#      with the optimizer on NVMe and the parameters on the CPU against the same run on sim (same
#      bits?), then the demo (configs/demo.json), each with per-step seconds in a metrics file and, if
#      it is still running at its limit, every thread's stack (gdb, else eu-stack, else /proc) before
#      it is killed, so a hang and a slow run tell apart;
#   1b. a GPU capped at the plan's device figure (strata estimate's hbm.total) trains tiny at stage 0 bf16 and
#      stage 3 exact (cuda's allocations against the plan's, Note [Part bytes] in plan/part_bytes.h);
#   2. the attention tests with each opt-in kernel (wmma, fa2w), and when fa2w passes, fa2 and fa2w
#      timed alone, alternating; then the gpu-labelled tests (ctest -L gpu): the model op set against
#      its CPU reference, the engine's device ops, the CUDA AdamW, training on cuda
#      (tests/tools/train_cuda_test.sh);
#   3. compute-sanitizer memcheck and racecheck over the op and device-op suites (where installed);
#   4. tools/gpu-bench.sh: Strata beside PyTorch eager (unless --no-bench).
# Logs go to OUTDIR. Usage: gpu-verify.sh BUILD OUTDIR [--no-bench] [--no-sanitizer] [--no-offload]
set -uo pipefail
mkdir -p "$2"
b="$(cd "$1" && pwd)"; out="$(cd "$2" && pwd)"; shift 2
here="$(cd "$(dirname "$0")" && pwd)"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
# Runs CMD with a limit of SECS seconds; if it is still running then, writes every thread's stack to
# LOG.stacks first. Returns CMD's status (137 when killed).
run_watched() {  # SECS LOG CMD...
  local secs="$1" log="$2"; shift 2
  "$@" >"$log" 2>&1 &
  local pid=$! waited=0
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$secs" ]; do sleep 1; waited=$((waited + 1)); done
  if kill -0 "$pid" 2>/dev/null; then
    echo "still running after $secs s: stacks in $log.stacks"
    if command -v gdb >/dev/null; then
      timeout 60 gdb -p "$pid" -batch -ex "thread apply all bt 40" >"$log.stacks" 2>&1
    elif command -v eu-stack >/dev/null; then
      timeout 60 eu-stack -p "$pid" >"$log.stacks" 2>&1
    else
      for t in /proc/"$pid"/task/*; do
        echo "== thread ${t##*/} $(cat "$t/comm") wchan $(cat "$t/wchan" 2>/dev/null)"; cat "$t/stack" 2>/dev/null
      done >"$log.stacks"
    fi
    { echo "== every thread's name and wait channel"
      for t in /proc/"$pid"/task/*; do echo "${t##*/} $(cat "$t/comm" 2>/dev/null) $(cat "$t/wchan" 2>/dev/null)"; done
    } >>"$log.stacks" 2>&1
    kill -9 "$pid" 2>/dev/null
    waited=0  # a process stuck in the driver may not die: do not wait for it past 10 s
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 10 ]; do sleep 1; waited=$((waited + 1)); done
    if kill -0 "$pid" 2>/dev/null; then echo "pid $pid did not die after kill -9; going on"; return 137; fi
  fi
  wait "$pid"
}
# Offload on cuda is refused until it runs right (engine/zero_engine.cc); STRATA_CUDA_OFFLOAD=1 opts in.
# The summary of a run: its status, the steps it finished (strata.metrics) and their seconds.
offload_run() {  # NAME SECS CONFIG ARGS...
  local name="$1" secs="$2" config="$3"; shift 3
  stamp "offload on cuda: $name"
  mkdir -p "$out/$name"
  rm -f "$out/$name"/metrics.jsonl "$out/$name"/summary.json "$out/$name"/train.log*  # strata.metrics appends
  (cd "$out/$name" && export STRATA_CUDA_OFFLOAD=1 && run_watched "$secs" train.log "$b/bin/strata" train --config "$config" \
     --set strata.device.kind='"cuda"' --set strata.metrics='"metrics.jsonl"' --summary-json summary.json "$@")
  echo "$name: rc $?; steps done $(cat "$out/$name/metrics.jsonl" 2>/dev/null | wc -l); seconds per step:" \
    "$(sed -n 's/.*"seconds": *\([0-9.eE+-]*\).*/\1/p' "$out/$name/metrics.jsonl" 2>/dev/null | tr '\n' ' ')"
  # Host synchronizations a step may hide on cuda: pageable copies (Note [Pageable copies] in core/device/sim_stream.cc)
  # and page-locks during a step (Note [Pinning while streams run] in core/device/sim_device.cc).
  echo "$name: pageable copies per step: $(sed -n 's/.*"pageable_copies": *\([0-9]*\).*/\1/p' \
    "$out/$name/metrics.jsonl" 2>/dev/null | tr '\n' ' ')host pins per step: $(sed -n \
    's/.*"host_pins": *\([0-9]*\).*/\1/p' "$out/$name/metrics.jsonl" 2>/dev/null | tr '\n' ' ')"
  tail -3 "$out/$name/train.log"
}
stamp "host-driven stream patterns (core_cuda_test)"
timeout 120 "$b/tests/core/core_cuda_test" >"$out/core_cuda_test.log" 2>&1
echo "core_cuda_test: rc $? $(grep -E 'PASSED|FAILED' "$out/core_cuda_test.log" | head -3)"
if [[ " $* " != *" --no-offload "* ]]; then
  # tiny (45K parameters) with the optimizer on the CPU: seconds on sim.
  offload_run tiny-cpu-offload 60 "$here/../configs/tiny.json" --steps 5 \
    --set zero_optimization.offload_optimizer.device='"cpu"'
  # Exact mode, ZeRO-3, optimizer on NVMe, parameters on the CPU, 2 micro-batches: cuda against sim.
  exact=(--steps 5 --set strata.exact=true --set zero_optimization.stage=3 --set gradient_accumulation_steps=2
         --set zero_optimization.offload_optimizer.device='"nvme"' --set zero_optimization.offload_param.device='"cpu"'
         --set zero_optimization.offload_optimizer.nvme_path='"nvme"' --save-weights weights.safetensors)
  offload_run tiny-exact-offload 90 "$here/../configs/tiny.json" "${exact[@]}"
  mkdir -p "$out/tiny-exact-offload-sim"
  (cd "$out/tiny-exact-offload-sim" && timeout 90 "$b/bin/strata" train --config "$here/../configs/tiny.json" \
     --set strata.device.kind='"sim"' "${exact[@]}" >train.log 2>&1)
  if cmp -s "$out/tiny-exact-offload/weights.safetensors" "$out/tiny-exact-offload-sim/weights.safetensors"; then
    echo "tiny-exact-offload: cuda and sim weights are the same bits"
  else
    echo "tiny-exact-offload: cuda and sim weights DIFFER (or a run failed: see both train.log)"
  fi
  # The demo: ZeRO-3, bf16, state on NVMe, the GPU capped at 6 MiB (20 steps take 16 s on sim).
  offload_run demo 120 "$here/../configs/demo.json" --steps 20
fi
# The plan's device figure on cuda (Note [Part bytes] in plan/part_bytes.h; Note [Cuda capacity] in
# core/device/cuda_state_cuda.cc): a GPU capped at exactly `strata estimate`'s hbm.total trains 3 steps, as
# tests/tools/estimate_test.sh checks on sim; a failure here means cuda allocates something the plan does not count
# (cuBLAS workspace, a kernel's scratch).
at_plan_on_cuda() {  # NAME --set arguments...
  local name="$1"; shift
  mkdir -p "$out/plan-$name"
  "$b/bin/strata" estimate --config "$here/../configs/tiny.json" --json "$@" >"$out/plan-$name/estimate.json" 2>"$out/plan-$name/estimate.err"
  local total; total=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["hbm"]["total"])' \
    "$out/plan-$name/estimate.json" 2>/dev/null)
  (cd "$out/plan-$name" && timeout 120 "$b/bin/strata" --log-level warn train --config "$here/../configs/tiny.json" \
     --steps 3 --set strata.device.kind='"cuda"' --set strata.device.memory="${total:-0}" "$@" \
     --summary-json summary.json >train.log 2>&1)
  echo "plan figure on cuda, $name: rc $? at ${total:-?} bytes; peak $(sed -n 's/.*"peak_device_bytes": *\([0-9]*\).*/\1/p' \
    "$out/plan-$name/summary.json" 2>/dev/null); $(tail -1 "$out/plan-$name/train.log" | cut -c1-200)"
}
stamp "the plan's device figure on cuda"
at_plan_on_cuda stage0-bf16 --set zero_optimization.stage=0 --set gradient_accumulation_steps=1 \
  --set bf16.enabled=true --set strata.exact=false
at_plan_on_cuda stage3-exact
# Before ctest -L gpu, whose training runs take minutes: the opt-in attention kernels are quick to test
# and time, and the call's limit must not cut them off.
stamp "attention kernels: wmma, fa2w"
# The WMMA kernels (Note [Two tensor-core kernels] in models/kernels/cuda_attention.cuh): opt-in beside the default
# flash-attention 2 ones.
STRATA_ATTENTION_TC=wmma timeout 120 "$b/tests/models/models_cuda_test" --gtest_filter='*ttention*' \
  >"$out/models_cuda_test.wmma.log" 2>&1
echo "attention tests with STRATA_ATTENTION_TC=wmma: rc $? $(grep -E 'PASSED|FAILED' "$out/models_cuda_test.wmma.log" | head -3)"
# fa2's kernels with two row tiles per warp (Note [Wide warps] in models/kernels/cuda_attention_tc.cu; the backward at
# head dim 64 only): written without a GPU, opt-in.
STRATA_ATTENTION_TC=fa2w timeout 120 "$b/tests/models/models_cuda_test" --gtest_filter='*ttention*' \
  >"$out/models_cuda_test.fa2w.log" 2>&1
fa2w_rc=$?
echo "attention tests with STRATA_ATTENTION_TC=fa2w: rc $fa2w_rc $(grep -E 'PASSED|FAILED' "$out/models_cuda_test.fa2w.log" | head -3)"
if [ "$fa2w_rc" = 0 ]; then
  # Whether fa2w should become the default: the attention op alone, fa2 and fa2w alternating (a few
  # seconds each; tools/gpu-bench.sh has the full table).
  stamp "attention fa2 against fa2w"
  for hd in 64 128; do
    for seq in 1024 4096; do
      for variant in fa2 fa2w; do
        STRATA_ATTENTION_TC=$variant timeout 60 "$b/bin/strata" --log-level warn bench attention --device cuda \
          --dtype bf16 --batch $((4096 / seq)) --seq $seq --heads 16 --head-dim $hd --reps 5 --json 2>&1 |
          tee -a "$out/attention.fa2-vs-fa2w.jsonl" | sed "s/^/$variant hd $hd seq $seq: /" | cut -c1-300
      done
    done
  done
fi
stamp "ctest -L gpu"
ctest --test-dir "$b" -L gpu --output-on-failure -j4 --timeout 600 >"$out/ctest-gpu.log" 2>&1
echo "ctest -L gpu: rc $?"; grep -E "tests passed|Failed|\*\*\*|Not Run|Skipped" "$out/ctest-gpu.log" | head -40
grep -E "^(ok|FAILED|skipped):" "$out/ctest-gpu.log" | head -80
# The op tests' margins (worst error over its bound per comparison; 1 = at the bound): the closest.
timeout 300 "$b/tests/models/models_cuda_test" >"$out/models_cuda_test.log" 2>&1
echo "models_cuda_test: rc $?"
grep "margin" "$out/models_cuda_test.log" | awk -F'worst err/bound ' '{split($2, a, " "); print a[1], $0}' | sort -g |
  tail -5 | cut -c1-160
if [[ " $* " != *" --no-sanitizer "* ]] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    for t in models_cuda_test engine_cuda_test core_cuda_test; do
      exe=$(find "$b" -name "$t" -type f -perm -u+x | head -1)
      [ -n "$exe" ] || continue
      stamp "compute-sanitizer --tool $tool $t"
      timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$exe" >"$out/sanitizer-$tool-$t.log" 2>&1
      echo "compute-sanitizer $tool $t: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer-$tool-$t.log" | tail -1)"
      if [ "$t" = models_cuda_test ]; then
        STRATA_ATTENTION_TC=wmma timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$exe" \
          --gtest_filter='*ttention*' >"$out/sanitizer-$tool-$t.wmma.log" 2>&1
        echo "compute-sanitizer $tool $t (wmma attention): rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
          "$out/sanitizer-$tool-$t.wmma.log" | tail -1)"
        STRATA_ATTENTION_TC=fa2w timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$exe" \
          --gtest_filter='*ttention*' >"$out/sanitizer-$tool-$t.fa2w.log" 2>&1
        echo "compute-sanitizer $tool $t (fa2w attention): rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
          "$out/sanitizer-$tool-$t.fa2w.log" | tail -1)"
      fi
    done
  done
fi
if [[ " $* " != *" --no-bench "* ]]; then
  stamp "gpu-bench"
  bash "$here/gpu-bench.sh" "$b/bin/strata" "$out/bench"
fi
stamp "done"
