#!/usr/bin/env bash
# Soak of `strata train`: 300 steps of the tiny model with the optimizer state and the parameters on
# NVMe and a checkpoint every 20 steps (keep 2). What a long run holds must not grow with the steps
# and the checkpoints taken. From the per-step metrics lines (train/trainer_report.cc: rss_bytes,
# open_fds, swap_file_bytes), step 40 (after the first two checkpoints) against every later step
# to 300:
#   open file descriptors: between checkpoints, the fewest of every stretch of steps between two
#     checkpoints equals step 41's count (a descriptor leaked per step or per checkpoint raises
#     it); on the steps writing a checkpoint (which also hold the checkpoint's data file and I/O
#     ring while the optimizer writes into it: engine/state_home_tiered_state.cc, Note [Checkpoint
#     capture]), the fewest over all of them equals step 40's count. Any step may sample up to 2
#     more while the background deletion of a retired checkpoint (checkpoint/checkpoint_retention.cc,
#     Note [Pruning in the background] in checkpoint/checkpoint_retention.cc) holds directory streams open; more than
# that fails too;
#   swap file bytes on disk: the same at every step, and > 0 (the files are preallocated);
#   resident memory: grows less than two checkpoint data files between step 40 and step 300. A
#     healthy run grew 0-270 KiB here (allocator and thread noise) against a 768 KiB data file; a
#     buffer of half a data file leaked per save (13 saves in between) grew it 3.4 MB. Smaller leaks
#     can hide in free memory the allocator already holds resident: the descriptor and swap checks
#     are exact, this one is coarse. Skipped under sanitizers, whose quarantine grows the resident set.
# At the end: exactly `keep` checkpoints (no temporary left), `latest` names the last step, the last
# one verifies, and the swap files are gone.
# Usage: train_soak_test.sh STRATA_BINARY TINY_CONFIG WORKDIR [SANITIZERS]
set -euo pipefail
strata="$1"; tiny="$2"; work="$3"; sanitizers="${4:-}"
source "$(dirname "$0")/lib.sh"
fresh_workdir "$work"
steps=300; interval=20; keep=2; early=40
metric() {  # step, key -> the key's number in that step's metrics line
  sed -n "/\"step\":$1[,}]/s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p" metrics.jsonl
}
range() {  # key, which (all|ckpt|between) -> "min max" over those steps from $early on
  awk -v early="$early" -v key="\"$1\":" -v which="${2:-all}" -v interval="$interval" '
    { s = $0; sub(/.*"step":/, "", s); step = s + 0
      v = $0; i = index(v, key); if (i == 0 || step < early) next
      if (which == "ckpt" && step % interval != 0) next
      if (which == "between" && step % interval == 0) next
      v = substr(v, i + length(key)) + 0
      if (n++ == 0) { lo = v; hi = v } else { if (v < lo) lo = v; if (v > hi) hi = v } }
    END { print lo, hi }' metrics.jsonl
}

start=$SECONDS
if ! "$strata" --log-level info train --config "$tiny" --steps "$steps" \
  --set 'zero_optimization.offload_optimizer.device="nvme"' --set 'zero_optimization.offload_optimizer.nvme_path="nv"' \
  --set 'zero_optimization.offload_param.device="nvme"' --set 'zero_optimization.offload_param.nvme_path="nv"' \
  --set 'strata.checkpoint.dir="ck"' --set "strata.checkpoint.interval_steps=$interval" \
  --set "strata.checkpoint.keep=$keep" --set 'strata.metrics="metrics.jsonl"' >train.log 2>&1; then
  echo "FAILED: the soak run failed"; tail -20 train.log; exit 1
fi
echo "the soak run took $((SECONDS - start)) s"

lines=$(wc -l <metrics.jsonl)
[ "$lines" = "$steps" ] && ok "$lines metrics lines" || bad "$lines metrics lines, expected $steps"
saves=$(grep -c "checkpoint of step" train.log || true)
[ "$saves" = $((steps / interval)) ] && ok "$saves checkpoints written" ||
  bad "$saves checkpoints written, expected $((steps / interval))"

