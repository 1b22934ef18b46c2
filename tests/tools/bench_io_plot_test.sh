#!/usr/bin/env bash
# `strata bench io --plot` (bench/bench_io_plot.h): a short --time run draws an SVG that parses as
# XML and holds every row's bandwidth and latency series (and a PNG that is one), --tune draws its
# heat maps; refused at start-up, in one line naming the flag and the fix: a missing folder, a
# name that is neither .svg nor .png, a run without intervals, and gnuplot missing (then the
# drawing checks skip, saying so). Nothing about the figures drawn is checked: they are timings.
# Usage: bench_io_plot_test.sh STRATA_BINARY WORKDIR
set -euo pipefail
strata="$1"; work="$2"
source "$(dirname "$0")/bench_io_common.sh"
cd "$work"

refuse "--plot into a missing folder" "--plot .*no-such-dir.* does not exist" --time 1s --plot "$work/no-such-dir/run.svg"
refuse "--plot of another kind" "end it in .svg or .png" --time 1s --plot "$work/run.pdf"
refuse "--plot without intervals" "add --time" --plot "$work/run.svg"
refuse "--plot with --replay" "not --replay" --replay demo --plot "$work/run.svg"
# gnuplot missing: an empty PATH hides it (the command itself needs nothing from PATH).
msg=$(PATH=/nonexistent "$strata" bench io --dir "$work" --size 8M --time 1s --plot "$work/run.svg" 2>&1) && rc=0 || rc=$?
if [ "$rc" = 1 ] && grep -q "gnuplot is not installed.*gnuplot-nox" <<<"$msg" && [ "$(wc -l <<<"$msg")" = 1 ] &&
   [ -z "$(ls "$work"/*.bin 2>/dev/null)" ]; then
  ok "refused without gnuplot: $msg"
else
  bad "without gnuplot: exit $rc: $msg"
fi
command -v gnuplot >/dev/null || { [ "$fail" = 0 ] && skip "gnuplot is not installed (apt-get install gnuplot-nox)"; exit "$fail"; }

"$strata" --log-level warn bench io --dir "$work" --size 16M --bs 256K --qd 4 --rw read,write --time 1.2s \
  --interval 0.3s --json --plot "$work/run.svg" >"$work/run.jsonl"
if python3 - "$work/run.svg" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
text = [t.text or "" for t in root.iter() if t.tag.endswith("}text") or t.tag.endswith("}tspan")]
lines = sum(1 for p in root.iter("{http://www.w3.org/2000/svg}path") if len(p.get("d", "")) > 40)
want = ["read 256K qd 4", "write 256K qd 4", "read 256K qd 4 p50", "read 256K qd 4 p99", "write 256K qd 4 p99",
        "GB/s", "latency (us)", "time (s)"]
missing = [w for w in want if w not in text]
sys.exit(1 if missing or lines < 6 else 0)
PY
then ok "a timed run's SVG parses as XML and holds both rows' bandwidth and latency series"
else bad "run.svg: $(head -c 400 "$work/run.svg")"; fi
[ ! -e "$work/run.svg.tmp" ] && ok "no temporary picture left" || bad "run.svg.tmp left behind"

"$strata" --log-level warn bench io --dir "$work" --size 8M --bs 256K --qd 2 --time 0.6s --interval 0.2s \
  --plot "$work/run.png" >/dev/null
[ "$(head -c 4 "$work/run.png" | od -An -c | tr -d ' ')" = "211PNG" ] && ok "--plot run.png is a PNG" || bad "run.png is not a PNG"

"$strata" --log-level warn bench io --tune --dir "$work" --size 8M --tune-request-sizes 128K,512K --tune-qd 2,8 \
  --tune-jobs 1 --tune-rw-qd none --plot "$work/heat.svg" >/dev/null
python3 -c '
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
text = [t.text or "" for t in root.iter() if t.tag.endswith("}text") or t.tag.endswith("}tspan")]
figures = [t for t in text if t.replace(".", "", 1).isdigit() and "." in t]
sys.exit(0 if all(w in text for w in ("reads", "writes", "128K", "512K", "queue depth", "request size"))
         and len(figures) >= 8 else 1)' "$work/heat.svg" &&
  ok "--tune --plot: heat maps of reads and writes by request size and depth" || bad "heat.svg: $(head -c 400 "$work/heat.svg")"
exit "$fail"
