#!/usr/bin/env bash
# `strata doctor --measure`: describes this machine as a machine file in a few seconds. The file
# written with --out is the "machine" member of --json's output, holds measured (non-zero) host and
# drive rates, and reads back through load_machine (doctor reads it back itself and exits 2 if it
# does not). An unmeasurable drive is described as none, with the reason in the note; bad flags are
# one line naming the flag. Usage: doctor_measure_test.sh STRATA_BINARY WORKDIR
set -euo pipefail
strata="$1"; work="$2"
source "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"

"$strata" doctor --json --measure --dir "$work" --out "$work/machine.json" > "$work/report.json" && rc=0 || rc=$?
check "--measure on a usable directory: exit 0" "[ $rc -eq 0 ]"
for field in '"adam_params_per_s"' '"memory_gbps"' '"read_gbps"' '"write_gbps"' '"bf16_tflops"' '"endurance_tbw"' '"note"'; do
  check "machine file has $field" "grep -q '$field' '$work/machine.json'"
done
py="${STRATA_TEST_PYTHON:-/usr/bin/python3}"
if "$py" -c "import json" 2>/dev/null; then
  "$py" - "$work/report.json" "$work/machine.json" "$work" <<'PY' && rc=0 || rc=$?
import json, os, sys
report, machine = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert report["machine"] == machine, "--out differs from the report's machine"
assert machine["host"]["adam_params_per_s"] > 0 and machine["host"]["memory_gbps"] > 0, machine["host"]
assert machine["host"]["cores"] >= 1 and machine["host"]["memory"] >= 2**30, machine["host"]
d = machine["drives"]
assert d["count"] == 1 and d["read_gbps"] > 0 and d["write_gbps"] > 0, d
assert os.path.samefile(d["paths"][0], sys.argv[3]), d["paths"]
assert machine["gpus"]["count"] >= 1 and machine["gpus"]["memory"] >= 2**30, machine["gpus"]
print("measured:", machine["host"], d["read_gbps"], d["write_gbps"], machine["gpus"]["bf16_tflops"])
PY
  check "report and file agree, rates measured" "[ $rc -eq 0 ]"
else
  echo "skipped: python check of the machine file ($py has no json module)"
fi

# The sim device's memory as given (when this machine has no CUDA device).
if "$strata" doctor --json --measure --dir "$work" --device-memory 2GiB --out "$work/m2.json" > /dev/null 2> "$work/m2.err"; then
  check "--device-memory 2GiB is the GPU memory" "grep -q '\"memory\": 2147483648' '$work/m2.json'"
else
  check "--device-memory refused only for a CUDA machine" "grep -q 'this machine has CUDA devices' '$work/m2.err'"
fi

# A drive that cannot be timed: described as none, the reason in the note; the file still reads back.
"$strata" doctor --json --measure --dir "$work/does-not-exist" --out "$work/nodrive.json" > /dev/null && rc=0 || rc=$?
check "missing directory: exit 1 (the o_direct check fails), not 2" "[ $rc -eq 1 ]"
check "missing directory: no drive, and why" "grep -q 'none measured' '$work/nodrive.json' && tr -d ' \n' < '$work/nodrive.json' | grep -q '\"drives\":{\"count\":0'"

"$strata" doctor --measure --dir "$work" --device-memory 6MiB 2> "$work/small.err" && rc=0 || rc=$?
check "--device-memory 6MiB: exit 1 naming the flag" "[ $rc -eq 1 ] && grep -q -- '--device-memory 6.00 MiB is outside 1.00 GiB' '$work/small.err'"
"$strata" doctor --out "$work/x.json" 2> "$work/noflag.err" && rc=0 || rc=$?
check "--out without --measure: exit 1" "[ $rc -eq 1 ] && grep -q 'add --measure' '$work/noflag.err' && [ ! -e '$work/x.json' ]"
"$strata" doctor --measure --dir "$work" --out "$work/no-such-dir/m.json" 2> "$work/out.err" && rc=0 || rc=$?
check "--out into a missing directory: refused before measuring" "[ $rc -eq 1 ] && grep -q -- '--out' '$work/out.err'"
exit $fail