flat() {  # key, description[, which, first step]: its value at the first step (default $early) is > 0 and the
          # same at every later step of that kind (all, ckpt: steps writing a checkpoint, between: the others)
  local at_early at_last lo hi text which="${3:-all}" first="${4:-$early}"
  at_early=$(metric "$first" "$1"); at_last=$(metric "$steps" "$1")
  read -r lo hi <<<"$(range "$1" "$which")"
  text="$2: $at_early at step $first, $at_last at step $steps (min $lo, max $hi over $which steps from $early on)"
  if [ -n "$at_early" ] && [ "$at_early" -gt 0 ] && [ "$lo" = "$at_early" ] && [ "$hi" = "$at_early" ]; then
    ok "flat $text"
  else
    bad "not flat $text"
  fi
}
fds_flat() {  # which (between|ckpt), description, first step: per stretch, the fewest descriptors equal the
             # first step's count, and no step holds more than 2 above it (see the header)
  local first at_first text lo_min hi_min hi
  first="$3"; at_first=$(metric "$first" open_fds)
  read -r lo_min hi_min hi <<<"$(awk -v early="$early" -v which="$1" -v interval="$interval" '
    { s = $0; sub(/.*"step":/, "", s); step = s + 0
      v = $0; i = index(v, "\"open_fds\":"); if (i == 0 || step < early) next
      if (which == "ckpt" && step % interval != 0) next
      if (which == "between" && step % interval == 0) next
      v = substr(v, i + length("\"open_fds\":")) + 0
      k = which == "ckpt" ? 0 : int(step / interval)
      if (!(k in m) || v < m[k]) m[k] = v
      if (n++ == 0 || v > hi) hi = v }
    END { c = 0; for (k in m) { if (c++ == 0) { lo = m[k]; up = m[k] } else { if (m[k] < lo) lo = m[k]; if (m[k] > up) up = m[k] } }
          print lo, up, hi }' metrics.jsonl)"
  text="$2: $at_first at step $first; fewest per stretch from $lo_min to $hi_min, most $hi ($1 steps from $early on)"
  if [ -n "$at_first" ] && [ "$at_first" -gt 0 ] && [ "$lo_min" = "$at_first" ] && [ "$hi_min" = "$at_first" ] &&
     [ "$hi" -le $((at_first + 2)) ]; then
    ok "flat $text"
  else
    bad "not flat $text"
  fi
}
fds_flat between "open file descriptors between checkpoints" $((early + 1))
fds_flat ckpt "open file descriptors of steps writing a checkpoint" "$early"
flat swap_file_bytes "swap file bytes on disk"

ckpt_bytes=$(stat -c %s "ck/$(printf step-%08d "$steps")/rank-00000.bin" 2>/dev/null || echo 0)
rss_early=$(metric "$early" rss_bytes); rss_last=$(metric "$steps" rss_bytes)
echo "resident set: $rss_early bytes at step $early, $rss_last at step $steps (a checkpoint data file: $ckpt_bytes)"
if [ -n "$sanitizers" ]; then
  echo "skipped: RSS check (built with sanitizers '$sanitizers': their quarantine grows the resident set)"
elif [ -n "$rss_early" ] && [ "$rss_early" -gt 0 ] && [ $((rss_last - rss_early)) -lt $((2 * ckpt_bytes)) ]; then
  ok "resident set flat: grew $((rss_last - rss_early)) bytes from step $early to $steps (< 2 data files)"
else
  bad "resident set grew $((rss_last - rss_early)) bytes from step $early to $steps (2 data files: $((2 * ckpt_bytes)))"
fi

kept=$(find ck -maxdepth 1 -name 'step-*' | wc -l)
tmp=$(find ck -maxdepth 1 -name '.tmp-*' | wc -l)
[ "$kept" = "$keep" ] && [ "$tmp" = 0 ] && ok "$kept checkpoints kept, no temporary left" ||
  bad "$kept checkpoints and $tmp temporaries in ck, expected $keep and 0: $(ls -A ck)"
[ "$(cat ck/latest)" = "$(printf step-%08d "$steps")" ] && ok "latest names step $steps" ||
  bad "latest is $(cat ck/latest)"
"$strata" --log-level warn ckpt verify ck || bad "the last checkpoint does not verify"
left=$(find nv -name 'strata-swap-*' | wc -l)
[ "$left" = 0 ] && ok "the swap files are removed at exit" || bad "$left swap files left in nv/"
[ "$fail" = 0 ] && echo "all soak checks passed in $((SECONDS - start)) s"
exit $fail
