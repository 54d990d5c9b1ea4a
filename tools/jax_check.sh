#!/usr/bin/env bash
# One end of pyproject's jax range, in a venv of its own, on kernel-free tests and the Mosaic GPU kernels' CUDA
# lowering (CI's main suite runs the newest jax that pip resolves with every test extra):
#   oldest  jax 0.11.2: pyproject's lower bound, the lent GPU image's
#   newest  the newest jax the bound admits, without the `tpu` extra: a new jax[tpu] pins a libtpu the index may not
#           hold yet, and the main suite then resolves an older jax (0.12.0.1 beside 0.12.1 on 2026-12-06). Where the
#           main suite ran the newest itself, this says so and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
python="$(grep '^home' .venv/pyvenv.cfg | cut -d= -f2 | tr -d ' ')/python3"  # the Python bootstrap.sh found
case "${1:-}" in
  oldest) venv=.venv-jax-min pins=("jax==0.11.2" "jaxlib==0.11.2" "flax==0.12.10") ;;
  newest) venv=.venv-jax-newest pins=("$(grep -o '"jax>=[^"]*"' pyproject.toml | head -1 | tr -d '"')" jaxlib flax) ;;
  *) echo "usage: tools/jax_check.sh oldest|newest" >&2; exit 2 ;;
esac
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q --upgrade "${pins[@]}" -e ".[test]"
version="$("$venv/bin/python" -c 'import jax; print(jax.__version__)')"
if [ "$1" = oldest ] && [ "$version" != 0.11.2 ]; then
  echo "error: $venv holds jax $version, not 0.11.2" >&2; exit 1
fi
if [ "$1" = newest ] && [ "$version" = "$(.venv/bin/python -c 'import jax; print(jax.__version__)')" ]; then
  echo "tools/jax_check.sh newest: jax $version, which the main suite ran"; exit 0
fi
echo "tools/jax_check.sh $1: jax $version"
JAX_PLATFORMS=cpu "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_mtp.py tests/test_vocab_argmax.py
# the Mosaic GPU kernels lowered for CUDA (a transfer 0.12 takes, 0.11.2 refused: 2026-12-03)
JAX_PLATFORMS=cpu "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
  tests/test_index_scores_mgpu.py tests/test_fp8_grouped_matmul_mgpu.py tests/test_grouped_matmul_mgpu.py \
  tests/test_mgpu_handoff.py tests/test_dense_gemms.py tests/test_topk_mgpu.py -k lower
