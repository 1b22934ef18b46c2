#!/usr/bin/env bash
# The `strata` command under hostile use, end to end: a mistyped subcommand or option is named with
# the nearest known one; absurd-but-well-formed values (--steps -1, a byte size in bits, a modeled
# link that never finishes a step) are refused naming the thing and the fix; eval's --batch-size is
# named as a flag, not as a config key it does not have; `strata train` runs from any directory on
# the built-in configs/demo.json; `bench model` picks a sequence length the model supports; a full
# disk under strata.metrics fails the run naming the path; a FIFO, directory or device as --config
# is refused saying what it is. Every refusal exits 1.
# Usage: cli_trust_test.sh STRATA_BINARY CONFIG WORKDIR
set -euo pipefail
strata="$1"; config="$2"; work="$3"
source "$(dirname "$0")/lib.sh"
fresh_workdir "$work"
expect_error() {  # name, expected text (fixed string), command...
  local name="$1" text="$2"; shift 2
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  check "$name (exit $rc)" "[ $rc -eq 1 ] && echo \"\$out\" | grep -qF -- \"$text\""
  [ $rc -eq 1 ] && echo "$out" | grep -qF -- "$text" || echo "$out" | tail -3
}

# Mistyped names.
expect_error "a mistyped subcommand names the nearest" "'trian' is not a command of strata; did you mean 'train'?" \
  "$strata" trian
expect_error "a mistyped nested subcommand names the nearest" "did you mean 'model'?" "$strata" bench mdel
# strata.parallel: refused before any work, naming the key and the valid choices (issue 17).
# (estimate checks the layout as train does, and plans any world size without launching ranks.)
expect_error "a tensor split the model's heads do not allow" "strata.parallel.tensor = 3 does not split model 'tiny' evenly" \
  "$strata" estimate --config "$config" --world 3 --set strata.parallel.tensor=3
expect_error "its valid choices" "valid choices: 1, 2, 4" "$strata" estimate --config "$config" --world 3 --set strata.parallel.tensor=3
expect_error "a layout that does not divide the world" "valid choices for 1 ranks: (tensor 1, pipeline 1)" \
  "$strata" train --config "$config" --steps 1 --set strata.parallel.pipeline=2
# Replicated KV heads need slices of whole query heads, and KV heads must split or be split evenly:
# each refused by name.
expect_error "tensor slices that cut a query head (KV heads on several ranks)" \
  "with more tensor ranks than the 2 KV heads, a multiple of them dividing the 4 attention heads (Note [Replicated KV heads] in models/tensor_parallel.h); valid choices: 4" \
  "$strata" estimate --config "$config" --world 4 --set strata.parallel.tensor=4 --set gradient_clipping=0 \
  --set strata.model='"tiny-llama"' --set strata.parallel.tensor_slices=8
expect_error "tensor ranks that neither split the KV heads nor are a multiple of them" \
  "or KV heads fewer than the ranks divide it" \
  "$strata" estimate --config "$config" --world 4 --set strata.parallel.tensor=4 --set gradient_clipping=0 \
  --set strata.model='{"name": "kv3", "arch": "llama", "vocab_size": 256, "max_seq_len": 64, "n_layers": 2, "d_model": 48, "n_heads": 12, "n_kv_heads": 3, "ffn_hidden": 64}'
expect_error "tensor slices that do not nest" "strata.parallel.tensor_slices = 3 cannot slice model 'tiny'" \
  "$strata" train --config "$config" --steps 1 --set strata.parallel.tensor_slices=3
expect_error "tiling beside tensor slices" "strata.tiling beside tensor parallelism" \
  "$strata" train --config "$config" --steps 1 --set strata.parallel.tensor_slices=2 --set strata.tiling='{"default": 2}'
expect_error "an unknown schedule" "strata.parallel.schedule" "$strata" train --config "$config" --set strata.parallel.schedule='"zb"'
expect_error "an unknown subcommand lists the commands" "the commands are train, doctor, eval, generate, estimate, simulate, data, bench, ckpt" \
  "$strata" frobnicate
