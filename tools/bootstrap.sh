#!/usr/bin/env bash
# Creates .venv with a Python >= 3.12 (jax >= 0.11 needs it) and installs jax-mtp with the extras
# given as the first argument, e.g. `tools/bootstrap.sh test,reference`.
# Finds python3.12+ on PATH, else pyenv's 3.12 (whose shim only answers with PYENV_VERSION set).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"

is_312() { "$@" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; }

find_python() {
  for candidate in python3.13 python3.12 python3; do
    if command -v "$candidate" >/dev/null && is_312 "$candidate"; then echo "$candidate"; return; fi
  done
  if command -v pyenv >/dev/null; then
    for version in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.1[2-9]' | sort -rV); do
      local exe; exe="$(pyenv root)/versions/$version/bin/python3"
      if is_312 "$exe"; then echo "$exe"; return; fi
    done
  fi
  echo "error: no Python >= 3.12 found (jax >= 0.11 needs it); install one or pyenv 3.12" >&2
  exit 2
}

if [ ! -x .venv/bin/python ] || ! is_312 .venv/bin/python; then
  python="$(find_python)"  # exits 2 before anything is removed when there is none
  rm -rf .venv
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".${extras:+[$extras]}"
