#!/usr/bin/env bash
# A masked SFT run against transformers' loss with labels -100 (tests/models/sft_reference.py says
# what it builds and checks): `strata train` and `strata eval` on a token file whose prompts are
# masked. Skips (exit 77) without the reference Python or its packages.
# Usage: sft_reference_test.sh PYTHON STRATA_BINARY WORKDIR
set -euo pipefail
python="$1"; strata="$2"; work="$3"
if [ ! -x "$python" ]; then
  echo "skipped: no Python at $python (bash tools/setup-python.sh makes .venv)"; exit 77
fi
rm -rf "$work"; mkdir -p "$work"
exec "$python" "$(dirname "$0")/sft_reference.py" "$strata" "$work"
