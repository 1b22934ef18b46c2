#!/usr/bin/env bash
# End-to-end tests of `strata train` with its state offloaded (engine/zero_engine.h, Note [Offload] in
# engine/zero_engine.h):
#  1. exact mode, 10 steps, 4 units per step: byte-identical weight files between the in-memory
#     run and optimizer cpu|nvme x parameters cpu|nvme at stage 3, world 1 and 2, with the update
#     waiting (gradient clipping on) and overlapped with backward (clipping off); tiled = untiled;
#     and each step copies pageable host memory only for the micro-batches' tokens and losses, and
#     pins no host memory;
#  1a. one micro-batch per step in bf16/fp16: in memory (the 16-bit gradient read as it is) = offloaded;
#  2. a model whose state is >= 16x the sim device trains with everything on NVMe, and its loss falls;
#     a block too large for the device is tiled automatically and gives the untiled weights;
#  3. with everything on NVMe the process's peak RSS does not grow with the model (3x the layers);
#  4. a config that cannot fit is refused before any work, with the numbers.
# Usage: train_offload_test.sh STRATA_BINARY TINY_CONFIG DEMO_CONFIG MPIEXEC WORKDIR [SANITIZERS]
# (SANITIZERS: the build's STRATA_SANITIZE; the RSS check is skipped under a sanitizer, whose
# quarantine and shadow memory make resident memory grow with every allocation.)
set -euo pipefail
strata="$1"; tiny="$2"; demo="$3"; mpiexec="$4"; work="$5"; sanitizers="${6:-}"
source "$(dirname "$0")/lib.sh"
fresh_workdir "$work"
mpi_launcher "$mpiexec"
json_field() {  # file, key -> number
  sed -n "s/.*\"$2\": *\([0-9.eE+-]*\).*/\1/p" "$1" | head -1
}
offload() {  # optimizer device, param device
  echo --set zero_optimization.offload_optimizer.device="\"$1\"" --set zero_optimization.offload_optimizer.nvme_path="\"nvme\"" \
    --set zero_optimization.offload_param.device="\"$2\"" --set zero_optimization.offload_param.nvme_path="\"nvme\""
}

# See Note [Pinning while streams run] in core/device/sim_device.cc.
# On cuda a page-lock may wait for every stream, so the engine
# pins its host buffers before the first step's work; no step pins.
check_pins() {  # summary json, description
  local pins
  pins=$(python3 -c "import json, sys; print(sorted(set(json.load(open(sys.argv[1]))['host_pins_per_step'])))" "$1")
  [ "$pins" = "[0]" ] && ok "$2: no step pins host memory" || bad "$2: host pins per step: $pins (expected [0])"
}

