#!/usr/bin/env bash
# `strata bench io --soak` (Note [Bench soak] in bench/bench_io_soak.h): a short soak through the
# real swap store passes, reports bandwidth per interval and counts every tensor and extent it read
# back; faults the engine retries (EAGAIN, EINTR, short transfers) are counted and the run passes;
# a corrupt read (a flipped byte the drive did not report) fails on the swap store's checksum and an
# EIO on a read or write fails, each naming the tensor, the extent or offset and the swap file; bad
# flags end in one message. Durations are seconds; no figure is asserted beyond being positive.
# Usage: bench_io_soak_test.sh STRATA_BINARY WORKDIR
set -euo pipefail
strata="$1"; work="$2"
source "$(dirname "$0")/bench_io_common.sh"
soak() { "$strata" --log-level warn bench io --dir "$work" --size 24M --soak-chunk 1M --qd 8 "$@"; }
check() {  # description, python expression over `summary` and `ivs` (the JSON lines of $out)
  if python3 -c '
import json, sys
lines = [json.loads(l) for l in sys.stdin if l.startswith("{")]
ivs = [l for l in lines if "soak_interval" in l]
summary = [l for l in lines if "soak_s" in l][0]
sys.exit(0 if eval(sys.argv[1]) else 1)' "$2" <<<"$out"; then ok "$1"; else bad "$1: $out"; fi
}

out=$(soak --soak 2s --interval 250ms --interval-log "$work/soak.jsonl" --json)
# 24 MiB holds 13 chunks of 1 MiB of state with their gradients and weights (every fourth shorter).
check "a 2 s soak: intervals with reads and writes at once, every tensor read back and its extents verified" \
  'summary["chunks"] >= 5 and summary["tensors"] == 3 * summary["chunks"] and summary["verified_tensors"] >= summary["tensors"] and summary["verified_extents"] >= summary["verified_tensors"] and summary["read_gbps"] > 0 and summary["write_gbps"] > 0 and summary["faults_injected"] == 0 and len(ivs) >= 3 and sum(i["verified_extents"] for i in ivs) == ivs[-1]["verified_extents_total"] <= summary["verified_extents"] and any(i["read_gbps"] > 0 and i["write_gbps"] > 0 for i in ivs)'
[ "$(grep -c soak_interval "$work/soak.jsonl")" -ge 3 ] && ok "--interval-log holds the soak's intervals" || bad "soak log: $(cat "$work/soak.jsonl")"
ls "$work"/strata-soak-swap.bin 2>/dev/null && bad "the soak's swap file outlived the run" || ok "the soak's swap file is gone"

text=$(soak --soak 1s)
grep -q 'extents verified' <<<"$text" && grep -q '^soak: .* tensors and [0-9]* extents read back and verified, no mismatch' <<<"$text" &&
  ok "the text summary says what was verified" || bad "soak text: $text"

for fault in eagain:read:10 eintr:read:4 short:read:6 short:write:30 eagain:write:12; do
  out=$(soak --soak 1s --soak-fault "$fault" --json)
  check "--soak-fault $fault is retried by the engine: counted, the run passes" 'summary["faults_injected"] == 1 and summary["verified_extents"] > 0'
done

fails() {  # description, expected text (grep -E), --soak-fault spec
  local rc=0 msg
  msg=$(soak --soak 5s --soak-fault "$3" 2>&1 >/dev/null) || rc=$?
  if [ "$rc" = 1 ] && grep -qE -- "$2" <<<"$msg"; then ok "$1: $msg"; else bad "$1: exit $rc: $msg"; fi
}
# The 40th read is in the timed loop (the fill only writes): the swap store's checksum catches it.
fails "a corrupt read fails on the extent's checksum, naming tensor, extent and offset" \
  "soak failed after .*swap data of 'chunk[0-9]+\.(state|grad|param)' is corrupt: extent [0-9]+ of [0-9]+ \(.* at offset [0-9]+ of .*strata-soak-swap\.bin\)" \
  corrupt:read:40
fails "an EIO on a read fails naming tensor, extent and offset" \
  "reading tensor 'chunk[0-9]+\.(state|grad|param)' failed in extent [0-9]+ of [0-9]+ \(.* at offset [0-9]+ of .*strata-soak-swap\.bin\): cannot read .* at offset [0-9]+ .*Input/output error" \
  eio:read:25
fails "an EIO on a write fails naming the tensor and the offset" \
  "writing tensor 'chunk[0-9]+\.(state|grad|param)' failed: cannot write .* at offset [0-9]+ of .*strata-soak-swap\.bin: Input/output error" \
  eio:write:60

refuse "a bad --soak" "--soak '5x'" --soak 5x
refuse "a bad --soak-fault" "--soak-fault 'boom:read:1'" --soak 1s --soak-fault boom:read:1
refuse "--soak-chunk without --soak" "--soak-chunk is an option of --soak" --soak-chunk 1M
refuse "--soak with --vs-fio" "--soak runs alone" --soak 1s --vs-fio
refuse "a --size too small for the pipeline" "the soak needs 5" --soak 1s --soak-chunk 4M
rc=0; msg=$("$strata" bench io --dir "$work/missing" --size 24M --soak-chunk 1M --soak 1s 2>&1) || rc=$?
if [ "$rc" = 1 ] && grep -q -- "--dir '$work/missing' does not exist" <<<"$msg"; then ok "a missing --dir is named as --dir: $msg"
else bad "a missing --dir: exit $rc: $msg"; fi
exit $fail
