#!/usr/bin/env bash
# The GPU machine's checks, in one command (README "How the CUDA path is verified"): run after
# `bash .gpu/remote.sh` built Strata with CUDA into BUILD (../shared/gpu/README.md).
#   1. the gpu-labelled tests (ctest -L gpu): the model op set against its CPU reference, the engine's
#      device ops, the CUDA AdamW, training on cuda (tests/tools/train_cuda_test.sh);
#   2. compute-sanitizer memcheck and racecheck over the op and device-op suites (where installed);
#   3. the demo (configs/demo.json) trained on the GPU, 20 steps;
#   4. tools/gpu-bench.sh: Strata beside PyTorch eager (unless --no-bench).
# Logs go to OUTDIR. Usage: gpu-verify.sh BUILD OUTDIR [--no-bench] [--no-sanitizer]
set -uo pipefail
b="$1"; out="$2"; shift 2
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
stamp "ctest -L gpu"
ctest --test-dir "$b" -L gpu --output-on-failure -j4 --timeout 600 >"$out/ctest-gpu.log" 2>&1
echo "ctest -L gpu: rc $?"; grep -E "tests passed|Failed|\*\*\*|Not Run|Skipped" "$out/ctest-gpu.log" | head -40
grep -E "^(ok|FAILED|skipped):" "$out/ctest-gpu.log" | head -80
# The op tests' margins (worst error over its bound per comparison; 1 = at the bound): the closest.
timeout 300 "$b/tests/models/models_cuda_test" >"$out/models_cuda_test.log" 2>&1
echo "models_cuda_test: rc $?"
# The WMMA kernels (Note [Two tensor-core kernels]): opt-in beside the default flash-attention 2 ones.
STRATA_ATTENTION_TC=wmma timeout 120 "$b/tests/models/models_cuda_test" --gtest_filter='*ttention*' \
  >"$out/models_cuda_test.wmma.log" 2>&1
echo "attention tests with STRATA_ATTENTION_TC=wmma: rc $? $(grep -E 'PASSED|FAILED' "$out/models_cuda_test.wmma.log" | head -3)"
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
      fi
    done
  done
fi
# Offload on cuda is refused until it runs right (engine/zero_engine.cc); STRATA_CUDA_OFFLOAD=1 reproduces it.
stamp "the demo on cuda (configs/demo.json: ZeRO-3, bf16, state on NVMe, the GPU capped at 6 MiB; STRATA_CUDA_OFFLOAD=1)"
(cd "$out" && mkdir -p demo && cd demo && STRATA_CUDA_OFFLOAD=1 timeout 120 "$b/bin/strata" train --config "$here/../configs/demo.json" \
   --set strata.device.kind='"cuda"' --steps 20 --summary-json summary.json >train.log 2>&1)
echo "demo on cuda: rc $?"; tail -4 "$out/demo/train.log"
if [[ " $* " != *" --no-bench "* ]]; then
  stamp "gpu-bench"
  bash "$here/gpu-bench.sh" "$b/bin/strata" "$out/bench"
fi
stamp "done"