expect_error "data prepare without a tokenizer folder" "tokenizer folder '$work/no-model' does not exist" \
  "$strata" data prepare --tokenizer "$work/no-model" --input "$config" --out "$work/prepared"
expect_error "data prepare with weights not matching inputs" "--weight was given 2 times for 1 --input files" \
  "$strata" data prepare --tokenizer "$work" --input "$config" --weight 1 --weight 2 --out "$work/prepared"
expect_error "data tokenize with two inputs" "give exactly one of --text FILE and --jsonl FILE" \
  "$strata" data tokenize --tokenizer "$work" --text "$config" --jsonl "$config"
expect_error "an unknown option names the nearest" "strata train: unknown option '--stepz'; did you mean '--steps'?" \
  "$strata" train --stepz 3
expect_error "no subcommand lists the commands" "a command is needed: train" "$strata"
expect_error "a missing required option names it" "strata eval: --model is required" "$strata" eval

# Absurd values.
expect_error "--steps -1 is refused, not replaced by strata.steps" "--steps -1: the number of optimizer steps must be >= 0" \
  "$strata" train --config "$config" --steps -1
expect_error "a byte size in bits is refused with the byte spellings" \
  "strata.offload.pinned_buffer: '64Mb' is not a byte size: a lowercase 'b' means bits; write 64MiB" \
  "$strata" train --config "$config" --steps 0 --set strata.offload.pinned_buffer=64Mb
expect_error "a flag's byte size in bits is refused too" "--size: '8Mb' is not a byte size" \
  "$strata" bench io --dir "$work" --size 8Mb
expect_error "a modeled link slower than 0.01 GB/s is refused" "strata.device.h2d_gbps: 1e-09 GB/s is too slow" \
  "$strata" train --config "$config" --steps 0 --set strata.device.h2d_gbps=1e-9

# The built-in default config, from a directory without configs/: --steps 0 builds the whole run.
mkdir -p elsewhere
out=$(cd elsewhere && "$strata" --log-level info train --steps 0 2>&1) && rc=0 || rc=$?
check "strata train without --config runs from any directory (exit $rc)" \
  "[ $rc -eq 0 ] && echo \"\$out\" | grep -q 'model demo-gpt'"
[ $rc -eq 0 ] || echo "$out" | tail -3

# eval sizes its device from --batch-size: an impossible one is named as the flag.
"$strata" --log-level warn train --config "$config" --steps 0 --save-weights init.safetensors > init.log 2>&1 ||
  { cat init.log; exit 1; }
out=$("$strata" eval --model tiny --weights init.safetensors --data strata-run/data/val.tok --seq-len 32 \
  --batch-size 2000000000 2>&1) && rc=0 || rc=$?
check "eval --batch-size beyond the windows evaluates them all (exit $rc)" "[ $rc -eq 0 ] && echo \"\$out\" | grep -q windows"
check "eval never names a config key it does not have" "! echo \"\$out\" | grep -q strata.device"
expect_error "eval --batch-size 0 is refused" "--batch-size must be at least 1" \
  "$strata" eval --model tiny --weights init.safetensors --data strata-run/data/val.tok --batch-size 0

# bench model without --seq-len: the tiny model's max_seq_len is 64, below the old fixed 256.
b=$("$strata" --log-level warn bench model --model tiny --steps 1 --warmup 0 --json 2>&1) && rc=0 || rc=$?
check "bench model picks a sequence length the model supports (exit $rc)" "[ $rc -eq 0 ] && echo '$b' | grep -q '\"seq_len\":64'"

# A full disk under strata.metrics: reported with the path, and the run exits 1.
if [ -w /dev/full ]; then
  out=$("$strata" train --config "$config" --steps 2 --set strata.metrics=/dev/full 2>&1) && rc=0 || rc=$?
  check "a failed metrics write fails the run naming the path (exit $rc)" \
    "[ $rc -eq 1 ] && echo \"\$out\" | grep -q \"strata.metrics: writing .* to '/dev/full' failed\""
