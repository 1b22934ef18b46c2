#!/usr/bin/env bash
# Installs the Debian packages Strata builds and runs with. Idempotent: packages already
# present are skipped, and apt-get runs only when something is missing. Used by both README
# commands (tools/run-demo.sh, tools/run-tests.sh) so each works on a fresh machine.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ccache
  libtbb-dev libhwloc-dev hwloc libspdlog-dev libfmt-dev liburing-dev
  libgtest-dev libgmock-dev libopenmpi-dev openmpi-bin libopenblas-dev
  nlohmann-json3-dev libcli11-dev libxxhash-dev
  fio fortunes gnuplot-nox
  libpcre2-dev libsentencepiece-dev libicu-dev
  python3-venv python3-pip python3-torch python3-jinja2
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "strata setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
