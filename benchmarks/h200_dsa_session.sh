#!/usr/bin/env bash
# Long-context DSA on one H200 (tokamax wheels in .whl/ as for h200_moe_session.sh): the MTP draft
# step at cache 4K / 32K / 128K, with the sparse decode path. `bash benchmarks/h200_dsa_session.sh [quick]`
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
source "$(dirname "$0")/device_env.sh"
if [ "${1:-}" = quick ]; then
  timeout 170 python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 1 8 --capacity 4096 131072 \
    --iters 10 2>&1 | tee "$OUT/mtp_step_dsa.md"
else
  timeout 300 python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 1 8 64 --capacity 4096 32768 131072 \
    --iters 10 2>&1 | tee "$OUT/mtp_step_dsa.md"
  timeout 200 python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 8 64 --capacity 131072 \
    --index-cache-dtype float8_e4m3fn --iters 10 2>&1 | tee "$OUT/mtp_step_dsa_fp8.md"
fi
