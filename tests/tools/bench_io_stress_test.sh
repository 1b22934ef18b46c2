#!/usr/bin/env bash
# `strata bench io` as a stress tool (issue 38): timed runs print an interval per --interval (JSON
# lines, a plain line when stdout is not a terminal, --interval-log) and last --time; steady-state
# detection stops a steady run early and never passes an impossible bound; randrw honours --mix;
# read+write rows report readers and writers apart with their own queue depths; --precondition
# runs before write rows; --verify checks every read and the whole file at the end and fails the
# run naming the offset when a block on disk is flipped, stale or misdirected (through the hidden
# --inject-fault hook, which damages the file outside the engine before the read-back); bad flag
# combinations end in one message naming the flag. Durations are short and no figure is asserted
# beyond being positive. Skips (exit 77) where the work directory refuses O_DIRECT.
# Usage: bench_io_stress_test.sh STRATA_BINARY WORKDIR
set -euo pipefail
strata="$1"; work="$2"
source "$(dirname "$0")/bench_io_common.sh"
bench() { "$strata" --log-level warn bench io --dir "$work" "$@"; }
# check DESCRIPTION PYTHON-EXPRESSION: evaluates the expression over `rows` (the JSON lines of $out
# without "interval") and `ivs` (those with it).
check() {
  if python3 -c '
import json, sys
lines = [json.loads(l) for l in sys.stdin if l.startswith("{")]
rows = [l for l in lines if "interval" not in l]
ivs = [l for l in lines if "interval" in l]
sys.exit(0 if eval(sys.argv[1]) else 1)' "$2" <<<"$out"; then ok "$1"; else bad "$1: $out"; fi
}

# Sustained: intervals of 250 ms over 2 s, as JSON lines and in the log file.
out=$(bench --size 32M --bs 256K --qd 4 --rw write --time 2s --interval 250ms --interval-log "$work/iv.jsonl" --json)
# A busy machine may wake the reporter late (a longer interval), so the count is a lower bound.
check "timed write: intervals with positive GB/s covering the run, one summary row of time_s 2" \
  'len(ivs) >= 4 and all(i["gbps"] > 0 and i["seconds"] >= 0.12 for i in ivs) and sum(i["seconds"] for i in ivs) >= 1.5 and len(rows) == 1 and rows[0]["time_s"] == 2 and rows[0]["seconds"] >= 1.5'
[ "$(grep -c '"interval"' "$work/iv.jsonl")" -ge 4 ] && ok "--interval-log holds the intervals" || bad "--interval-log: $(cat "$work/iv.jsonl")"
text=$(bench --size 32M --bs 256K --qd 4 --rw read --time 1s --interval 200ms)
[ "$(grep -c 's [0-9]* IOPS [0-9.]* GB/s p99' <<<"$text")" -ge 3 ] && ok "a plain line per interval when stdout is not a terminal" || bad "interval lines: $text"

# Steady state: a loose bound is reached before --time; an impossible one never is.
out=$(bench --size 32M --bs 256K --qd 4 --rw read --time 20s --interval 100ms --steady-state 95% --steady-window 500ms --json)
check "--steady-state 95% stops the run early" 'rows[0]["steady"]["reached"] and rows[0]["steady"]["at_s"] < 20 and rows[0]["seconds"] < 20'
out=$(bench --size 32M --bs 256K --qd 4 --rw read --time 1s --interval 100ms --steady-state 0.0001% --steady-window 500ms --json)
check "an impossible --steady-state runs the full --time" 'not rows[0]["steady"]["reached"] and rows[0]["seconds"] >= 0.9'

# Latency apart (fio's slat/clat/lat): every row and interval has both parts with lat's percentiles,
# each ordered (p50 <= p99 <= max), each part at or under the whole, the parts' means adding up to
# lat's mean and lat's max at most their maxima added; on both engines, for reads and writes.
split='all(all(x[p]["p50_us"] <= x[p]["p99_us"] <= x[p]["p99_9_us"] <= x[p]["max_us"] and x[p]["p50_us"] <= x["p50_us"] and x[p]["p99_us"] <= x["p99_us"] and x[p]["max_us"] <= x["max_us"] for p in ("slat", "clat")) and abs(x["slat"]["mean_us"] + x["clat"]["mean_us"] - x["mean_us"]) <= 1e-6 * x["mean_us"] + 1e-9 and x["max_us"] <= x["slat"]["max_us"] + x["clat"]["max_us"] + 1e-9 and x["clat"]["mean_us"] > 0 for x in objs)'
for engine in uring threads; do
  out=$(bench --engine "$engine" --size 16M --bs 64K --qd 4 --rw randrw --mix 50 --time 1s --interval 250ms --json 2>/dev/null) || true
  check "slat and clat apart ($engine): ordered, under lat, means adding up to lat's (row, reads, writes, intervals)" \
    "len(rows) == 1 and (lambda objs: $split)([rows[0], rows[0]['read'], rows[0]['write']] + ivs)"
done
text=$(bench --size 16M --bs 64K --qd 4 --rw read)
grep -q 'slat/clat slat p50 [0-9]* p99 [0-9]* max [0-9]* us, clat p50 [0-9]* p99 [0-9]* max [0-9]* us' <<<"$text" &&
  ok "the table shows slat and clat in short" || bad "no slat/clat line: $text"
"$strata" bench io --help | grep -q 'slat from the queueing' && ok "--help says what slat and clat measure" ||
  bad "--help does not explain slat/clat"