fi
# The device choice (issue 15): a bad --device names the flag; where no GPU is usable, cuda is
# refused naming the key or flag and the fix (on a GPU machine train_cuda_cli checks cuda instead).
expect_error "a bad --device names the flag and the choices" "--device 'gpu' is not one of sim, cuda, auto" \
  "$strata" bench model --model tiny --steps 1 --device gpu
if ! "$strata" --log-level warn bench model --model tiny --steps 1 --warmup 0 --device cuda >/dev/null 2>&1; then
  no_gpu() {  # name, expected text (fixed string, may hold quotes), command...
    local name="$1" text="$2"; shift 2
    local out rc=0
    out=$("$@" 2>&1) || rc=$?
    if [ $rc -eq 1 ] && grep -qF -- "$text" <<<"$out"; then echo "ok: $name"
    else echo "FAILED: $name (exit $rc)"; echo "$out" | tail -3; fail=1; fi
  }
  no_gpu "cuda without a usable GPU names the config key and the fix" \
    'strata.device.kind is "cuda", but no cuda device is usable here' \
    "$strata" train --config "$config" --steps 1 --set strata.device.kind='"cuda"'
  no_gpu "cuda without a usable GPU names the flag and the fix" 'set --device to "sim"' \
    "$strata" bench model --model tiny --steps 1 --device cuda
fi
# Configs say what they mean (issue 39): a repeated key, memory 0, a fractional layer count, a key
# the architecture does not read and pinned pools past the host budget are refused, not reinterpreted.
printf '{"train_micro_batch_size_per_gpu": 2, "strata": {"model": "tiny"},\n "strata": {"steps": 1}}\n' > dup.json
expect_error "a repeated key is refused, not the first section dropped" \
  'appears twice in the top-level object; JSON keeps only the last' "$strata" train --config dup.json
printf '{"strata": {"data": {"seq_len": 16, "seq_len": 32}}}\n' > dup2.json
expect_error "... also inside a section" 'appears twice in the object at strata.data' \
  "$strata" train --config dup2.json
expect_error "strata.device.memory 0 is refused, not 1 GiB" "strata.device.memory: 0 B is no device memory" \
  "$strata" train --config "$config" --steps 1 --set strata.device.memory=0
expect_error "n_layers 1.5 is refused, not truncated" "model config key 'n_layers' is 1.5, not a whole number" \
  "$strata" train --config "$config" --steps 1 \
  --set strata.model='{"name": "tiny", "n_layers": 1.5}'
"$strata" --log-level warn train --config "$config" --steps 0 --set strata.model='{"name": "tiny", "d_model": 32.0}' \
  >whole.log 2>&1 && rc=0 || rc=$?
check "a whole number written 32.0 is still 32 (exit $rc)" "[ $rc -eq 0 ]"
expect_error "rope_theta on a gpt2 model is refused" "'rope_theta' applies to llama models" \
  "$strata" train --config "$config" --steps 1 --set strata.model='{"name": "tiny", "rope_theta": 500000}'
expect_error "pinned pools past the \"auto\" host budget are refused before pinning" \
  'but the pinned staging pools take' "$strata" train --config "$config" --steps 1 \
  --set zero_optimization.offload_optimizer.device='"cpu"' --set strata.offload.pinned_buffer='"1000TiB"' \
  --set zero_optimization.sub_group_size=1e12
# Messages (issue 39): a file-system failure names the path and the cause with exit 1, never
# "unexpected error"; each value is judged by what it is.
touch plainfile
expect_error "a checkpoint directory that is a file" "strata.checkpoint.dir 'plainfile' is a file, not a directory" \
  "$strata" train --config "$config" --steps 1 --set strata.checkpoint.dir='"plainfile"'
