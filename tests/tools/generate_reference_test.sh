#!/usr/bin/env bash
# `strata generate` against transformers' generate(do_sample=False) on tiny random-weight models of
# each family (tests/tools/generate_reference.py says what it builds and checks). Skips (exit 77)
# without the reference Python or its packages.
# Usage: generate_reference_test.sh PYTHON STRATA_BINARY WORKDIR
set -euo pipefail
python="$1"; strata="$2"; work="$3"
if [ ! -x "$python" ]; then
  echo "skipped: no Python at $python (bash tools/setup-python.sh makes .venv)"; exit 77
fi
rm -rf "$work"; mkdir -p "$work"
exec "$python" "$(dirname "$0")/generate_reference.py" "$strata" "$work"
