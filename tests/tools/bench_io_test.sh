#!/usr/bin/env bash
# `strata bench io` (bench/bench_io.cc), the interface people script: a small matrix prints one JSON
# object per row with the fields the issue fixes (rw, bs, qd, gbps, iops, p50_us, p99_us) and real
# numbers; --huge-pages auto backs small random writes with 4 KiB pages and the rest with huge pages
# (Note [Bench buffers] in bench/bench_io_files.h); the table has a row per cell; with fio installed, --vs-fio adds
# fio_gbps and ratio from at least 3 pairs; bad flags end in one message naming the flag, exit status 1, and
# leave no test file behind. Skips (exit 77) where the work directory refuses O_DIRECT.
# Usage: bench_io_test.sh STRATA_BINARY WORKDIR
set -euo pipefail
strata="$1"; work="$2"
source "$(dirname "$0")/bench_io_common.sh"

field() {  # line, key -> its value (numbers, booleans, strings without quotes)
  echo "$1" | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p"
}

out=$("$strata" --log-level warn bench io --dir "$work" --size 8M --bs 4K,1M --qd 1,4 --rw read,write,randread,randwrite --json)
rows=$(echo "$out" | grep -c '^{' || true)
[ "$rows" = 16 ] && ok "16 JSON rows for 4 rw x 2 bs x 2 qd" || bad "$rows JSON rows, expected 16: $out"
while IFS= read -r line; do
  [ -z "$line" ] && continue
  for k in rw bs qd gbps iops p50_us p99_us huge_pages; do
    [ -n "$(field "$line" "$k")" ] || bad "row without $k: $line"
  done
  rw=$(field "$line" rw); bs=$(field "$line" bs)
  awk -v g="$(field "$line" gbps)" -v i="$(field "$line" iops)" -v p="$(field "$line" p50_us)" -v q="$(field "$line" p99_us)" \
    'BEGIN { exit !(g > 0 && i > 0 && p > 0 && q >= p) }' || bad "implausible numbers: $line"
  want=true; [ "$rw" = randwrite ] && [ "$bs" -le 16384 ] && want=false
  [ "$(field "$line" huge_pages)" = "$want" ] || bad "--huge-pages auto gave huge_pages=$(field "$line" huge_pages) for $rw bs $bs, expected $want"
done <<<"$out"
ok "every row has the fields and positive numbers; auto buffers as documented"

out=$("$strata" --log-level warn bench io --dir "$work" --size 8M --bs 4K --qd 2 --rw randwrite --huge-pages on --json)
[ "$(field "$out" huge_pages)" = true ] && ok "--huge-pages on is taken as given" || bad "--huge-pages on: $out"

table=$("$strata" --log-level warn bench io --dir "$work" --size 8M --bs 64K --qd 1,2 --rw read)
[ "$(echo "$table" | grep -c '^ *read ')" = 2 ] && ok "the table has a line per row" || bad "table: $table"

if command -v fio >/dev/null; then
  out=$("$strata" --log-level warn bench io --dir "$work" --size 8M --bs 1M --qd 2 --rw read --vs-fio --pairs 3 --json)
  f=$(field "$out" fio_gbps); r=$(field "$out" ratio)
  awk -v f="$f" -v r="$r" 'BEGIN { exit !(f > 0 && r > 0) }' && ok "--vs-fio: fio $f GB/s, ratio $r" || bad "--vs-fio: $out"
  echo "$out" | grep -q '"fio_runs_gbps":\[[^],]*,[^],]*,[^]]*\]' && ok "--vs-fio: 3 fio runs" || bad "--vs-fio runs: $out"
else
  echo "skipped: --vs-fio (fio is not installed)"
fi

refuse "an unknown --rw" "--rw 'sideways'" --rw sideways
refuse "a --bs that is not a multiple of 4 KiB" "--bs 1000" --bs 1000
refuse "a --qd that is not a number" "--qd 'abc'" --qd abc
refuse "a --qd of 0" "--qd '0'" --qd 0
refuse "an unknown --huge-pages" "--huge-pages (or auto) 'maybe'" --huge-pages maybe
refuse "fewer than 3 pairs" "--pairs" --vs-fio --pairs 2
msg=$("$strata" bench io --dir "$work/absent" 2>&1) && rc=0 || rc=$?
if [ "$rc" = 1 ] && echo "$msg" | grep -q "absent' does not exist.*create it" && [ "$(echo "$msg" | wc -l)" = 1 ]; then
  ok "refused a missing --dir: $msg"
else
  bad "missing --dir: exit $rc: $msg"
fi
left=$(find "$work" -name 'strata-bench-io*' | wc -l)
[ "$left" = 0 ] && ok "no test file left behind" || bad "$left test files left in $work"
exit $fail