# Mixed and concurrent.
out=$(bench --size 32M --bs 64K --qd 8 --rw randrw --mix 70 --histogram --json)
check "randrw --mix 70: reads and writes apart, 60-80 % reads, a histogram" \
  '0.6 < rows[0]["read"]["iops"] / (rows[0]["read"]["iops"] + rows[0]["write"]["iops"]) < 0.8 and rows[0]["mix"] == 70 and len(rows[0]["latency_histogram_us"]) > 0'
out=$(bench --size 32M --bs 64K --qd 2 --rw read+write --read-qd 4 --write-qd 2 --time 1s --json)
check "read+write: readers and writers reported apart with their queue depths" \
  'rows[0]["read_qd"] == 4 and rows[0]["write_qd"] == 2 and rows[0]["read"]["gbps"] > 0 and rows[0]["write"]["gbps"] > 0 and rows[0]["read"]["p99_9_us"] >= rows[0]["read"]["p50_us"]'
out=$(bench --size 16M --bs 64K --qd 4 --rw randwrite --precondition --json)
check "--precondition runs before a write row" 'rows[0]["precondition_s"] > 0 and rows[0]["cpu_s_per_gb"] > 0'

# Verify: a clean mixed timed run checks reads as they complete and every block at the end.
out=$(bench --size 16M --bs 64K --qd 8 --rw randrw,read+write --time 1s --verify --json)
check "--verify: reads checked during the run, all 256 blocks at the end" \
  'len(rows) == 2 and all(r["verified_blocks"] > 0 and r["verified_at_end"] == 256 for r in rows)'
for fault in "flip@3:196608:checksum" "stale@5:327680:stale block" "misdirect@7:458752:misdirected"; do
  IFS=: read -r hook offset what <<<"$fault"
  rc=0; msg=$(bench --size 8M --bs 64K --qd 4 --rw randwrite --verify --inject-fault "$hook" 2>&1 >/dev/null) || rc=$?
  if [ "$rc" = 1 ] && grep -q "block at offset $offset .*$what.*expected {offset $offset" <<<"$msg"; then
    ok "--verify catches ${hook%@*}: $msg"
  else
    bad "--inject-fault $hook: exit $rc: $msg"
  fi
done

if command -v fio >/dev/null; then
  out=$(bench --size 16M --bs 64K --qd 4 --rw randrw --mix 70 --time 1s --vs-fio --pairs 3 --json)
  check "--vs-fio on a timed randrw row: fio's GB/s, CPU s/GB, latency per operation and buffer memory beside Strata's" \
    'rows[0]["fio_gbps"] > 0 and rows[0]["ratio"] > 0 and rows[0]["fio_cpu_s_per_gb"] >= 0 and len(rows[0]["fio_runs_gbps"]) == 3 and rows[0]["buffer_bytes"] == 4 * 65536 and rows[0]["fio_mem"] == "malloc" and all(rows[0]["fio_latency"][op]["p99_us"] >= rows[0]["fio_latency"][op]["p50_us"] > 0 for op in ("read", "write"))'
  check "--vs-fio: fio's slat and clat beside Strata's, each under fio's lat" \
    'all(0 <= rows[0]["fio_latency"][op][p]["p50_us"] <= rows[0]["fio_latency"][op][p]["max_us"] <= rows[0]["fio_latency"][op]["max_us"] for op in ("read", "write") for p in ("slat", "clat"))'
  out=$(bench --size 16M --bs 64K --qd 2 --rw read+write --read-qd 4 --vs-fio --pairs 3 --json)
  check "--vs-fio on a read+write row: fio runs readers and writers as two jobs" \
    'rows[0]["fio_gbps"] > 0 and rows[0]["read_qd"] == 4 and rows[0]["buffer_bytes"] == 6 * 65536'
else
  echo "skipped: --vs-fio (fio is not installed)"
fi

refuse "a bad --time" "--time '10x'" --time 10x
refuse "--ramp without --time" "--ramp needs --time" --ramp 1s
refuse "--steady-state without --time" "--steady-state needs --time" --steady-state 5%
refuse "a bad --steady-state" "--steady-state '5'" --time 30s --steady-state 5
refuse "a window of under 3 intervals" "--steady-window 2s holds 2" --time 5s --steady-state 5% --steady-window 2s
refuse "a window as long as the run" "--steady-window is as long as --time" --time 5s --steady-state 5%
refuse "--mix without randrw" "--mix is the read share" --mix 70
refuse "--mix over 100" "--mix 150" --rw randrw --mix 150
refuse "--read-qd without a read+write row" "--read-qd/--write-qd" --read-qd 4
refuse "readers+readers" "--rw 'read+read'" --rw read+read
refuse "--precondition on reads only" "--precondition prepares" --precondition --rw read
refuse "--precondition with --file-state fallocated" "--precondition writes" --precondition --rw write --file-state fallocated
refuse "--verify with --file-state fallocated" "--verify needs written" --verify --file-state fallocated
refuse "--verify with --vs-fio" "run --verify without --vs-fio" --verify --vs-fio
refuse "--inject-fault without --verify" "--inject-fault tests --verify" --inject-fault flip
refuse "an unknown --inject-fault" "--inject-fault 'melt'" --verify --inject-fault melt
refuse "a timed row with too few blocks" "--size: a timed write row of --bs 4.00 MiB has 2 blocks" --time 1s --rw write --bs 4M --qd 4
refuse "--interval-log without intervals" "--interval-log needs intervals" --interval-log "$work/x.jsonl"
left=$(find "$work" -name 'strata-bench-io*' | wc -l)
[ "$left" = 0 ] && ok "no test file left behind, failed runs included" || bad "$left test files left in $work"
exit $fail
