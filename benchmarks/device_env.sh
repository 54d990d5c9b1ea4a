# Sourced by the device session scripts: CUDA JAX, multicast off, carried wheels, $OUT, a machine line in $OUT, run().
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
# GPU test runs take the tests' full form (docs/testing.md): the CI form's bounds are the 2-core CPU's, and the
# session that changes a path runs its full form here. Before 2026-12-06 11:30 they ran the CI form.
export JAX_MTP_FULL_TESTS=1
# NVLink multicast stays off on these machines (it can take shared GPUs down).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
# run SECONDS FILE CMD...: the command's output, without the lines matching the script's $QUIET (an extended regex),
# to the terminal and $OUT/FILE; SECONDS bounds it.
run() {
  local seconds=$1 file=$2; shift 2
  timeout "$seconds" "$@" 2>&1 | grep --line-buffered -v -E "${QUIET:?the session script sets QUIET}" | tee "$OUT/$file"
}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
  python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"; } \
  2>&1 | tee "$OUT/machine.txt"
if [ -d .whl ]; then  # tokamax and its deps, carried (the bf16 path's grouped matmul)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || return 1
fi