# 1. Exact mode.
for clip in 1.0 0; do
  common=(--log-level warn train --config "$tiny" --steps 10 --set train_micro_batch_size_per_gpu=1 --set gradient_clipping=$clip)
  "$strata" "${common[@]}" --set gradient_accumulation_steps=4 --set zero_optimization.stage=0 --save-weights "ref.c$clip.st" \
    --summary-json "ref.c$clip.json"
  check_pins "ref.c$clip.json" "in memory, clipping $clip"
  for opt in cpu nvme; do
    for param in cpu nvme; do
      # shellcheck disable=SC2046
      "$strata" "${common[@]}" --set gradient_accumulation_steps=4 $(offload $opt $param) --save-weights "w1.$opt.$param.c$clip.st" \
        --summary-json "w1.$opt.$param.c$clip.json"
      compare "ref.c$clip.st" "w1.$opt.$param.c$clip.st" "world 1, optimizer $opt, params $param, clipping $clip"
      # shellcheck disable=SC2046
      "${mpi[@]}" -np 2 "$strata" "${common[@]}" --set gradient_accumulation_steps=2 $(offload $opt $param) \
        --save-weights "w2.$opt.$param.c$clip.st"
      compare "ref.c$clip.st" "w2.$opt.$param.c$clip.st" "world 2, optimizer $opt, params $param, clipping $clip"
      overlapped=$(json_field "w1.$opt.$param.c$clip.json" overlapped_chunk_updates)
      updates=$(json_field "w1.$opt.$param.c$clip.json" optimizer_chunk_updates)
      if [ "$clip" = 0 ]; then
        [ "$overlapped" = "$updates" ] && [ "$updates" -gt 0 ] && ok "clipping off: all $updates chunk updates overlapped backward" ||
          bad "clipping off: $overlapped of $updates chunk updates overlapped backward"
      else
        [ "$overlapped" = 0 ] && ok "clipping on: the update waits for the norm" || bad "clipping on: $overlapped overlapped updates"
      fi
      # See Note [Pageable copies] in core/device/sim_stream.cc.
      # Per micro-batch the tokens and targets go up and the losses come back
      # from pageable host memory (each a host synchronization on cuda the design names); the
      # engine's step, offload included, copies only pinned memory.
      pageable=$(python3 -c "import json, sys; print(sorted(set(json.load(open(sys.argv[1]))['pageable_copies_per_step'])))" \
        "w1.$opt.$param.c$clip.json")
      [ "$pageable" = "[12]" ] && ok "optimizer $opt, params $param: 12 pageable copies per step (3 per micro-batch)" ||
        bad "optimizer $opt, params $param: pageable copies per step $pageable, expected [12] (3 per micro-batch)"
      check_pins "w1.$opt.$param.c$clip.json" "optimizer $opt, params $param, clipping $clip"
    done
  done
done
if cmp -s ref.c1.0.st ref.c0.st; then bad "clipping on and off wrote identical weights (the comparison proves nothing)"; fi
# Tiled (every block in 4 row tiles; a per-layer mix at world 2) = untiled, all on NVMe.
common=(--log-level warn train --config "$tiny" --steps 10 --set train_micro_batch_size_per_gpu=1)
# shellcheck disable=SC2046
"$strata" "${common[@]}" --set gradient_clipping=1.0 --set gradient_accumulation_steps=4 $(offload nvme nvme) \
  --set 'strata.tiling={"default": 4}' --save-weights tiled.w1.st
compare ref.c1.0.st tiled.w1.st "world 1, tiled 4, optimizer and params nvme (waiting)"
# shellcheck disable=SC2046
"${mpi[@]}" -np 2 "$strata" "${common[@]}" --set gradient_clipping=0 --set gradient_accumulation_steps=2 $(offload nvme nvme) \
  --set 'strata.tiling={"default": {"mlp": 2}, "layers": {"1": 8}}' --save-weights tiled.w2.st
compare ref.c0.st tiled.w2.st "world 2, tiled per layer, optimizer and params nvme (overlapped)"

# 1a. One micro-batch per step in bf16 and fp16 (Note [One unit's gradient as it is] in engine/state_home_device.cc):
# the in-memory run's norm and update read the reduced 16-bit gradient as it is, the offloaded run widens it to
# fp32 on the host first; widening is exact, so the weights must be the same bytes (world 1 at
# stage 0, world 2 at stage 2: whole and sharded gradients; clipping on, so the norm counts; fast
# mode, as exact mode is fp32).
for prec in bf16 fp16; do
  common=(--log-level warn train --config "$tiny" --steps 6 --set gradient_accumulation_steps=1 --set gradient_clipping=0.05
          --set "$prec.enabled=true" --set strata.exact=false)
  "$strata" "${common[@]}" --set zero_optimization.stage=0 --save-weights "one.$prec.st"
  # shellcheck disable=SC2046
  "$strata" "${common[@]}" --set zero_optimization.stage=1 $(offload cpu none) --save-weights "one.$prec.cpu.st"
  compare "one.$prec.st" "one.$prec.cpu.st" "$prec, one micro-batch per step: the 16-bit gradient read as it is = widened (world 1)"
  "${mpi[@]}" -np 2 "$strata" "${common[@]}" --set zero_optimization.stage=2 --save-weights "one2.$prec.st"
  # shellcheck disable=SC2046
  "${mpi[@]}" -np 2 "$strata" "${common[@]}" --set zero_optimization.stage=2 $(offload cpu none) --save-weights "one2.$prec.cpu.st"
  compare "one2.$prec.st" "one2.$prec.cpu.st" "$prec, one micro-batch per step: the 16-bit gradient read as it is = widened (world 2, stage 2)"
