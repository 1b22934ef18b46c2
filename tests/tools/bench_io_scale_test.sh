#!/usr/bin/env bash
# `strata bench io` at scale (issue 38, item 5): --jobs N runs N engines per path, each on its own
# slice, moving the whole file once in a pass and never touching a block of another job (--verify
# with a timed randrw run); --pin places each job on its own core (this 2-core machine: both,
# reported); fio runs the same numjobs and memory kind with --vs-fio, and the row says which pages
# each side used; --iopoll is refused naming the device when it has no poll queues (run, when it
# has them); --device refuses anything but a block device, and writes without --destructive; on a
# loop device (when losetup works here) reads run read-only and --destructive writes verify.
# No figure is asserted beyond being positive. Skips (exit 77) where the work directory refuses O_DIRECT.
# Usage: bench_io_scale_test.sh STRATA_BINARY WORKDIR
set -euo pipefail
strata="$1"; work="$2"
source "$(dirname "$0")/bench_io_common.sh"
bench() { "$strata" --log-level warn bench io "$@"; }
check() {  # description, python expression over `rows` (the JSON rows of $out)
  if python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{") and "interval" not in l]
sys.exit(0 if eval(sys.argv[1]) else 1)' "$2" <<<"$out"; then ok "$1"; else bad "$1: $out"; fi
}
refuse_any() {  # description, expected text, args...
  local what="$1" want="$2"; shift 2
  local msg rc=0
  msg=$("$strata" bench io "$@" 2>&1) || rc=$?
  if [ "$rc" = 1 ] && grep -q -- "$want" <<<"$msg" && [ "$(wc -l <<<"$msg")" = 1 ]; then
    ok "refused $what: $msg"
  else
    bad "$what: exit $rc, message: $msg"
  fi
}

# --jobs: one pass moves every block of the file once, over 3 jobs of qd 2.
out=$(bench --dir "$work" --size 16M --bs 64K --qd 2 --rw randread,write --jobs 3 --json)
check "--jobs 3: a pass moves the whole file once (256 blocks), jobs in the row" \
  'len(rows) == 2 and all(r["jobs"] == 3 and r["ios"] == 256 and r["gbps"] > 0 for r in rows)'
out=$(bench --dir "$work" --size 16M --bs 64K --qd 4 --rw randrw --jobs 2 --time 1s --verify --json)
check "--jobs 2 --verify: timed randrw checked during the run and all 256 blocks at the end" \
  'rows[0]["verified_blocks"] > 0 and rows[0]["verified_at_end"] == 256'

# --pin: distinct cores while there are enough, the placement in the row.
cores=$(nproc)
out=$(bench --dir "$work" --size 16M --bs 64K --qd 2 --rw read --jobs 2 --pin --json)
if [ "$cores" -ge 2 ]; then
  check "--pin: two jobs on two distinct CPUs, near the drive's locality, no shared core" \
    'len(rows[0]["pinned"]) == 2 and len({p["cpu"] for p in rows[0]["pinned"]}) == 2 and not any(p["shared_core"] for p in rows[0]["pinned"]) and all(p["near"] for p in rows[0]["pinned"])'
fi
out=$(bench --dir "$work" --size 16M --bs 64K --qd 2 --rw read --jobs $((cores + 1)) --pin --json)
check "--pin with more jobs than cores: one job shares a core, and says so" \
  'sum(p["shared_core"] for p in rows[0]["pinned"]) == 1'

# --vs-fio with jobs and equal memory.
hugetlb_free=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
out=$(bench --dir "$work" --size 16M --bs 1M --qd 4 --rw read --jobs 2 --vs-fio --json)
if [ "${hugetlb_free:-0}" = 0 ]; then
  check "--vs-fio without hugetlb pages: both sides on 4 KiB pages, equal memory, the note says how to get huge ones" \
    'rows[0]["fio_gbps"] > 0 and rows[0]["buffer_pages"] == "4 KiB" and rows[0]["fio_pages"] == "4 KiB" and rows[0]["equal_memory"] and "nr_hugepages" in rows[0]["memory_note"]'
else
  check "--vs-fio with hugetlb pages: fio on shmhuge beside Strata's huge pages" \
    'rows[0]["fio_gbps"] > 0 and rows[0]["fio_mem"] == "shmhuge" and rows[0]["equal_memory"]'
fi
out=$(bench --dir "$work" --size 16M --bs 1M --qd 4 --rw read --vs-fio --fio-mem malloc --huge-pages on --json)
check "--fio-mem malloc beside Strata's huge pages: the row says the memory is not equal" \
  'rows[0]["fio_mem"] == "malloc" and rows[0]["buffer_pages"].startswith("2 MiB") and not rows[0]["equal_memory"]'

# --iopoll: refused naming the device without poll queues, else it runs polled.
dev=$(python3 -c 'import os,sys; st=os.stat(sys.argv[1]); p=os.path.realpath("/sys/dev/block/%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))); p=os.path.dirname(p) if os.path.exists(p+"/partition") else p; print(os.path.basename(p))' "$work" 2>/dev/null || true)
poll=$(cat "/sys/block/$dev/queue/io_poll" 2>/dev/null || echo 0)
if [ -n "$dev" ] && [ -e "/sys/block/$dev" ] && [ "$poll" != 1 ]; then
  refuse_any "--iopoll without poll queues" "--iopoll: /dev/$dev (holding .*) has no poll queues.*poll_queues" \
    --dir "$work" --size 8M --iopoll
elif [ "$poll" = 1 ]; then
  out=$(bench --dir "$work" --size 16M --bs 64K --qd 4 --rw randread --iopoll --json)
  check "--iopoll on a drive with poll queues: an IOPOLL ring" '"IOPOLL" in rows[0]["engine_features"] and rows[0]["gbps"] > 0'
fi
refuse_any "--iopoll with the thread engine" "io_uring mode" --dir "$work" --size 8M --iopoll --engine threads

# --device: refusals, then a loop device when this machine lets us make one.
: >"$work/plain.dat"
refuse_any "--device on a regular file" "--device $work/plain.dat: not a block device (a file)" --device "$work/plain.dat" --size 8M
refuse_any "--device on a directory" "not a block device (a directory)" --device "$work" --size 8M
refuse_any "--destructive without --device" "--destructive allows writes to a --device" --dir "$work" --size 8M --destructive
refuse_any "--device with --dir" "drop --dir" --device /dev/null --dir "$work" --size 8M
refuse_any "--jobs 0" "--jobs 0: use 1..64" --dir "$work" --size 8M --jobs 0
loopdev=""
cleanup() { if [ -n "$loopdev" ]; then losetup -d "$loopdev" || true; fi; }
trap cleanup EXIT
truncate -s 64M "$work/loop.img"
if loopdev=$(losetup --find --show --direct-io=on "$work/loop.img" 2>/dev/null); then
  refuse_any "a write row on a --device without --destructive" "would overwrite $loopdev: .*add --destructive" \
    --device "$loopdev" --size 16M --rw write
  out=$(bench --device "$loopdev" --size 16M --bs 64K --qd 4 --rw read,randread --jobs 2 --json)
  check "--device read-only: reads of the loop device" 'len(rows) == 2 and all(r["device"] and r["ios"] == 256 for r in rows)'
  out=$(bench --device "$loopdev" --size 16M --bs 64K --qd 4 --rw randrw --time 1s --verify --destructive --json)
  check "--device --destructive: verified writes and reads" 'rows[0]["verified_at_end"] == 256 and rows[0]["write"]["gbps"] > 0'
  out=$(bench --device "$loopdev" --size 16M --bs 64K --qd 4 --rw read --vs-fio --json)
  check "--device read-only beside fio (--readonly)" 'rows[0]["fio_gbps"] > 0'
else
  echo "note: losetup cannot attach a loop device here (no root or no loop driver); --device ran its refusals only"
fi
exit $fail
