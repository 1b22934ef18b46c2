# Sourced by the `strata bench io` tests (bench_io_test.sh, bench_io_stress_test.sh) after they set
# $strata and $work: tests/tools/lib.sh, a fresh work directory, a skip (exit 77) where the
# directory refuses O_DIRECT, and refuse, which expects exit 1 and one line naming the flag.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
rm -rf "$work"; mkdir -p "$work"
doctor=$("$strata" doctor --dir "$work" || true)  # exits 1 when any check fails
if grep -q '^FAIL *o_direct' <<<"$doctor"; then
  skip "$work does not support O_DIRECT"
fi

refuse() {  # description, expected text, args...
  local what="$1" want="$2"; shift 2
  local msg rc=0
  msg=$("$strata" bench io --dir "$work" --size 8M "$@" 2>&1) || rc=$?
  if [ "$rc" = 1 ] && grep -q -- "$want" <<<"$msg" && [ "$(wc -l <<<"$msg")" = 1 ]; then
    ok "refused $what: $msg"
  else
    bad "$what: exit $rc, message: $msg"
  fi
}
