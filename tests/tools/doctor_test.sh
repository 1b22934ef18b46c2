#!/usr/bin/env bash
# `strata doctor`: exit 0 with every check reported on a usable directory of this machine; exit 1
# with a FAIL line naming the problem for a missing directory and for a space requirement the disk
# cannot meet; --json is valid JSON. Usage: doctor_test.sh STRATA_BINARY WORKDIR
set -euo pipefail
strata="$1"; work="$2"
source "$(dirname "$0")/lib.sh"
mkdir -p "$work"

out=$("$strata" doctor --dir "$work") && rc=0 || rc=$?
echo "$out"
check "usable directory: exit 0" "[ $rc -eq 0 ]"
for c in devices cpu simd io_uring o_direct free_space memlock; do
  check "reports $c" "echo \"\$out\" | grep -q \" $c \""
done
check "O_DIRECT verified" "echo \"\$out\" | grep -q 'O_DIRECT (4 KiB aligned write and read back verified)'"

out=$("$strata" doctor --dir "$work/does-not-exist") && rc=0 || rc=$?
check "missing directory: exit 1" "[ $rc -eq 1 ]"
check "missing directory: FAIL line names it" "echo \"\$out\" | grep -q 'FAIL.*does-not-exist'"

out=$("$strata" doctor --dir "$work" --need 1000TB) && rc=0 || rc=$?
check "impossible --need: exit 1" "[ $rc -eq 1 ]"
check "impossible --need: says how much is needed" "echo \"\$out\" | grep -q 'FAIL.*free_space.*needs'"

"$strata" doctor --dir "$work" --json > "$work/doctor.json"
check "--json says ok and lists the seven checks" "grep -q '\"ok\": true' '$work/doctor.json' && [ \$(grep -c '\"check\"' '$work/doctor.json') -eq 7 ]"
exit $fail
