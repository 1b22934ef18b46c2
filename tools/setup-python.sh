#!/usr/bin/env bash
# Creates .venv (git-ignored) over Debian's python3 with its site packages (python3-torch) and
# installs tools/python-requirements.txt into it, for the reference tests against transformers and
# tokenizers. Idempotent: a stamp holding the requirements' hash skips pip when nothing changed.
# Without network the install fails with a warning and those tests skip, each saying which package
# it lacks; CI has the network, so they run there.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
REQ=tools/python-requirements.txt
stamp="$VENV/.strata-requirements"
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [[ -x $VENV/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]]; then
  exit 0
fi
if [[ ! -x $VENV/bin/python ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$VENV" || { echo "strata setup: cannot create $VENV (python3-venv missing?); the reference tests will skip" >&2; exit 0; }
fi
echo "strata setup: installing the reference tests' Python packages into $VENV" >&2
if "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQ"; then
  echo "$want" >"$stamp"
else
  echo "strata setup: pip could not install $REQ; the tests against transformers/tokenizers will skip" >&2
fi
exit 0
