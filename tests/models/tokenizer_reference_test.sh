#!/usr/bin/env bash
# The tokenizers against Hugging Face `tokenizers` and `sentencepiece` on >= 10 MB of generated text
# (tests/models/tokenizer_reference.py says what it builds and checks), through `strata data
# tokenize`. Skips (exit 77) without the reference Python or its packages.
# Usage: tokenizer_reference_test.sh PYTHON STRATA_BINARY WORKDIR
set -euo pipefail
python="$1"; strata="$2"; work="$3"
if [ ! -x "$python" ]; then
  echo "skipped: no Python at $python (bash tools/setup-python.sh makes .venv)"; exit 77
fi
rm -rf "$work"; mkdir -p "$work"
exec "$python" "$(dirname "$0")/tokenizer_reference.py" "$strata" "$work"
