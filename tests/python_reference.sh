#!/usr/bin/env bash
# Runs one Python reference test (a script checking Strata against transformers, tokenizers or
# sentencepiece) in a fresh work directory. Skips (exit 77) without the reference Python; the script
# itself exits 77 when a package it needs is missing.
# Usage: python_reference.sh PYTHON SCRIPT STRATA_BINARY WORKDIR
set -euo pipefail
python="$1"; script="$2"; strata="$3"; work="$4"
if [ ! -x "$python" ]; then
  echo "skipped: no Python at $python (bash tools/setup-python.sh makes .venv)"; exit 77
fi
rm -rf "$work"; mkdir -p "$work"
exec "$python" "$script" "$strata" "$work"