done
if cmp -s one.bf16.st one.fp16.st; then bad "bf16 and fp16 wrote identical weights (the comparison proves nothing)"; fi

# 1b. Spill across tiers: "auto" sections under a host budget that holds part of the state put the
# rest on NVMe chunk by chunk, say so before step 1, stay inside the budget, and keep the bits of
# the in-memory run (world 1 and 2; fp32 exact mode on the demo model, whose state is 28 MiB).
spill=(--log-level info train --config "$demo" --steps 3 --set strata.exact=true --set bf16.enabled=false
       --set train_micro_batch_size_per_gpu=1 --set strata.data.seq_len=32 --set strata.metrics='""' --set gradient_clipping=1.0)
"$strata" "${spill[@]}" --set zero_optimization.stage=0 --set zero_optimization.offload_optimizer.device='"none"' \
  --set zero_optimization.offload_param.device='"none"' --set strata.device.memory=64MiB --save-weights spill.ref.st >/dev/null 2>&1
# shellcheck disable=SC2046
"$strata" "${spill[@]}" $(offload auto auto) --set strata.offload.host_budget='"40MiB"' --save-weights spill.w1.st \
  --summary-json spill.w1.json --drive-tbw 600 >spill.w1.log 2>&1
compare spill.ref.st spill.w1.st "world 1, optimizer and params auto, spilled past a 40 MiB host budget"
grep -q "placement: past the host budget 40.00 MiB, [1-9][0-9]* of [0-9]* chunks of optimizer state are on NVMe" spill.w1.log &&
  ok "the plan says how many chunks spill" || { cat spill.w1.log; bad "no spill line before step 1"; }
peak=$(json_field spill.w1.json peak_host_bytes); written=$(json_field spill.w1.json nvme_bytes_written)
[ "$peak" -le $((40 << 20)) ] && [ "$peak" -gt 0 ] && ok "peak host $peak bytes <= the 40 MiB budget" || bad "peak host $peak bytes (budget 40 MiB)"
[ "${written%.*}" -gt 0 ] && ok "spilled chunks were written to NVMe" || bad "nothing written to NVMe ($written)"
# SSD wear: the bytes per step, and the days 600 TBW on one drive lasts at that rate.
per_step=$(json_field spill.w1.json nvme_bytes_written_per_step); per_day=$(json_field spill.w1.json nvme_tb_written_per_day)
days=$(json_field spill.w1.json days_to_rated_endurance)
awk -v b="$per_step" -v t="$per_day" -v d="$days" 'BEGIN { exit !(b > 0 && t > 0 && d > 0 && (d * t - 600) ^ 2 < 1e-6) }' &&
  grep -q "NVMe wear: .* written per step by all ranks = .* TB per day over 1 drive(s); rated 600 TBW per drive: [0-9]* days" spill.w1.log &&
  ok "wear: $per_step bytes per step, $per_day TB/day, $days days to 600 TBW" || bad "wear: $per_step, $per_day, $days"
# shellcheck disable=SC2046
"${mpi[@]}" -np 2 "$strata" "${spill[@]}" --set gradient_accumulation_steps=2 $(offload auto auto) \
  --set strata.offload.host_budget='"40MiB"' --save-weights spill.w2.st >/dev/null 2>&1
compare spill.ref.st spill.w2.st "world 2, optimizer and params auto, spilled past a 40 MiB host budget"
# World 2 on a device so small that gathers are evicted and refetched: every rank must take the same
# eviction and prefetch decisions (Note [Deterministic prefetch] in engine/param_fetcher.cc), or their collectives pair
# up wrongly and the run hangs (it did in about half of these runs before the allocator waited for
# every queued free before deciding).
for i in 1 2 3; do
  # shellcheck disable=SC2046
  timeout 120 "${mpi[@]}" -np 2 "$strata" "${spill[@]}" --set gradient_accumulation_steps=2 $(offload nvme nvme) \
    --save-weights "tight.w2.$i.st" >/dev/null 2>&1 && rc=0 || rc=$?
  [ "$rc" = 0 ] && compare spill.ref.st "tight.w2.$i.st" "world 2 under device-memory pressure, run $i" ||
    bad "world 2 under device-memory pressure, run $i: exit $rc (124: hung)"
