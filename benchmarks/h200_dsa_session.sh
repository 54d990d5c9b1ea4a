#!/usr/bin/env bash
# Long-context DSA on one H200 (tokamax wheels in .whl/ as for h200_moe_session.sh):
#   `bash benchmarks/h200_dsa_session.sh parts`  the DSA parts (scores, top-k, sparse attention) per variant
#                                                 + the draft step at 4K / 128K, B = 1, 8   (~5 min)
#   `bash benchmarks/h200_dsa_session.sh full`   the draft step at 4K / 32K / 128K × B = 1 / 8 / 64 (bf16 and
#                                                 fp8 keys), the verification forward at long S, a 32K prefill
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
source "$(dirname "$0")/device_env.sh"
stage="${1:-full}"
if [ "$stage" = parts ]; then
  timeout 300 python3 -m benchmarks.dsa_parts --capacity ${CAPS:-4096 32768 131072} --batch 1 8 64 --tokens 1 4 \
    --iters 10 2>&1 | tee "$OUT/dsa_parts.md"
  [ -n "${PARTS_ONLY:-}" ] || timeout 200 python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 1 8 --capacity 4096 131072 \
    --iters 10 2>&1 | tee "$OUT/mtp_step_dsa.md"
fi
if [ "$stage" = full ]; then
  timeout 300 python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 1 8 64 --capacity 4096 32768 131072 \
    --iters 10 2>&1 | tee "$OUT/mtp_step_dsa.md"
  timeout 200 python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 8 64 --capacity 131072 \
    --index-cache-dtype float8_e4m3fn --iters 10 2>&1 | tee "$OUT/mtp_step_dsa_fp8.md"
fi
