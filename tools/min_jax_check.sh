#!/usr/bin/env bash
# The oldest supported jax (pyproject's lower bound, the lent GPU image's 0.11.2) on kernel-free tests and the
# Mosaic GPU kernels' CUDA lowering, in its own venv: CI's main suite runs the newest jax the upper bound admits,
# this proves the other end.
set -euo pipefail
cd "$(dirname "$0")/.."
python="$(grep '^home' .venv/pyvenv.cfg | cut -d= -f2 | tr -d ' ')/python3"  # the Python bootstrap.sh found
[ -x .venv-jax-min/bin/python ] || "$python" -m venv .venv-jax-min
.venv-jax-min/bin/python -m pip install -q --upgrade pip
.venv-jax-min/bin/python -m pip install -q "jax==0.11.2" "jaxlib==0.11.2" "flax==0.12.10" -e ".[test]"
.venv-jax-min/bin/python -c 'import jax; assert jax.__version__ == "0.11.2", jax.__version__'
JAX_PLATFORMS=cpu .venv-jax-min/bin/python -m pytest -q -p no:cacheprovider tests/test_mtp.py tests/test_vocab_argmax.py
# the Mosaic GPU kernels lowered for CUDA by the GPU image's jax (a transfer 0.12 takes, 0.11.2 refused: 2026-12-03)
JAX_PLATFORMS=cpu .venv-jax-min/bin/python -m pytest -q -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
  tests/test_index_scores_mgpu.py tests/test_fp8_grouped_matmul_mgpu.py \
  tests/test_mgpu_handoff.py tests/test_dense_gemms.py tests/test_topk_mgpu.py -k lower