long=$(printf 'x%.0s' $(seq 1 300))
expect_error "a path too long names it and the cause" "File name too long" \
  "$strata" train --config "$config" --steps 1 --set strata.checkpoint.dir="\"$long\""
expect_error "ckpt verify on a file says it is a file" "plainfile is a file, not a checkpoint" \
  "$strata" ckpt verify plainfile
expect_error "a byte size past 2^64 is too large, not malformed" "'99999999TiB' is too large" \
  "$strata" train --config "$config" --steps 1 --set strata.offload.pinned_buffer='"99999999TiB"'
expect_error "AUTO suggests auto" "is written in lower case" \
  "$strata" train --config "$config" --steps 1 --set zero_optimization.stage='"AUTO"'
expect_error "an empty data path says empty" "strata.data.train: is empty" \
  "$strata" train --config "$config" --steps 1 --set strata.data.train='""'
expect_error "n_kv_heads 0 says so" "n_kv_heads is 0 (0: missing)" "$strata" train --config "$config" --steps 1 \
  --set strata.model='{"name": "kv0", "arch": "llama", "vocab_size": 256, "max_seq_len": 64, "n_layers": 2, "d_model": 32, "n_heads": 4, "n_kv_heads": 0, "ffn_hidden": 64}'
expect_error "a tile count past its cap names the cap" "1000000 tiles exceed the" \
  "$strata" train --config "$config" --steps 1 --set strata.tiling='{"default": 1000000}'
out=$("$strata" doctor --need 1PiB 2>&1) && rc=0 || rc=$?
check "doctor --need reads the units doctor prints (exit $rc)" "! echo \"\$out\" | grep -q 'not a byte size'"
# Every file read whole is read one way (issue 39): a FIFO as --config does not block forever, a
# directory or a device is named as such, not "unexpected end of input".
mkfifo config.fifo
expect_error "a FIFO as --config is refused, not waited on" "config file config.fifo is not a regular file" \
  timeout 20 "$strata" train --config config.fifo --steps 1
expect_error "a directory as --config is named as one" "config file $work is a directory" \
  "$strata" train --config "$work" --steps 1
expect_error "/dev/zero as --config is named as a device" "config file /dev/zero is not a regular file" \
  timeout 20 "$strata" train --config /dev/zero --steps 1
expect_error "--save-weights into a missing directory is refused before training" "directory '$work/nope' does not exist" \
  "$strata" train --config "$config" --steps 2 --save-weights "$work/nope/w.safetensors"
# An empty path given to a flag is refused (trust39's sweep): `--config ""` (an unset variable)
# trained the built-in demo config, `--save-weights ""` wrote nothing, both with exit 0.
for flag in --config --save-weights --resume --summary-json --config-fragment; do
  expect_error "train $flag \"\" is refused, not taken as not given" "$flag: an empty path" \
    "$strata" train --config "$config" --steps 1 "$flag" ""
done
expect_error "estimate --machine \"\" is refused" "--machine: an empty path" "$strata" estimate --config "$config" --machine ""
expect_error "simulate --config \"\" is refused" "--config: an empty path" "$strata" simulate --config ""
# The nccl communicator on the sim device is refused at world 1 too, not ignored (trust39's sweep).
expect_error "the nccl communicator on the sim device at world 1" 'needs the cuda device, and this run is on sim' \
  "$strata" train --config "$config" --steps 1 --set strata.parallel.communicator='"nccl"'
# Every output is opened one way: a FIFO that no process reads is refused, not waited on forever
# (strata.metrics on such a FIFO hung; trust39's sweep).
mkfifo metrics.fifo
expect_error "strata.metrics a FIFO nobody reads is refused, not waited on" "is a FIFO that no process reads" \
  timeout 30 "$strata" train --config "$config" --steps 1 --set strata.metrics='"metrics.fifo"'
expect_error "--summary-json a FIFO nobody reads" "is a FIFO that no process reads" \
  timeout 30 "$strata" train --config "$config" --steps 1 --summary-json metrics.fifo
exit $fail
