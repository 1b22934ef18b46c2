# Sourced by the shell tests of tests/tools right after their `set` line and arguments (before any
# cd): the bookkeeping they share, so each test says only what it checks. Every test ends with
# `exit $fail`; ctest reads exit 77 as a skip (SKIP_RETURN_CODE in tests/tools/CMakeLists.txt).
#   fail                      0 until a check fails
#   ok WHAT / bad WHAT        print "ok: WHAT" / "FAILED: WHAT"; bad sets fail=1
#   check WHAT EXPR           ok or bad after `eval EXPR`
#   compare REF FILE WHAT     ok when FILE is byte-identical to REF, else bad naming REF
#   fresh_workdir DIR         DIR emptied (or made) and made the current directory
#   mpi_launcher MPIEXEC      sets mpi, the mpiexec command line of the multi-rank tests
#   ranks NP COMMAND...       COMMAND on one rank as it is, on NP > 1 ranks under "${mpi[@]}"
#   skip WHY                  prints "skipped: WHY" and exits 77
#   short                     true under STRATA_TEST_SHORT=1 (.ci/run's ASan pass): the script runs
#                             its short size, which its header describes; prints "short run" once
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAILED: $1"; fail=1; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }
compare() { if cmp -s "$1" "$2"; then ok "$3"; else bad "$3: weights differ from $1"; fi; }
fresh_workdir() { rm -rf "$1"; mkdir -p "$1"; cd "$1"; }
mpi_launcher() { mpi=("$1" --allow-run-as-root --oversubscribe --bind-to none); }
ranks() {
  local np="$1"; shift
  if [ "$np" -gt 1 ]; then "${mpi[@]}" -np "$np" "$@"; else "$@"; fi
}
skip() { echo "skipped: $1"; exit 77; }
short() {
  [ "${STRATA_TEST_SHORT:-0}" = 1 ] || return 1
  [ -n "${short_said:-}" ] || { echo "short run (STRATA_TEST_SHORT=1)"; short_said=1; }
}