done

# 2. State >= 16x the device, everything on NVMe: it trains and the loss falls.
"$strata" --log-level warn train --config "$demo" --steps 12 --set strata.device.memory=1792KiB \
  --set train_micro_batch_size_per_gpu=1 --set strata.data.seq_len=32 --set strata.metrics='""' \
  --set zero_optimization.stage3_max_live_parameters=2e5 --set zero_optimization.stage3_prefetch_bucket_size=2e5 \
  $(offload nvme nvme) --summary-json big.json
first=$(json_field big.json first_loss); last=$(json_field big.json last_loss)
state=$(awk -v a="$(json_field big.json model_state_bytes)" -v b="$(json_field big.json device_capacity_bytes)" 'BEGIN { printf "%.1f", a / b }')
awk -v s="$state" 'BEGIN { exit !(s >= 16) }' && ok "model state is ${state}x the device" || bad "model state is only ${state}x the device"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }' && ok "loss fell $first -> $last" || bad "loss did not fall: $first -> $last"

# 2b. A block that does not fit the device is tiled automatically, with the same weights.
small=(--log-level warn train --config "$demo" --steps 3 --set train_micro_batch_size_per_gpu=1 --set strata.data.seq_len=32
       --set strata.metrics='""' $(offload nvme nvme))
"$strata" "${small[@]}" --set strata.device.memory=4MiB --save-weights untiled.st
"$strata" "${small[@]}" --set strata.device.memory=1280KiB --save-weights autotiled.st --summary-json autotiled.json
compare untiled.st autotiled.st "automatic tiling on a 1.25 MiB device = untiled on 4 MiB"

# 3. Host memory does not grow with the model when everything is on NVMe.
if [ -n "$sanitizers" ]; then
  echo "skipped: peak RSS check (built with sanitizers '$sanitizers': their quarantine grows the resident set)"
else
  for layers in 4 12; do
    "$strata" --log-level warn train --config "$demo" --steps 2 --set strata.metrics='""' --set strata.model.n_layers=$layers \
      $(offload nvme nvme) --summary-json "rss$layers.json"
  done
  rss4=$(json_field rss4.json peak_rss_bytes); rss12=$(json_field rss12.json peak_rss_bytes)
  pinned=$(json_field rss12.json pinned_bytes)
  echo "peak RSS: 4 layers $rss4, 12 layers $rss12 bytes (pinned staging $pinned)"
  # 8 more layers of 128-wide blocks are 1.6M parameters = 28 MiB of model state; allow 8 MiB of drift.
  awk -v a="$rss4" -v b="$rss12" 'BEGIN { exit !(b - a < 8 * 1048576) }' && ok "peak RSS flat in model size" ||
    bad "peak RSS grew by $(( (rss12 - rss4) / 1048576 )) MiB for 3x the layers"
fi

# 4. A config that cannot fit is refused before any work.
rm -rf refused && mkdir refused && cd refused
if "$strata" --log-level warn train --config "$demo" --steps 2 --set strata.device.memory=512KiB $(offload nvme nvme) \
  --set strata.metrics='"m.jsonl"' 2> err.txt; then
  bad "a config needing more than the device was accepted"
else
  grep -q "cannot fit the device" err.txt && grep -q "512.00 KiB" err.txt && ok "unfit config refused: $(head -c 200 err.txt)" ||
    bad "unexpected error: $(cat err.txt)"
  [ ! -e m.jsonl ] && [ ! -e nvme ] && ok "nothing was written before the refusal" || bad "files were written before the refusal"
fi
cd ..
exit $fail
